package ledger

import (
	"context"
	"crypto/subtle"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
)

// finalized reports whether the latest reservation has an outcome.
func (k *KeyRecord) finalized() bool { return k.FinalSeq > k.ReserveSeq }

// StateOf derives a key's state from its record, the receipt at
// k.FinalSeq when the key has an outcome (else ignored) and the time now
// (unix ms): what every driver's GetKey reports.
func StateOf(k *KeyRecord, final *chain.Receipt, now uint64) State {
	switch {
	case k.finalized() && final.Outcome == chain.OutcomeSucceeded:
		return StateSucceeded
	case k.finalized() && final.Outcome == chain.OutcomeNotApplied:
		return StateNotApplied
	case k.finalized():
		return StateFailed
	case now < k.LeaseExpiresAt:
		return StateReserved
	default:
		return StateInterrupted
	}
}

// decideReserve runs the reserve table of SPEC §4 for validated args at
// time now (unix ms), appending at most one receipt. keyTTL is the
// namespace's key_ttl_ms (SPEC §12): a finalized key whose outcome is at
// least that old is decided as a new key (0: keys never expire).
func decideReserve(ctx context.Context, s *batchTx, now, keyTTL uint64, a *reserveArgs) (*ReserveResult, error) {
	if a.effect == chain.EffectNone || a.effect == chain.EffectRead {
		return &ReserveResult{Status: StatusNotRecorded, IdempotencyKey: a.key, KeyGenerated: a.generated}, nil
	}
	if err := s.settleInputHash(ctx, a); err != nil {
		return nil, err
	}
	k, found, err := s.Key(ctx, a.key)
	if err != nil {
		return nil, err
	}
	for found && a.generated { // a generated key never collides; if it does, draw again
		a.key = NewGeneratedKey()
		if k, found, err = s.Key(ctx, a.key); err != nil {
			return nil, err
		}
	}
	if !found {
		k = KeyRecord{Key: a.key, Generated: a.generated, Tool: a.tool, Effect: a.effect,
			InputHash: a.inputHash, Idempotent: a.idempotent}
		return appendReserve(ctx, s, now, a, &k, 0, reserveNew)
	}
	if res, renewed, err := renewExpired(ctx, s, now, keyTTL, a, &k); renewed || err != nil {
		return res, err
	}
	if err := s.inputHashLike(ctx, a, k.InputHash); err != nil {
		return nil, err
	}
	if a.tool != k.Tool || a.effect != k.Effect || (a.inputHash != "" && a.inputHash != k.InputHash) {
		return nil, &Error{Code: ECodeFingerprintMismatch,
			Message: "idempotency key was first used with another tool, effect or input",
			Details: map[string]any{"tool": k.Tool, "effect": k.Effect, "input_hash": k.InputHash}}
	}
	var final chain.Receipt
	if k.finalized() {
		if final, err = s.Receipt(ctx, k.FinalSeq); err != nil {
			return nil, err
		}
		// The outcome decides (a replay serves it, a failure's fields
		// allow a retry or not): only as the chain recorded it.
		if err := s.checkRecorded(ctx, &final); err != nil {
			return nil, err
		}
		if err := s.shown(ctx, &final); err != nil {
			return nil, err
		}
	}
	switch StateOf(&k, &final, now) {
	case StateSucceeded:
		return appendReplay(ctx, s, now, a, &k, &final)
	case StateReserved:
		wait := k.LeaseExpiresAt - now
		return nil, &inProgressError{leaseExpiresAt: k.LeaseExpiresAt, err: &Error{Code: ECodeInProgress,
			Message:    "another attempt holds the reservation of this key",
			Details:    map[string]any{"lease_expires_at": k.LeaseExpiresAt},
			RetryAfter: MsDuration((wait + 999) / 1000 * 1000)}}
	case StateInterrupted:
		if !k.Idempotent {
			return nil, unsafeResume(ctx, s, &k)
		}
		return appendReserve(ctx, s, now, a, &k, k.ReserveSeq, reserveTakeover)
	case StateNotApplied:
		res, err := appendReserve(ctx, s, now, a, &k, final.Seq, reserveAfterNotApplied)
		if err != nil || res.Status != StatusReserved {
			return res, err
		}
		res.AfterNotApplied = &NotAppliedRef{Seq: final.Seq, ErrorCode: final.ErrorCode}
		return res, nil
	default: // StateFailed
		if !final.Retryable || !k.Idempotent {
			why := "the recorded failure is not retryable"
			if final.Retryable {
				why = "the key was not declared idempotent"
			}
			failure := quoted(map[string]any{"seq": final.Seq, "kind": final.Kind, "error_code": final.ErrorCode,
				"error_message": final.Value(chain.FieldErrorMessage), "retryable": final.Retryable}, &final)
			return nil, &Error{Code: ECodeRetryNotAllowed, Message: "retry not allowed: " + why,
				Details: map[string]any{"failure": failure, "idempotent": k.Idempotent}}
		}
		return appendReserve(ctx, s, now, a, &k, final.Seq, reserveRetry)
	}
}

