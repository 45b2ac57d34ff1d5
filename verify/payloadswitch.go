package verify

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
)

// The one-way switch of an inline namespace to committed payloads (SPEC
// §14), as the verifier learns it from the chain: the first policy receipt
// whose member "payloads" is "committed" ends the inline part. Up to it no
// value may be kept beside the chain and nothing may be erased; after it
// the payload fields are checked as a committed namespace's. A policy that
// names another mode is policy_unknown (policy.go); a later one that omits
// the member does not switch back.

// switchesPayloads reports whether a policy receipt's text switches its
// namespace to committed payloads. Read with a parser of its own, apart
// from the gate's: a policy whose other members do not parse still
// switches.
func switchesPayloads(text string) bool {
	var top map[string]json.RawMessage
	if json.Unmarshal([]byte(text), &top) != nil {
		return false
	}
	raw, ok := top["payloads"]
	return ok && bytes.Equal(bytes.TrimSpace(raw), []byte(`"committed"`))
}

// checkInline checks a receipt of the inline part: no value kept for it
// (payload_unexpected), no erase (erase_invalid). A policy receipt that
// switches the namespace ends the part.
func (p *payloadChecker) checkInline(r *chain.Receipt) {
	p.last = r.Seq
	o := r.Open
	if p.next != nil {
		o = p.opening(r.Seq)
	}
	for _, f := range chain.PayloadFields {
		if o.Get(f) != nil {
			p.col.addf(r.Seq, RulePayloadUnexpected, "a value is kept for %s of a receipt the namespace keeps inline", f.Name())
		}
	}
	switch r.Kind {
	case chain.KindErase:
		p.col.addf(r.Seq, RuleEraseInvalid, "an erase receipt where the namespace keeps its payloads inline (before any switch to committed)")
	case chain.KindPolicy:
		p.learn(r)
	}
}

// learn ends the inline part at r when it is a policy receipt that
// switches the namespace (r from the chain pass, or from the trusted
// prefix of an incremental run).
func (p *payloadChecker) learn(r *chain.Receipt) {
	if !p.inline || r.Kind != chain.KindPolicy || !switchesPayloads(r.Result) {
		return
	}
	p.inline, p.switchAt = false, r.Seq
	if p.absent && !p.receiptsOnly {
		p.col.addf(r.Seq, RulePayloadsAbsent, "the namespace switched to committed payloads here, and the database has no payload table: its values cannot be checked (--receipts-only checks the chain alone)")
	}
}

// unchecked reports whether a committed part's values went unchecked (no
// payload table, --receipts-only).
func (p *payloadChecker) unchecked() bool {
	return p != nil && p.absent && !p.inline
}

// mayHoldValues reports whether r has a payload field holding a
// commitment, whose value the state checks may read.
func mayHoldValues(r *chain.Receipt) bool {
	for _, f := range chain.PayloadFields {
		if !chain.Exempt(r.Kind, f) && chain.IsCommitment(r.Field(f)) {
			return true
		}
	}
	return false
}

// checkSwitch compares the switch to committed payloads that a server
// lists (committed_after) with the one its chain shows. It reads the list
// after the chain pass, so a switch the pass read must be listed; one
// listed beyond the pass's last receipt was appended since. A difference
// is derived_state: what the server derives from its chain is wrong.
func (v *Verifier) checkSwitch(ctx context.Context, r *run) error {
	p := r.cc.payloads
	if p == nil {
		return nil
	}
	listed, err := v.remote.SwitchedAt(ctx)
	if err != nil {
		return fmt.Errorf("payload switch: %w", err)
	}
	if listed > r.through {
		listed = 0
	}
	if listed != p.switchAt {
		r.stateCol.addf(max(listed, p.switchAt), RuleDerivedState,
			"the server lists the switch to committed payloads at receipt %d (committed_after, 0: none); the chain switches at %d", listed, p.switchAt)
	}
	return nil
}
