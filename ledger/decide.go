package ledger

import (
	"context"
	"crypto/subtle"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
)

// keyRecord is the derived state of one idempotency key (table keys),
// exported as KeyRecord.
type keyRecord struct {
	Key            string
	Generated      bool
	Tool           string // fingerprint, from the first reserve
	Effect         string
	InputHash      string
	Idempotent     bool
	FirstSeq       uint64 // the first reserve
	ReserveSeq     uint64 // the latest reserve
	LeaseExpiresAt uint64 // of the latest reserve, unix ms
	FinalSeq       uint64 // the latest commit or resolve; 0 if none
	// TokenHash is the SHA-256 of the latest reservation token, as bytes
	// in a string (comparable). It is not derivable from the receipts:
	// scans of the keys table leave it empty.
	TokenHash string
}

// KeyRecord is one row of the derived keys table.
type KeyRecord = keyRecord

// finalized reports whether the latest reservation has an outcome.
func (k *keyRecord) finalized() bool { return k.FinalSeq > k.ReserveSeq }

// StateOf derives a key's state from its record, the receipt at
// k.FinalSeq when the key has an outcome (else ignored) and the time now
// (unix ms): what every driver's GetKey reports.
func StateOf(k *KeyRecord, final *chain.Receipt, now uint64) State { return stateOf(k, final, now) }

// stateOf derives a key's state. final is the receipt at k.FinalSeq when
// k.finalized(), else ignored.
func stateOf(k *keyRecord, final *chain.Receipt, now uint64) State {
	switch {
	case k.finalized() && final.Outcome == chain.OutcomeSucceeded:
		return StateSucceeded
	case k.finalized():
		return StateFailed
	case now < k.LeaseExpiresAt:
		return StateReserved
	default:
		return StateInterrupted
	}
}

// writeStore is what the state machine needs from one write transaction.
// Reads see the writes made earlier in the same transaction.
type writeStore interface {
	// key returns the record of key, or found false.
	key(ctx context.Context, key string) (k keyRecord, found bool, err error)
	// receipt returns the receipt at seq, which must exist.
	receipt(ctx context.Context, seq uint64) (chain.Receipt, error)
	// maxAttempt returns the highest attempt recorded for execution on key.
	maxAttempt(ctx context.Context, key, execution string) (max uint64, found bool, err error)
	// append links r to the chain head, stores it and returns it linked.
	append(ctx context.Context, r chain.Receipt) (chain.Receipt, error)
	// putKey inserts or replaces a key record.
	putKey(ctx context.Context, k *keyRecord) error
}