// appendReplay records a replay of k's success (SPEC §4: a key that succeeded answers with the
// recorded outcome) and returns it.
func appendReplay(ctx context.Context, s *batchTx, now uint64, a *reserveArgs, k *KeyRecord, final *chain.Receipt) (*ReserveResult, error) {
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
		Outcome: final.Outcome, ExternalRef: final.Value(chain.FieldExternalRef), Result: final.Value(chain.FieldResult),
		Erased:   erasedNames(final.Open),
		Original: refOf(final), Receipt: refOf(&replay)}, nil
}

// unsafeResume is the refusal of a non-idempotent key whose reservation was interrupted: the
// effect may have happened, so a person resolves it. It names the interrupted reservation.
func unsafeResume(ctx context.Context, s *batchTx, k *KeyRecord) error {
	r, err := s.Receipt(ctx, k.ReserveSeq)
	if err != nil {
		return err
	}
	return &Error{Code: ECodeUnsafeResume,
		Message: "the effect was interrupted and may have happened; a person must resolve it",
		Details: map[string]any{"reservation": map[string]any{
			"seq": r.Seq, "hash": r.Hash.String(), "execution_id": r.ExecutionID,
			"attempt": r.Attempt, "lease_expires_at": r.LeaseExpiresAt}}}
}

// ExpiresAt returns when a key finalized at unix ms finalAt is forgotten
// under keyTTL (SPEC §12), or 0 when keys never expire.
func ExpiresAt(finalAt, keyTTL uint64) uint64 {
	if keyTTL == 0 {
		return 0
	}
	return finalAt + keyTTL
}

// renewExpired starts a new generation of k when its outcome is at least
// keyTTL old (SPEC §12): the reserve is decided as for a new key, with
// the fingerprint of this request, and links to the key's latest receipt.
// renewed is false when k has not expired.
func renewExpired(ctx context.Context, s *batchTx, now, keyTTL uint64, a *reserveArgs, k *KeyRecord) (res *ReserveResult, renewed bool, err error) {
	if keyTTL == 0 || !k.finalized() {
		return nil, false, nil
	}
	final, err := s.Receipt(ctx, k.FinalSeq)
	if err != nil {
		return nil, false, err
	}
	if now < ExpiresAt(final.RecordedAt, keyTTL) {
		return nil, false, nil
	}
	last, err := s.lastOfKey(ctx, k)
	if err != nil {
		return nil, false, err
	}
	prev, err := s.Receipt(ctx, last)
	if err != nil {
		return nil, false, err
	}
	next := KeyRecord{Key: k.Key, Generated: k.Generated, Tool: a.tool, Effect: a.effect,
		InputHash: a.inputHash, Idempotent: a.idempotent}
	res, err = appendReserve(ctx, s, now, a, &next, last, reserveRenewal)
	if err != nil || res.Status != StatusReserved {
		return res, true, err
	}
	res.Renewed = &Renewal{Seq: prev.Seq, RecordedAt: prev.RecordedAt}
	return res, true, nil
}

