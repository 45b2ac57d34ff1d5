package verify

import (
	"context"
	"errors"
	"iter"

	"github.com/effect-ledger/effect-ledger/chain"
)

// checkTrustedRows is what an incremental run of a database checks of
// the payload rows of the receipts it trusts (SPEC §14: --incremental
// still scans every payload row): each row up to from, read beside the
// receipts in seq order without rehashing them, must belong to a receipt
// of the chain and open the commitment in each field it keeps a value
// for. A value changed, or put back for a field the chain holds inline or
// empty, in the trusted part is found as a full run would find it.
func (p *payloadChecker) checkTrustedRows(ctx context.Context, rows func(context.Context, uint64, func(uint64, *chain.Opening) error) error, from uint64) error {
	next, stop := iter.Pull(func(yield func(chain.Receipt) bool) {
		err := p.db.Receipts(ctx, 0, func(r *chain.Receipt) error {
			if r.Seq > from || !yield(*r) {
				return errStop
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStop) {
			p.err = errors.Join(p.err, err)
		}
	})
	defer stop()
	var cur chain.Receipt
	have, done := false, false
	err := rows(ctx, 0, func(seq uint64, o *chain.Opening) error {
		if seq > from {
			return errStop
		}
		for !done && (!have || cur.Seq < seq) {
			r, ok := next()
			if !ok {
				done = true
				break
			}
			cur, have = r, true
		}
		if !have || cur.Seq != seq {
			p.col.addf(seq, RulePayloadUnexpected, "values are kept for receipt %d, which the chain does not hold", seq)
			return nil
		}
		for _, f := range chain.PayloadFields {
			val := o.Get(f)
			if val == nil || val.ErasedBy > 0 {
				continue
			}
			text := cur.Field(f)
			switch {
			case chain.Exempt(cur.Kind, f) || !chain.IsCommitment(text):
				p.col.addf(seq, RulePayloadUnexpected, "a value is kept for %s, whose chain text is not a commitment", f.Name())
			case chain.Commit(f, val.Salt, val.Value) != text:
				p.col.addf(seq, RulePayloadMismatch, "the value kept for %s does not open its commitment", f.Name())
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return err
	}
	return nil
}
