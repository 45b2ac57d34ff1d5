package ledger

import (
	"context"
	"fmt"
	"slices"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Reserve reserves an idempotency key before an effect runs (SPEC §4
// reserve table). It returns a *ReserveResult for 200/201 outcomes, or an
// error: *Error with ECodeInvalidKey, ECodeInvalidRequest,
// ECodeFingerprintMismatch, ECodeInProgress, ECodeUnsafeResume,
// ECodeRetryNotAllowed or ECodeAttemptConflict; ErrUnavailable when the
// database cannot be written; ctx's error when ctx ends first. A result
// reporting a receipt is durable.
//
// With req.WaitMS, a key reserved by another reservation is waited on
// (SPEC §8) without holding any lock or writer slot: the decision is made
// again when that reservation is committed or resolved, when its lease
// ends, or when the wait runs out (then in_progress as without a wait).
// A ctx that ends during the wait ends it, and nothing is appended.
func (n *Namespace) Reserve(ctx context.Context, req ReserveRequest) (*ReserveResult, error) {
	a, err := req.validate()
	if err == nil {
		err = CheckSubjects(req.Subjects)
	}
	if err == nil {
		// The form recorded is decided under the head lock
		// (settleInputHash); the keyed one is made here when it will
		// likely serve.
		a.fp = a.inputHash
		if a.fp != "" && n.Payloads() == PayloadsCommitted {
			a.keyed, err = n.keyedHash(ctx, a.fp)
			a.inputHash = a.keyed
		}
	}
	if err == nil {
		a.subjects, err = n.subjectMACs(ctx, req.Subjects)
	}
	if err != nil {
		return nil, err
	}
	var res *ReserveResult
	switch {
	case a.effect == chain.EffectNone || a.effect == chain.EffectRead:
		res, err = n.reserveNoEffect(ctx, &a) // no lookup, no receipt
	case a.waitMS > 0 && !a.generated:
		res, err = n.reserveWaiting(ctx, &a)
	default:
		res, _, err = n.reserveOnce(ctx, &a)
	}
	if err != nil {
		reserveOutcomes.WithLabelValues(ErrorCode(err), n.name).Inc()
		return nil, err
	}
	reserveOutcomes.WithLabelValues(reserveLabel(res), n.name).Inc()
	return res, nil
}

// reserveNoEffect answers not_recorded for a none or read call, unless
// the policy gates its tool: then the call claims a class its tool does
// not have (SPEC §13, 422 effect_class_mismatch).
func (n *Namespace) reserveNoEffect(ctx context.Context, a *reserveArgs) (*ReserveResult, error) {
	gated, err := n.gatesNoEffect(ctx, a.tool)
	if err != nil {
		return nil, err
	}
	if gated {
		return nil, &Error{Code: ECodeEffectClassMismatch,
			Message: fmt.Sprintf("the policy gates tool %q, so a call of it cannot declare effect %s", a.tool, a.effect),
			Details: map[string]any{"tool": a.tool, "effect": a.effect}}
	}
	return decideReserve(ctx, nil, 0, 0, a)
}

func reserveLabel(r *ReserveResult) string {
	switch {
	case r.Takeover:
		return "takeover"
	case r.Retry:
		return "retry"
	case r.Renewed != nil:
		return "renewed"
	case r.AfterNotApplied != nil:
		return "after_not_applied"
	}
	return r.Status
}

// Commit records the outcome of the reservation named by req.Reservation
// (SPEC §4 commit table). Errors: *Error with ECodeInvalidRequest,
// ECodeUnknownKey, ECodeStaleReservation or ECodeAlreadyFinalized;
// ErrUnavailable. A repeat of an identical commit returns the original
// result with Replayed set and appends nothing.
func (n *Namespace) Commit(ctx context.Context, req CommitRequest) (*CommitResult, error) {
	res, err := n.commit(ctx, req)
	label := ErrorCode(err)
	switch {
	case err != nil:
	case res.Replayed:
		label = "repeat"
	case res.Late:
		label = "late"
	default:
		label = StatusCommitted
	}
	commitOutcomes.WithLabelValues(label, n.name).Inc()
	return res, err
}

func (n *Namespace) commit(ctx context.Context, req CommitRequest) (*CommitResult, error) {
	if err := checkKeyPath(req.IdempotencyKey); err != nil {
		return nil, err
	}
	if req.Reservation == "" {
		return nil, Invalid("reservation", "reservation is required")
	}
	o, err := validateOutcome(req.Outcome, req.ExternalRef, req.Result, req.Error)
	if err != nil {
		return nil, err
	}
	// res is read only after a successful submit: when ctx ends first,
	// the writer may still run fn and write it.
	var res *CommitResult
	err = n.submit(ctx, req.IdempotencyKey, func(ctx context.Context, t *batchTx) error {
		var err error
		res, err = decideCommit(ctx, t, t.Now(), req.IdempotencyKey, req.Reservation, req.Actor, &o)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// Resolve records an operator's decision about an interrupted key, or
// corrects a failed key to not_applied (SPEC §4.1, req.MayCorrect).
// Errors: *Error with ECodeInvalidRequest, ECodeUnknownKey,
// ECodeNotInterrupted or ECodeForbidden; ErrUnavailable.
func (n *Namespace) Resolve(ctx context.Context, req ResolveRequest) (*ResolveResult, error) {
	res, err := n.resolve(ctx, req)
	label := ErrorCode(err)
	if err == nil {
		label = StatusResolved
	}
	resolveOutcomes.WithLabelValues(label, n.name).Inc()
	return res, err
}

func (n *Namespace) resolve(ctx context.Context, req ResolveRequest) (*ResolveResult, error) {
	if err := checkKeyPath(req.IdempotencyKey); err != nil {
		return nil, err
	}
	if n := len([]rune(req.Note)); n < 1 || n > MaxNoteLen {
		return nil, Invalid("note", "note is required: 1–%d characters", MaxNoteLen)
	}
	o, err := validateOutcome(req.Outcome, req.ExternalRef, req.Result, req.Error)
	if err != nil {
		return nil, err
	}
	// res is read only after a successful submit: when ctx ends first,
	// the writer may still run fn and write it.
	var res *ResolveResult
	err = n.submit(ctx, req.IdempotencyKey, func(ctx context.Context, t *batchTx) error {
		var err error
		res, err = decideResolve(ctx, t, t.Now(), req.IdempotencyKey, req.Actor, req.Note, req.MayCorrect, &o)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// KeyTTL is the namespace's key_ttl_ms (SPEC §12); 0: keys never expire.
func (n *Namespace) KeyTTL() uint64 { return n.keyTTL }

// Key returns a key's state with its expiry (SPEC §12) and the current
// generation's receipts, or every receipt of the key with history, each
// checked against the chain before it is served (ReadKey). Errors: *Error
// with ECodeUnknownKey, ECodeInvalidKey or ECodeIntegrityError.
func (n *Namespace) Key(ctx context.Context, key string, history bool) (*KeyView, error) {
	v, err := ReadKey(ctx, n.chain, key, n.keyTTL, n.now(), history)
	if err != nil {
		n.l.Fault(err)
		return nil, n.refuseTampered(ctx, err)
	}
	v.Receipts = slices.Clone(v.Receipts) // with their values: never a cache's
	if err := n.shown(ctx, v.Receipts, n.chain.Openings); err != nil {
		return nil, err
	}
	return v, nil
}