// lastOfKey returns the seq of k's latest receipt that a renewal names
// (SPEC §12): its latest receipt, the gate's asks, answers and denies
// after the outcome aside (SPEC §13: an ask names what the reserve would),
// and a late commit after a reconcile (SPEC §15: not the key's outcome).
// Both exist only in a namespace with a policy.
func (s *batchTx) lastOfKey(ctx context.Context, k *KeyRecord) (uint64, error) {
	last, err := s.LastSeq(ctx, k.Key)
	if err != nil || last == k.FinalSeq {
		return last, err
	}
	if pseq, err := s.PolicySeq(ctx); err != nil || pseq == 0 {
		return last, err
	}
	hist, err := s.KeyHistory(ctx, k.Key, k.FinalSeq)
	if err != nil {
		return 0, err
	}
	last = k.FinalSeq
	for _, r := range hist {
		if r.Kind != chain.KindAsk && r.Kind != chain.KindApproval && r.Kind != chain.KindDeny && r.Kind != chain.KindCommit {
			last = r.Seq
		}
	}
	return last, nil
}

// reserveKind is why a reserve receipt is appended.
type reserveKind int

const (
	reserveNew      reserveKind = iota // a key never seen
	reserveRenewal                     // a new generation of an expired key
	reserveTakeover                    // an interrupted idempotent reservation
	reserveRetry                       // a retryable failure of an idempotent key
	// reserveAfterNotApplied: an outcome that applied nothing (SPEC §4.1),
	// decided as a new key of the same generation.
	reserveAfterNotApplied
	// reserveEndLease: a dead process's reservation ended by its own
	// execution (EndLeases); it runs nothing, so the gate never asks,
	// denies or consumes for it.
	reserveEndLease
)

// appendReserve appends a reserve receipt for k that names refSeq,
// enforcing attempt order within the key's generation for takeovers and
// retries. A new key or generation starts at this receipt.
func appendReserve(ctx context.Context, s *batchTx, now uint64, a *reserveArgs, k *KeyRecord,
	refSeq uint64, why reserveKind) (*ReserveResult, error) {
	if why == reserveTakeover || why == reserveRetry || why == reserveAfterNotApplied || why == reserveEndLease {
		max, found, err := s.MaxAttempt(ctx, k.Key, a.execution, k.FirstSeq)
		if err != nil {
			return nil, err
		}
		if found && a.attempt <= max {
			return nil, &Error{Code: ECodeAttemptConflict,
				Message: fmt.Sprintf("attempt %d of execution %q is not after its recorded attempt %d", a.attempt, a.execution, max),
				Details: map[string]any{"execution_id": a.execution, "attempt": a.attempt, "recorded_attempt": max}}
		}
	}
	g, err := s.gate(ctx, now, a, k, refSeq, why)
	if err != nil || g.result != nil {
		return g.result, err
	}
	if why == reserveNew {
		k.Idempotent = a.idempotent // an ask may have fixed it (SPEC §2.1)
	}
	lease := now + a.leaseMS
	r, err := s.append(ctx, chain.Receipt{
		Kind: chain.KindReserve, IdempotencyKey: k.Key, KeyGenerated: k.Generated,
		ExecutionID: a.execution, Attempt: a.attempt, Tool: k.Tool, Effect: k.Effect,
		Idempotent: k.Idempotent, InputHash: k.InputHash, LeaseExpiresAt: lease,
		RefSeq: g.refSeq, Actor: a.actor, Note: g.note, RecordedAt: now,
	})
	if err != nil {
		return nil, err
	}
	if why == reserveNew || why == reserveRenewal {
		k.FirstSeq = r.Seq
		if len(a.subjects) > 0 { // fixed by the generation's first reserve (SPEC §14)
			if err := s.PutSubjects(ctx, k.Key, r.Seq, a.subjects); err != nil {
				return nil, err
			}
		}
	}
	token := newReservationToken()
	k.ReserveSeq, k.LeaseExpiresAt, k.TokenHash = r.Seq, lease, string(tokenHash(token))
	if err := s.PutKey(ctx, k); err != nil {
		return nil, err
	}
	if g.consumed != nil {
		s.event("consume")
		if err := s.carryPending(ctx, k, g.consumed.AskSeq); err != nil {
			return nil, err
		}
	}
	return &ReserveResult{Status: StatusReserved, IdempotencyKey: k.Key, KeyGenerated: k.Generated,
		Reservation: token, Attempt: a.attempt, LeaseExpiresAt: lease, Approval: g.consumed,
		Takeover: why == reserveTakeover, Retry: why == reserveRetry, Receipt: refOf(&r)}, nil
}

