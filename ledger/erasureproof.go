package ledger

import (
	"context"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// AddErasedBy adds to the portable receipt p, whose "erased" names erase
// receipts, the proof of one erasure (SPEC §14, "erased_by"): the erase
// receipt in its chain form, its inclusion proof under p's checkpoint (the
// latest that covers the receipt, so it covers the erase once one has been
// signed since), and the opening of its set, the ranges and salt. When two
// erase receipts erased fields of p's receipt, the one that erased the
// most of them is proven (the earlier of a tie); the other fields keep the
// issuer's word. The ranges name every receipt erased with p's, which the
// chain keeps secret, so the API gives this to admins alone, on request.
// Errors: *Error with ECodeNotCheckpointed while p's checkpoint does not
// cover the erase receipt.
func (ns Log) AddErasedBy(ctx context.Context, p *tlog.PortableReceipt) error {
	seq := provenErase(p.Erased)
	if seq == 0 || ns.Payloads == nil {
		return nil
	}
	c, err := tlog.ParseCheckpoint(tlog.NoteText([]byte(p.Checkpoint)))
	if err != nil {
		return fmt.Errorf("erased_by: %w", err)
	}
	if int64(seq) > c.Size {
		return &Error{Code: ECodeNotCheckpointed,
			Message: fmt.Sprintf("erase receipt %d is not covered by a signed checkpoint yet (receipt %d is proven against size %d); retry after the next one",
				seq, p.Receipt.Seq, c.Size),
			Details: map[string]any{"seq": seq}}
	}
	r, err := ns.ChainReader.GetReceipt(ctx, seq)
	if err != nil {
		return fmt.Errorf("erased_by: %w", err)
	}
	if r.Kind != chain.KindErase {
		return fmt.Errorf("erased_by: receipt %d, named as erasing fields of receipt %d, is a %s receipt", seq, p.Receipt.Seq, r.Kind)
	}
	e, err := ns.Payloads.Erasure(ctx, seq)
	if err != nil {
		return fmt.Errorf("erased_by: %w", err)
	}
	if e == nil {
		return fmt.Errorf("erased_by: erase receipt %d: its erasure row is missing", seq)
	}
	if res, _, err := chain.ParseEraseResult(r.Result); err != nil || chain.SetDigest(e.Salt, e.Ranges) != res.Set ||
		!chain.RangesHold(e.Ranges, p.Receipt.Seq) {
		// As a value that does not open its commitment: never served.
		return &Error{Code: ECodeIntegrityError,
			Message: fmt.Sprintf("the stored ranges of erase receipt %d do not open its set or do not hold receipt %d; `ledgerctl verify` shows what changed", seq, p.Receipt.Seq),
			Details: map[string]any{"seq": seq}}
	}
	proof, err := tlog.ProveInclusion(c.Size, tlog.LeafIndex(seq), ns.ChainReader.HashReader(ctx))
	if err != nil {
		return err
	}
	er := *r
	er.Open = nil // the chain's text: the reason stays committed
	p.ErasedBy = &tlog.ErasureProof{Receipt: er, Inclusion: tlog.HexHashes(proof), Ranges: e.Ranges, Salt: e.Salt.String()}
	return nil
}

// provenErase is the erase receipt that erased the most of the fields
// (the earlier of a tie), 0 if none.
func provenErase(erased map[string]uint64) uint64 {
	count := map[uint64]int{}
	var best uint64
	for _, seq := range erased {
		count[seq]++
	}
	for seq, n := range count {
		if best == 0 || n > count[best] || (n == count[best] && seq < best) {
			best = seq
		}
	}
	return best
}
