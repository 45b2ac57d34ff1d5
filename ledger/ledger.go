package ledger

import (
	"context"
	"fmt"

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
func (db *DB) Reserve(ctx context.Context, req ReserveRequest) (*ReserveResult, error) {
	a, err := req.validate()
	if err != nil {
		return nil, err
	}
	var res *ReserveResult
	switch {
	case a.effect == chain.EffectNone || a.effect == chain.EffectRead:
		res, err = decideReserve(ctx, nil, 0, &a) // no lookup, no receipt
	case a.waitMS > 0 && !a.generated:
		res, err = db.reserveWaiting(ctx, &a)
	default:
		res, _, err = db.reserveOnce(ctx, &a)
	}
	if err != nil {
		reserveOutcomes.WithLabelValues(ErrorCode(err)).Inc()
		return nil, err
	}
	reserveOutcomes.WithLabelValues(reserveLabel(res)).Inc()
	return res, nil
}

func reserveLabel(r *ReserveResult) string {
	switch {
	case r.Takeover:
		return "takeover"
	case r.Retry:
		return "retry"
	}
	return r.Status
}

// Commit records the outcome of the reservation named by req.Reservation
// (SPEC §4 commit table). Errors: *Error with ECodeInvalidRequest,
// ECodeUnknownKey, ECodeStaleReservation or ECodeAlreadyFinalized;
// ErrUnavailable. A repeat of an identical commit returns the original
// result with Replayed set and appends nothing.
func (db *DB) Commit(ctx context.Context, req CommitRequest) (*CommitResult, error) {
	res, err := db.commit(ctx, req)
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
	commitOutcomes.WithLabelValues(label).Inc()
	return res, err
}

func (db *DB) commit(ctx context.Context, req CommitRequest) (*CommitResult, error) {
	if err := checkKeyPath(req.IdempotencyKey); err != nil {
		return nil, err
	}
	if req.Reservation == "" {
		return nil, invalid("reservation", "reservation is required")
	}
	o, err := validateOutcome(req.Outcome, req.ExternalRef, req.Result, req.Error)
	if err != nil {
		return nil, err
	}
	var res *CommitResult
	err = db.submit(ctx, func(ctx context.Context, t *writeTx) error {
		var err error
		res, err = decideCommit(ctx, t, t.now, req.IdempotencyKey, req.Reservation, req.Actor, &o)
		return err
	})
	return res, err
}

// Resolve records an operator's decision about an interrupted key. Errors:
// *Error with ECodeInvalidRequest, ECodeUnknownKey or ECodeNotInterrupted;
// ErrUnavailable.
func (db *DB) Resolve(ctx context.Context, req ResolveRequest) (*ResolveResult, error) {
	res, err := db.resolve(ctx, req)
	label := ErrorCode(err)
	if err == nil {
		label = StatusResolved
	}
	resolveOutcomes.WithLabelValues(label).Inc()
	return res, err
}

func (db *DB) resolve(ctx context.Context, req ResolveRequest) (*ResolveResult, error) {
	if err := checkKeyPath(req.IdempotencyKey); err != nil {
		return nil, err
	}
	if n := len([]rune(req.Note)); n < 1 || n > MaxNoteLen {
		return nil, invalid("note", "note is required: 1–%d characters", MaxNoteLen)
	}
	o, err := validateOutcome(req.Outcome, req.ExternalRef, req.Result, req.Error)
	if err != nil {
		return nil, err
	}
	var res *ResolveResult
	err = db.submit(ctx, func(ctx context.Context, t *writeTx) error {
		var err error
		res, err = decideResolve(ctx, t, t.now, req.IdempotencyKey, req.Actor, req.Note, &o)
		return err
	})
	return res, err
}

// Ready reports whether the database accepts writes. While writes work it
// runs an empty transaction through the writer (cheap). Once a write
// transaction has failed it answers not ready at once, and makes a real
// durable write of 1 MiB on each check; the first such probe that succeeds
// makes the next check ready, so readiness comes back by itself when the
// disk recovers (a successful batch clears the failure too).
func (db *DB) Ready(ctx context.Context) error {
	failed := db.lastWriteErr.Load()
	err := db.submit(ctx, func(ctx context.Context, t *writeTx) error {
		if failed == nil {
			return nil
		}
		if _, err := t.tx.ExecContext(ctx, sqlReadyProbe); err != nil {
			return fmt.Errorf("ready probe: %w", classify(err))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if failed != nil {
		return fmt.Errorf("the last write transaction failed (a probe write now succeeded): %w", *failed)
	}
	return nil
}
