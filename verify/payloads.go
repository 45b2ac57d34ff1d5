package verify

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"

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
	ctx context.Context
	col *collector
	db  DB // nil for a server
	// expect holds the erased fields seen, by the erase receipt they name:
	// that receipt must list them.
	expect map[uint64][]erasedField
	// erasures are the erase receipts seen, for the audit.
	erasures []ErasureEntry
	next     func() (uint64, *chain.Opening, bool) // the database's rows; nil for a server
	stop     func()
	err      error // the database's rows could not be read
	// the next row not yet matched with a receipt
	rowSeq  uint64
	row     *chain.Opening
	more    bool
	started bool   // the rows are read from the first receipt on
	last    uint64 // the seq of the last receipt checked
	// absent: the database has no payload table; only the chain's forms
	// are checked.
	absent bool
	// gate knows the policy in force, whose retention a sweep's erase
	// must keep to.
	gate *gateChecker
	// inline: the receipts checked are the inline part of a namespace
	// created inline, which a policy may switch (payloadswitch.go) at
	// switchAt.
	inline       bool
	switchAt     uint64
	receiptsOnly bool
	ttl          uint64 // the namespace's key_ttl_ms, for the generations of retention erases
	// claims are the receipts retention erases list, checked against
	// their keys in one read (retention.go).
	claims retentionClaims
}

// payloadChecker returns the checker of the ledger's payloads: of a
// committed namespace, or of an inline one, whose part after a switch is
// committed. A payload mode the verifier does not know is an error
// wrapping ledger.ErrUnsupported.
func (v *Verifier) payloadChecker(ctx context.Context, col *collector, from uint64) (*payloadChecker, error) {
	mode, err := v.mode(ctx)
	if err != nil {
		return nil, err
	}
	switch mode {
	case ledger.PayloadsInline, ledger.PayloadsCommitted:
	default:
		return nil, fmt.Errorf("payload mode %q: %w", mode, ledger.ErrUnsupported)
	}
	p := &payloadChecker{ctx: ctx, col: col, db: v.db, expect: map[uint64][]erasedField{},
		inline: mode == ledger.PayloadsInline, receiptsOnly: v.opts.ReceiptsOnly}
	if p.ttl, err = v.keyTTL(ctx); err != nil {
		return nil, err
	}
	if v.rows != nil {
		// A database without its payload table (a copy of the receipts
		// alone): payloads_absent where a committed part starts, unless
		// the chain alone is asked for.
		err := v.rows(ctx, math.MaxInt64, func(uint64, *chain.Opening) error { return nil })
		switch {
		case errors.Is(err, ledger.ErrNoPayloadTable):
			p.absent, p.db = true, nil
			if !v.opts.ReceiptsOnly && !p.inline {
				col.addf(from, RulePayloadsAbsent, "the namespace is committed, and the database has no payload table: its values cannot be checked (--receipts-only checks the chain alone)")
			}
			return p, nil
		case err != nil:
			return nil, err
		}
		if from > 0 { // an incremental run: the trusted part's rows too
			if err := p.checkTrustedRows(ctx, v.rows, from); err != nil {
				return nil, err
			}
		}
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
	}
	return p, nil
}

func (p *payloadChecker) advance() {
	p.rowSeq, p.row, p.more = p.next()
}

// opening returns the database's row of the receipt at seq, or nil.
//
// The rows are read from the first receipt checked on, never before: the
// receipts' read began first, so every receipt it returns has its row in
// the later read (a receipt and its values are written in one
// transaction).
func (p *payloadChecker) opening(seq uint64) *chain.Opening {
	if !p.started {
		p.started = true
		p.advance()
	}
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

// close ends the database's rows and returns the error that stopped them;
// an erased field whose erase receipt never came is payload_missing.
func (p *payloadChecker) close() error {
	if p == nil {
		return nil
	}
	if p.db != nil {
		p.checkClaims()
	}
	for by, fs := range p.expect {
		if p.absent {
			break
		}
		if by > p.last && p.db != nil {
			// Erased after the pass's read of the chain: the erasure's
			// stored ranges (written with its receipt, never erased)
			// must hold each seq; the next pass checks the receipt.
			e, err := p.db.Erasure(p.ctx, by)
			if err != nil && !errors.Is(err, ledger.ErrBadErasure) {
				p.err = errors.Join(p.err, err)
				continue
			}
			var kept []erasedField
			for _, f := range fs {
				if e == nil || !chain.RangesHold(e.Ranges, f.seq) {
					kept = append(kept, f)
				}
			}
			fs = kept
		}
		for _, e := range fs {
			p.col.addf(e.seq, RulePayloadMissing, "%s is marked erased by receipt %d, which is not an erase receipt of the chain",
				e.field.Name(), by)
		}
	}
	if p.stop == nil {
		return nil
	}
	p.stop()
	return p.err
}

// erasedField is a field of the receipt at seq marked erased.
type erasedField struct {
	seq   uint64
	field chain.PayloadField
}

// check checks r's payload fields and returns r as the field checks see
// it: each committed field holding its value, or, where the value is not
// there to check, a stand-in of the same emptiness (the commitment text; a
// result "{}"), with an Open holding each value shown and each erasure,
// for the audit. An inline namespace's receipt is returned as it is.
func (p *payloadChecker) check(r *chain.Receipt) *chain.Receipt {
	if p == nil {
		return r
	}
	if p.inline {
		p.checkInline(r)
		return r
	}
	p.last = r.Seq
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
		case committed && val != nil && val.ErasedBy > r.Seq:
			p.expect[val.ErasedBy] = append(p.expect[val.ErasedBy], erasedField{r.Seq, f}) // checked at that receipt
		case committed && !present && !p.absent:
			bad(RulePayloadMissing, "%s is committed, and its value is not kept", f.Name())
		}
		if !committed {
			continue
		}
		if view == nil {
			c := *r
			c.Open = new(chain.Opening)
			view = &c
		}
		switch {
		case present:
			view.SetField(f, val.Value)
		case f == chain.FieldResult:
			view.SetField(f, "{}")
		}
		if present || val != nil && val.ErasedBy > 0 {
			view.Open.Set(f, val) // what the audit shows: the value, or its erasure
		}
	}
	if r.Kind == chain.KindErase {
		p.checkErase(r)
		if res, _, err := chain.ParseEraseResult(r.Result); err == nil {
			e := ErasureEntry{Seq: r.Seq, Actor: r.Actor, RecordedAt: r.RecordedAt, Count: res.Count, Fields: res.Fields,
				Retention: res.Retention}
			shown := r
			if view != nil {
				shown = view
			}
			e.Reason, _, _ = payloadValue(shown, chain.FieldNote) // "" once erased

			p.erasures = append(p.erasures, e)
		}
	}
	if view == nil {
		return r
	}
	return view
}

