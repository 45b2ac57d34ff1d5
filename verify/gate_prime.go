package verify

import (
	"context"
	"errors"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// primeGate gives the gate checker of an incremental run the receipts up
// to the pinned head, which it trusts: the policy in force, the asks and
// answers, the consumed approvals and the recent failures come from
// there, and the ranges pruned (SPEC §16). On a pruned ledger the scan
// starts after the pruned prefix P: the policy in force at P+1 is the
// latest prune receipt's (beginPruned). An approval is read with its
// values (SPEC §14): the audit shows its note when its ask is consumed
// after the pin. A ledger that can tell it has no policy and no prune
// receipt (or does not know the kinds: it predates them) has nothing
// there to prime.
func (v *Verifier) primeGate(ctx context.Context, r *run) error {
	after := r.cc.prunedThrough
	if !r.trusted || after >= r.from || !v.mayHold(ctx, chain.KindPolicy) && !v.mayHold(ctx, chain.KindPrune) {
		return nil
	}
	err := v.src.Receipts(ctx, after, func(rc *chain.Receipt) error {
		if rc.Seq > r.from {
			return errStop
		}
		if rc.Kind == chain.KindApproval && r.state.open != nil {
			var err error
			if rc, err = r.state.open(rc); err != nil { // its note, for the audit's approvals
				return err
			}
		}
		r.gate.add(rc)
		if r.cc.payloads != nil {
			r.cc.payloads.learn(rc) // a switch in the trusted prefix
		}
		if rc.Kind == chain.KindPrune {
			r.cc.pruned.learn(rc)
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return err
	}
	return nil
}

// mayHold reports whether the ledger may hold a receipt of kind.
func (v *Verifier) mayHold(ctx context.Context, kind string) bool {
	page, _, err := v.list(ctx, ledger.ReceiptFilter{Kind: kind, Limit: 1})
	var e *ledger.Error
	switch {
	case err == nil:
		return len(page) > 0
	case errors.As(err, &e) && e.Code == ledger.ECodeInvalidRequest && e.Details["field"] == "kind":
		return false // the ledger does not know the kind, so it holds none
	}
	return true
}