// decideCommit runs the commit table of SPEC §4.
func decideCommit(ctx context.Context, s *batchTx, now uint64, key, token, actor string, o *outcomeArgs) (*CommitResult, error) {
	k, found, err := s.Key(ctx, key)
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
		if late, err := lateCommitOfReconciled(ctx, s, now, &k, token, actor, o); late != nil || err != nil {
			return late, err
		}
		return nil, &Error{Code: ECodeStaleReservation,
			Message: "this reservation token is not the key's latest reservation (it was taken over, retried, or never issued for this key)",
			Details: map[string]any{"latest_reserve_seq": k.ReserveSeq}}
	}
	reserve, err := s.Receipt(ctx, k.ReserveSeq)
	if err != nil {
		return nil, err
	}
	if k.finalized() {
		final, err := s.Receipt(ctx, k.FinalSeq)
		if err == nil {
			err = s.shown(ctx, &final)
		}
		if err != nil {
			return nil, err
		}
		if final.Kind == chain.KindReconcile && final.RefSeq == reserve.Seq {
			return lateCommit(ctx, s, now, &k, &reserve, &final, actor, o)
		}
		if final.Kind == chain.KindCommit && sameOutcome(&final, o) {
			return &CommitResult{IdempotencyKey: k.Key, Outcome: final.Outcome, Receipt: refOf(&final),
				Late: final.RecordedAt >= reserve.LeaseExpiresAt, Replayed: true}, nil
		}
		return nil, &Error{Code: ECodeAlreadyFinalized,
			Message: "this reservation already has a different recorded outcome",
			Details: map[string]any{"final": map[string]any{"seq": final.Seq, "kind": final.Kind, "outcome": final.Outcome}}}
	}
	r, err := appendOutcome(ctx, s, now, &k, &reserve, reserve.Seq, chain.KindCommit, actor, "", o)
	if err != nil {
		return nil, err
	}
	return &CommitResult{IdempotencyKey: k.Key, Outcome: r.Outcome, Receipt: refOf(&r),
		Late: now >= reserve.LeaseExpiresAt}, nil
}