// decideReserve runs the reserve table of SPEC §4 for validated args at
// time now (unix ms), appending at most one receipt.
func decideReserve(ctx context.Context, s writeStore, now uint64, a *reserveArgs) (*ReserveResult, error) {
	if a.effect == chain.EffectNone || a.effect == chain.EffectRead {
		return &ReserveResult{Status: StatusNotRecorded, IdempotencyKey: a.key, KeyGenerated: a.generated}, nil
	}
	k, found, err := s.key(ctx, a.key)
	if err != nil {
		return nil, err
	}
	for found && a.generated { // a generated key never collides; if it does, draw again
		a.key = NewGeneratedKey()
		if k, found, err = s.key(ctx, a.key); err != nil {
			return nil, err
		}
	}
	if !found {
		k = keyRecord{Key: a.key, Generated: a.generated, Tool: a.tool, Effect: a.effect,
			InputHash: a.inputHash, Idempotent: a.idempotent}
		return appendReserve(ctx, s, now, a, &k, 0, false, false)
	}
	if a.tool != k.Tool || a.effect != k.Effect || (a.inputHash != "" && a.inputHash != k.InputHash) {
		return nil, &Error{Code: ECodeFingerprintMismatch,
			Message: "idempotency key was first used with another tool, effect or input",
			Details: map[string]any{"tool": k.Tool, "effect": k.Effect, "input_hash": k.InputHash}}
	}
	var final chain.Receipt
	if k.finalized() {
		if final, err = s.receipt(ctx, k.FinalSeq); err != nil {
			return nil, err
		}
	}
	switch stateOf(&k, &final, now) {
	case StateSucceeded:
		replay, err := s.append(ctx, chain.Receipt{
			Kind: chain.KindReplay, IdempotencyKey: k.Key, KeyGenerated: k.Generated,
			ExecutionID: a.execution, Attempt: a.attempt, Tool: k.Tool, Effect: k.Effect,
			Idempotent: k.Idempotent, InputHash: k.InputHash, RefSeq: final.Seq,
			Actor: a.actor, RecordedAt: now,
		})
		if err != nil {
			return nil, err
		}
		return &ReserveResult{Status: StatusReplayed, IdempotencyKey: k.Key, KeyGenerated: k.Generated,
			Outcome: final.Outcome, ExternalRef: final.ExternalRef, Result: final.Result,
			Original: refOf(&final), Receipt: refOf(&replay)}, nil
	case StateReserved:
		wait := k.LeaseExpiresAt - now
		return nil, &inProgressError{leaseExpiresAt: k.LeaseExpiresAt, err: &Error{Code: ECodeInProgress,
			Message:    "another attempt holds the reservation of this key",
			Details:    map[string]any{"lease_expires_at": k.LeaseExpiresAt},
			RetryAfter: MsDuration((wait + 999) / 1000 * 1000)}}
	case StateInterrupted:
		if !k.Idempotent {
			r, err := s.receipt(ctx, k.ReserveSeq)
			if err != nil {
				return nil, err
			}
			return nil, &Error{Code: ECodeUnsafeResume,
				Message: "the effect was interrupted and may have happened; a person must resolve it",
				Details: map[string]any{"reservation": map[string]any{
					"seq": r.Seq, "hash": r.Hash.String(), "execution_id": r.ExecutionID,
					"attempt": r.Attempt, "lease_expires_at": r.LeaseExpiresAt}}}
		}
		return appendReserve(ctx, s, now, a, &k, k.ReserveSeq, true, false)
	default: // StateFailed
		if !final.Retryable || !k.Idempotent {
			why := "the recorded failure is not retryable"
			if final.Retryable {
				why = "the key was not declared idempotent"
			}
			return nil, &Error{Code: ECodeRetryNotAllowed,
				Message: "retry not allowed: " + why,
				Details: map[string]any{"failure": map[string]any{
					"seq": final.Seq, "kind": final.Kind, "error_code": final.ErrorCode,
					"error_message": final.ErrorMessage, "retryable": final.Retryable},
					"idempotent": k.Idempotent}}
		}
		return appendReserve(ctx, s, now, a, &k, final.Seq, false, true)
	}
}

// appendReserve appends a reserve receipt for k (new when refSeq is 0),
// enforcing attempt order for takeovers and retries.
func appendReserve(ctx context.Context, s writeStore, now uint64, a *reserveArgs, k *keyRecord,
	refSeq uint64, takeover, retry bool) (*ReserveResult, error) {
	if refSeq != 0 {
		max, found, err := s.maxAttempt(ctx, k.Key, a.execution)
		if err != nil {
			return nil, err
		}
		if found && a.attempt <= max {
			return nil, &Error{Code: ECodeAttemptConflict,
				Message: fmt.Sprintf("attempt %d of execution %q is not after its recorded attempt %d", a.attempt, a.execution, max),
				Details: map[string]any{"execution_id": a.execution, "attempt": a.attempt, "recorded_attempt": max}}
		}
	}
	lease := now + a.leaseMS
	r, err := s.append(ctx, chain.Receipt{
		Kind: chain.KindReserve, IdempotencyKey: k.Key, KeyGenerated: k.Generated,
		ExecutionID: a.execution, Attempt: a.attempt, Tool: k.Tool, Effect: k.Effect,
		Idempotent: k.Idempotent, InputHash: k.InputHash, LeaseExpiresAt: lease,
		RefSeq: refSeq, Actor: a.actor, RecordedAt: now,
	})
	if err != nil {
		return nil, err
	}
	if refSeq == 0 {
		k.FirstSeq = r.Seq
	}
	token := newReservationToken()
	k.ReserveSeq, k.LeaseExpiresAt, k.TokenHash = r.Seq, lease, string(tokenHash(token))
	if err := s.putKey(ctx, k); err != nil {
		return nil, err
	}
	return &ReserveResult{Status: StatusReserved, IdempotencyKey: k.Key, KeyGenerated: k.Generated,
		Reservation: token, Attempt: a.attempt, LeaseExpiresAt: lease,
		Takeover: takeover, Retry: retry, Receipt: refOf(&r)}, nil
}