// checkErase checks an erase receipt: its result, its stored ranges
// against its set (a database), the fields marked erased by it, and (a
// database) that no listed value is still kept.
func (p *payloadChecker) checkErase(r *chain.Receipt) {
	bad := func(format string, args ...any) { p.col.addf(r.Seq, RuleEraseInvalid, format, args...) }
	expected := p.expect[r.Seq]
	delete(p.expect, r.Seq)
	res, fields, err := chain.ParseEraseResult(r.Result)
	if err != nil {
		bad("%v", err)
		return
	}
	var ranges []chain.Range
	if p.db != nil {
		e, err := p.db.Erasure(p.ctx, r.Seq)
		switch {
		case errors.Is(err, ledger.ErrBadErasure):
			bad("its stored ranges or salt do not parse")
			return
		case err != nil:
			p.err = errors.Join(p.err, err)
			return
		case e == nil:
			bad("its ranges are not stored")
			return
		}
		ranges = e.Ranges
		switch {
		case chain.SetDigest(e.Salt, ranges) != res.Set:
			bad("its set does not match its stored ranges")
		case len(ranges) > 0 && ranges[len(ranges)-1][1] >= r.Seq:
			bad("a range reaches its own seq")
		case len(ranges) > 0 && ranges[0][0] <= p.switchAt:
			bad("it lists receipt %d, of the inline part (up to the switch at %d)", ranges[0][0], p.switchAt)
		case chain.RangesCount(ranges) != res.Count:
			bad("count %d, but its ranges hold %d receipts", res.Count, chain.RangesCount(ranges))
		}
	}
	for _, e := range expected {
		if !fields.Has(e.field) || (p.db != nil && !chain.RangesHold(ranges, e.seq)) {
			p.col.addf(e.seq, RulePayloadMissing, "%s is marked erased by receipt %d, which does not list it", e.field.Name(), r.Seq)
		}
	}
	if p.db == nil || len(ranges) == 0 {
		return
	}
	if res.Retention {
		p.checkRetention(r, ranges)
	}
	var seqs []uint64
	for _, rg := range ranges {
		for s := rg[0]; s <= rg[1]; s++ {
			seqs = append(seqs, s)
		}
	}
	open, err := p.db.Openings(p.ctx, seqs)
	if err != nil {
		p.err = errors.Join(p.err, err)
		return
	}
	for _, seq := range seqs {
		for _, f := range chain.PayloadFields {
			if v := open[seq].Get(f); fields.Has(f) && v != nil && v.ErasedBy == 0 {
				p.col.addf(seq, RuleEraseIncomplete, "%s is still kept, though erase receipt %d lists it", f.Name(), r.Seq)
			}
		}
	}
}

// opener returns how the state checks read a receipt's values (SPEC §14):
// from the database's payload table in a committed namespace, nil where
// receipts carry them or the namespace is inline.
func (v *Verifier) opener(ctx context.Context, r *run) func(*chain.Receipt) (*chain.Receipt, error) {
	if r.cc.payloads == nil || r.cc.payloads.absent || v.db == nil {
		return nil
	}
	return func(rc *chain.Receipt) (*chain.Receipt, error) {
		if !mayHoldValues(rc) {
			return rc, nil // inline, or nothing committed
		}
		open, err := v.db.Openings(ctx, []uint64{rc.Seq})
		if err != nil {
			return nil, fmt.Errorf("read the values of receipt %d: %w", rc.Seq, err)
		}
		c := *rc
		c.Open = open[rc.Seq]
		return &c, nil
	}
}

// checkRetention checks a retention sweep's erase against the policy in
// force at its seq (SPEC §14): there must be a retention, and no receipt
// it lists may be younger than its payloads_ms. recorded_at never
// decreases within a chain, so the last receipt listed is the youngest.
func (p *payloadChecker) checkRetention(r *chain.Receipt, ranges []chain.Range) {
	if p.gate == nil || p.gate.unknown {
		return // the policy in force did not parse: nothing is checked against it
	}
	var ms uint64
	if p.gate.policy != nil {
		ms = p.gate.policy.retentionMS
	}
	if ms == 0 {
		p.col.addf(r.Seq, RuleEraseInvalid, "a retention erase, but no retention is in force")
		return
	}
	last := ranges[len(ranges)-1][1]
	young, err := p.db.GetReceipt(p.ctx, last)
	if err != nil {
		p.err = errors.Join(p.err, err)
		return
	}
	if young != nil && young.RecordedAt+ms > r.RecordedAt {
		p.col.addf(r.Seq, RuleEraseInvalid, "a retention erase lists receipt %d, recorded less than the %d ms the retention in force keeps payloads",
			last, ms)
	}
	p.claimRetention(r, ranges)
}