// decideResolve records an operator's outcome for an interrupted key, or
// the correction of a failed key to not_applied (SPEC §4.1) when
// mayCorrect.
func decideResolve(ctx context.Context, s *batchTx, now uint64, key, actor, note string, mayCorrect bool, o *outcomeArgs) (*ResolveResult, error) {
	k, found, err := s.Key(ctx, key)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, Errorf(ECodeUnknownKey, "no such idempotency key")
	}
	var final chain.Receipt
	if k.finalized() {
		if final, err = s.Receipt(ctx, k.FinalSeq); err != nil {
			return nil, err
		}
	}
	st := StateOf(&k, &final, now)
	correction := st == StateFailed && o.outcome == chain.OutcomeNotApplied
	switch {
	case correction && !mayCorrect:
		return nil, &Error{Code: ECodeForbidden,
			Message: "only an admin token may correct a failed key to not_applied",
			Details: map[string]any{"state": string(st)}}
	case st != StateInterrupted && !correction:
		return nil, &Error{Code: ECodeNotInterrupted, Message: fmt.Sprintf("key is %s, not interrupted", st),
			Details: map[string]any{"state": string(st)}}
	}
	reserve, err := s.Receipt(ctx, k.ReserveSeq)
	if err != nil {
		return nil, err
	}
	refSeq := reserve.Seq
	if correction {
		refSeq = final.Seq // the failed commit or resolve it corrects
	}
	r, err := appendOutcome(ctx, s, now, &k, &reserve, refSeq, chain.KindResolve, actor, note, o)
	if err != nil {
		return nil, err
	}
	return &ResolveResult{IdempotencyKey: k.Key, State: outcomeState(r.Outcome), Receipt: refOf(&r)}, nil
}

// outcomeState is the state of a key whose final receipt has outcome.
func outcomeState(outcome string) State {
	switch outcome {
	case chain.OutcomeSucceeded:
		return StateSucceeded
	case chain.OutcomeNotApplied:
		return StateNotApplied
	}
	return StateFailed
}

// appendOutcome appends a commit, resolve or reconcile receipt for the reserve,
// naming refSeq (the reserve, or the failure a correction corrects), and
// records it as the key's final receipt.
func appendOutcome(ctx context.Context, s *batchTx, now uint64, k *KeyRecord, reserve *chain.Receipt,
	refSeq uint64, kind, actor, note string, o *outcomeArgs) (chain.Receipt, error) {
	r, err := s.append(ctx, outcomeReceipt(now, k, reserve, refSeq, kind, actor, note, o))
	if err != nil {
		return r, err
	}
	k.FinalSeq = r.Seq
	if err := s.PutKey(ctx, k); err != nil {
		return r, err
	}
	return r, s.completePending(ctx, k, &r)
}

// outcomeReceipt is the commit, resolve or reconcile receipt of o for
// the reserve: it repeats the reserve's execution, attempt and fingerprint
// (SPEC §3) and names refSeq.
func outcomeReceipt(now uint64, k *KeyRecord, reserve *chain.Receipt, refSeq uint64, kind, actor, note string, o *outcomeArgs) chain.Receipt {
	return chain.Receipt{
		Kind: kind, IdempotencyKey: k.Key, KeyGenerated: k.Generated,
		ExecutionID: reserve.ExecutionID, Attempt: reserve.Attempt, Tool: reserve.Tool,
		Effect: reserve.Effect, Idempotent: reserve.Idempotent, InputHash: reserve.InputHash,
		Outcome: o.outcome, ExternalRef: o.externalRef, Result: o.result,
		ErrorCode: o.failure.Code, ErrorMessage: o.failure.Message, Retryable: o.failure.Retryable,
		RefSeq: refSeq, Actor: actor, Note: note, RecordedAt: now,
	}
}

// sameOutcome reports whether a recorded commit has the values of o:
// outcome, external_ref and error fields equal, result equal as JSON.
func sameOutcome(r *chain.Receipt, o *outcomeArgs) bool {
	if r.Open.Erased() != nil {
		// Values erased (SPEC §14): outcome and error code only, so that
		// a committer can re-send, and a probe confirms no guessed value.
		return r.Outcome == o.outcome && r.ErrorCode == o.failure.Code
	}
	return r.Outcome == o.outcome && r.Value(chain.FieldExternalRef) == o.externalRef &&
		r.ErrorCode == o.failure.Code && r.Value(chain.FieldErrorMessage) == o.failure.Message &&
		r.Retryable == o.failure.Retryable && sameJSON(r.Value(chain.FieldResult), o.result)
}
