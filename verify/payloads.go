package verify

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// payloadChecker checks a committed namespace's payloads (SPEC §14) on the
// chain pass, in seq order: the form of each payload field on the chain,
// and each kept value against its commitment. A database's values come
// from its payload table, read beside the chain in seq order; a server's
// come with its receipts (chain.Receipt.Open). Details name the seq and
// the field, never a value.
type payloadChecker struct {
	col  *collector
	next func() (uint64, *chain.Opening, bool) // the database's rows; nil for a server
	stop func()
	err  error // the database's rows could not be read
	// the next row not yet matched with a receipt
	rowSeq uint64
	row    *chain.Opening
	more   bool
}

// payloadChecker returns the checker of the ledger's payloads, or nil for
// an inline namespace. A payload mode the verifier does not know is an
// error wrapping ledger.ErrUnsupported.
func (v *Verifier) payloadChecker(ctx context.Context, col *collector, from uint64) (*payloadChecker, error) {
	mode, err := v.mode(ctx)
	if err != nil {
		return nil, err
	}
	switch mode {
	case ledger.PayloadsInline:
		return nil, nil
	case ledger.PayloadsCommitted:
	default:
		return nil, fmt.Errorf("payload mode %q: %w", mode, ledger.ErrUnsupported)
	}
	p := &payloadChecker{col: col}
	if v.rows != nil {
		p.next, p.stop = iter.Pull2(func(yield func(uint64, *chain.Opening) bool) {
			err := v.rows(ctx, from, func(seq uint64, o *chain.Opening) error {
				if !yield(seq, o) {
					return errStop
				}
				return nil
			})
			if err != nil && !errors.Is(err, errStop) {
				p.err = err
			}
		})
		p.advance()
	}
	return p, nil
}

func (p *payloadChecker) advance() {
	p.rowSeq, p.row, p.more = p.next()
}

// opening returns the database's row of the receipt at seq, or nil.
func (p *payloadChecker) opening(seq uint64) *chain.Opening {
	for p.more && p.rowSeq < seq {
		p.advance() // a row of no receipt of the pass (the chain pass reports gaps)
	}
	if p.more && p.rowSeq == seq {
		o := p.row
		p.advance()
		return o
	}
	return nil
}

// close ends the database's rows and returns the error that stopped them.
func (p *payloadChecker) close() error {
	if p == nil || p.stop == nil {
		return nil
	}
	p.stop()
	return p.err
}

// check checks r's payload fields and returns r as the field checks see
// it: each committed field holding its value, or, where the value is not
// there to check, a stand-in of the same emptiness (the commitment text; a
// result "{}"). An inline namespace's receipt is returned as it is.
func (p *payloadChecker) check(r *chain.Receipt) *chain.Receipt {
	if p == nil {
		return r
	}
	o := r.Open
	if p.next != nil {
		o = p.opening(r.Seq)
	}
	bad := func(rule, format string, args ...any) { p.col.addf(r.Seq, rule, format, args...) }
	var view *chain.Receipt
	for _, f := range chain.PayloadFields {
		text, exempt := r.Field(f), chain.Exempt(r.Kind, f)
		committed := !exempt && chain.IsCommitment(text)
		switch {
		case exempt && chain.IsCommitment(text):
			bad(RulePayloadUncommitted, "%s of a %s receipt is kept inline, yet holds a commitment", f.Name(), r.Kind)
		case !exempt && text != "" && !committed:
			bad(RulePayloadUncommitted, "%s is not a commitment (pc1: and 64 hex digits) in a committed namespace", f.Name())
		}
		val := o.Get(f)
		present := val != nil && val.ErasedBy == 0
		switch {
		case present && !committed:
			bad(RulePayloadUnexpected, "a value is kept for %s, whose chain text is not a commitment", f.Name())
			continue
		case present && chain.Commit(f, val.Salt, val.Value) != text:
			bad(RulePayloadMismatch, "the value kept for %s does not open its commitment", f.Name())
			present = false
		case committed && !present:
			bad(RulePayloadMissing, "%s is committed, and its value is not kept", f.Name())
		}
		if !committed {
			continue
		}
		if view == nil {
			c := *r
			c.Open = nil
			view = &c
		}
		switch {
		case present:
			view.SetField(f, val.Value)
		case f == chain.FieldResult:
			view.SetField(f, "{}")
		}
	}
	if view == nil {
		return r
	}
	return view
}
