package ledger

import (
	"context"
	"errors"

	"github.com/effect-ledger/effect-ledger/chain"
)

// ReadKey returns a key's view as the API and `ledgerctl show` serve it,
// read from c: its state (the gate's included, SPEC §13), its expiry under
// ttl (SPEC §12) and the current generation's receipts, or every receipt
// of the key with history; now is the clock (unix ms). Each receipt served
// is checked against the chain first (CheckReceipts). Errors: *Error with
// ECodeUnknownKey or ECodeInvalidKey; *IntegrityError.
func ReadKey(ctx context.Context, c KeyReader, key string, ttl, now uint64, history bool) (*KeyView, error) {
	v, err := c.GetKey(ctx, key)
	var e *Error
	if errors.As(err, &e) && e.Code == ECodeUnknownKey {
		// A key with only the gate's receipts (SPEC §13) has no record.
		v, err = askedKey(ctx, c, key, err)
	}
	if err != nil {
		return nil, err
	}
	gateState(v, now)
	v.WithLifetime(ttl, history)
	if err := CheckReceipts(ctx, c, v.Receipts); err != nil {
		return nil, err
	}
	return v, nil
}

// askedKey is the view of a key that only asks (and their answers and
// denies) name, or notFound when it has none.
func askedKey(ctx context.Context, c KeyReader, key string, notFound error) (*KeyView, error) {
	rs, _, err := c.ListReceipts(ctx, ReceiptFilter{Key: key, Limit: MaxPageLimit})
	if err != nil {
		return nil, err
	}
	for _, r := range rs {
		if r.Kind == chain.KindAsk {
			return &KeyView{IdempotencyKey: key, State: StateAwaitingApproval, Tool: r.Tool, Effect: r.Effect,
				Idempotent: r.Idempotent, InputHash: r.InputHash, Receipts: rs}, nil
		}
	}
	return nil, notFound
}

// gateState sets the state of a key whose latest ask (after its latest
// reserve or outcome) is pending (awaiting_approval), was rejected, or was
// approved and not consumed yet (approved); a key that never ran and whose
// only ask ended unused is approval_expired.
func gateState(v *KeyView, now uint64) {
	kg := readKeyGate(v.Receipts, gateBound(v.Receipts), 0)
	switch {
	case kg.ask == nil:
		if v.State == StateAwaitingApproval {
			v.State = StateInterrupted // cannot happen: askedKey found an ask
		}
	case kg.rejected():
		v.State = StateRejected
	case kg.pending(now):
		v.State = StateAwaitingApproval
	case kg.approvedFor(now):
		v.State = StateApproved
	case v.State == StateAwaitingApproval:
		v.State = StateApprovalExpired // the only ask of a key that never ran ended unused
	}
}
