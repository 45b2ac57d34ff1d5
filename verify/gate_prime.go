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
// there. A ledger that can tell it has no policy receipt (or does not
// know the kind: it predates contract v1.3) has nothing there to prime.
func (v *Verifier) primeGate(ctx context.Context, r *run) error {
	if r.from == 0 || !v.mayHavePolicy(ctx) {
		return nil
	}
	err := v.src.Receipts(ctx, 0, func(rc *chain.Receipt) error {
		if rc.Seq > r.from {
			return errStop
		}
		r.gate.add(rc)
		if r.cc.payloads != nil {
			r.cc.payloads.learn(rc) // a switch in the trusted prefix
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return err
	}
	return nil
}

// mayHavePolicy reports whether the ledger may hold a policy receipt.
func (v *Verifier) mayHavePolicy(ctx context.Context) bool {
	page, _, err := v.list(ctx, ledger.ReceiptFilter{Kind: chain.KindPolicy, Limit: 1})
	var e *ledger.Error
	switch {
	case err == nil:
		return len(page) > 0
	case errors.As(err, &e) && e.Code == ledger.ECodeInvalidRequest && e.Details["field"] == "kind":
		return false // the ledger does not know the kind, so it holds none
	}
	return true
}