// decideCommit runs the commit table of SPEC §4.
func decideCommit(ctx context.Context, s writeStore, now uint64, key, token, actor string, o *outcomeArgs) (*CommitResult, error) {
	k, found, err := s.key(ctx, key)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, Errorf(ECodeUnknownKey, "no such idempotency key")
	}
	if err := checkReservationToken(token); err != nil {
		return nil, err
	}
	if subtle.ConstantTimeCompare([]byte(k.TokenHash), tokenHash(token)) != 1 {
		return nil, &Error{Code: ECodeStaleReservation,
			Message: "this reservation token is not the key's latest reservation (it was taken over, retried, or never issued for this key)",
			Details: map[string]any{"latest_reserve_seq": k.ReserveSeq}}
	}
	reserve, err := s.receipt(ctx, k.ReserveSeq)
	if err != nil {
		return nil, err
	}
	if k.finalized() {
		final, err := s.receipt(ctx, k.FinalSeq)
		if err != nil {
			return nil, err
		}
		if final.Kind == chain.KindCommit && sameOutcome(&final, o) {
			return &CommitResult{IdempotencyKey: k.Key, Outcome: final.Outcome, Receipt: refOf(&final),
				Late: final.RecordedAt >= reserve.LeaseExpiresAt, Replayed: true}, nil
		}
		return nil, &Error{Code: ECodeAlreadyFinalized,
			Message: "this reservation already has a different recorded outcome",
			Details: map[string]any{"final": map[string]any{"seq": final.Seq, "kind": final.Kind, "outcome": final.Outcome}}}
	}
	r, err := appendOutcome(ctx, s, now, &k, &reserve, chain.KindCommit, actor, "", o)
	if err != nil {
		return nil, err
	}
	return &CommitResult{IdempotencyKey: k.Key, Outcome: r.Outcome, Receipt: refOf(&r),
		Late: now >= reserve.LeaseExpiresAt}, nil
}

// decideResolve records an operator's outcome for an interrupted key.
func decideResolve(ctx context.Context, s writeStore, now uint64, key, actor, note string, o *outcomeArgs) (*ResolveResult, error) {
	k, found, err := s.key(ctx, key)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, Errorf(ECodeUnknownKey, "no such idempotency key")
	}
	var final chain.Receipt
	if k.finalized() {
		if final, err = s.receipt(ctx, k.FinalSeq); err != nil {
			return nil, err
		}
	}
	if st := stateOf(&k, &final, now); st != StateInterrupted {
		return nil, &Error{Code: ECodeNotInterrupted, Message: fmt.Sprintf("key is %s, not interrupted", st),
			Details: map[string]any{"state": string(st)}}
	}
	reserve, err := s.receipt(ctx, k.ReserveSeq)
	if err != nil {
		return nil, err
	}
	r, err := appendOutcome(ctx, s, now, &k, &reserve, chain.KindResolve, actor, note, o)
	if err != nil {
		return nil, err
	}
	st := StateSucceeded
	if r.Outcome == chain.OutcomeFailed {
		st = StateFailed
	}
	return &ResolveResult{IdempotencyKey: k.Key, State: st, Receipt: refOf(&r)}, nil
}

// appendOutcome appends a commit or resolve receipt for the reserve and
// records it as the key's final receipt.
func appendOutcome(ctx context.Context, s writeStore, now uint64, k *keyRecord, reserve *chain.Receipt,
	kind, actor, note string, o *outcomeArgs) (chain.Receipt, error) {
	r, err := s.append(ctx, chain.Receipt{
		Kind: kind, IdempotencyKey: k.Key, KeyGenerated: k.Generated,
		ExecutionID: reserve.ExecutionID, Attempt: reserve.Attempt, Tool: reserve.Tool,
		Effect: reserve.Effect, Idempotent: reserve.Idempotent, InputHash: reserve.InputHash,
		Outcome: o.outcome, ExternalRef: o.externalRef, Result: o.result,
		ErrorCode: o.failure.Code, ErrorMessage: o.failure.Message, Retryable: o.failure.Retryable,
		RefSeq: reserve.Seq, Actor: actor, Note: note, RecordedAt: now,
	})
	if err != nil {
		return r, err
	}
	k.FinalSeq = r.Seq
	return r, s.putKey(ctx, k)
}

// sameOutcome reports whether a recorded commit has the values of o:
// outcome, external_ref and error fields equal, result equal as JSON.
func sameOutcome(r *chain.Receipt, o *outcomeArgs) bool {
	return r.Outcome == o.outcome && r.ExternalRef == o.externalRef &&
		r.ErrorCode == o.failure.Code && r.ErrorMessage == o.failure.Message &&
		r.Retryable == o.failure.Retryable && sameJSON(r.Result, o.result)
}
