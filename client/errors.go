package client

import (
	"errors"
	"fmt"
	"time"
)

// code is an error code of the ledger's contract. Each has a sentinel
// error (ErrInProgress, …) that an *Error of that code matches with
// errors.Is.
type code string

func (c code) Error() string { return "ledger: " + string(c) }

// Sentinels for the contract's error codes: errors.Is(err, ErrUnsafeResume)
// holds for an *Error with that code, however deeply wrapped.
var (
	// Reserve.
	ErrFingerprintMismatch error = code("fingerprint_mismatch") // the key was first used with another tool, effect or input
	ErrInProgress          error = code("in_progress")          // another attempt holds the key's reservation
	ErrUnsafeResume        error = code("unsafe_resume")        // interrupted, not idempotent: a person must resolve it
	ErrRetryNotAllowed     error = code("retry_not_allowed")    // failed, and not retryable or not idempotent
	ErrAttemptConflict     error = code("attempt_conflict")     // the attempt is not after the execution's recorded one

	// Reserve, under the namespace's policy (SPEC §13).
	ErrApprovalRequired    error = code("approval_required")     // an *ApprovalRequiredError: the call awaits a person's answer
	ErrApprovalRejected    error = code("approval_rejected")     // an approver rejected the call (see RejectionOf)
	ErrDeniedByPolicy      error = code("denied_by_policy")      // a deny rule matches the tool
	ErrUnchangedRetry      error = code("unchanged_retry")       // the same call failed before and the retry changes nothing (see Changed)
	ErrKeyRequired         error = code("key_required")          // a gated call must bring its own idempotency key
	ErrEffectClassMismatch error = code("effect_class_mismatch") // a gated tool declared as none or read

	// Answering approvals.
	ErrAlreadyAnswered error = code("already_answered") // the ask has the other decision
	ErrApprovalExpired error = code("approval_expired") // the ask expired before it was answered
	ErrSelfApproval    error = code("self_approval")    // the approver asked for the call and the policy denies self-approval
	ErrUnknownApproval error = code("unknown_approval") // no ask at that seq

	// Commit and resolve.
	ErrUnknownKey       error = code("unknown_key")
	ErrStaleReservation error = code("stale_reservation") // another reservation took the key over
	ErrAlreadyFinalized error = code("already_finalized")
	ErrNotInterrupted   error = code("not_interrupted")
	ErrUnknownReceipt   error = code("unknown_receipt")

	// Reconcile (SPEC §15).
	ErrReconcileNotAllowed error = code("reconcile_not_allowed") // no rule allows it, or the key's reserve is another actor's
	ErrReconcileTooEarly   error = code("reconcile_too_early")   // not_applied before the lease's end plus settle_ms

	// Rotating the log's signing key (SPEC §9.2).
	ErrKeyRotationConflict error = code("key_rotation_conflict") // the key retired or announced was named by a key receipt before

	// Bounded disk (SPEC §16).
	ErrPruned      error = code("pruned")       // 410: the receipt, key or ask was pruned; its body is in an archived segment (see PrunedOf)
	ErrNotPrunable error = code("not_prunable") // 409: the prune was refused; Details["reason"] says why

	// Generic.
	ErrInvalidJSON      error = code("invalid_json")
	ErrInvalidRequest   error = code("invalid_request")
	ErrInvalidKey       error = code("invalid_key")
	ErrBodyTooLarge     error = code("body_too_large")
	ErrUnsupportedMedia error = code("unsupported_media_type")
	ErrNotFound         error = code("not_found")
	ErrMethodNotAllowed error = code("method_not_allowed")
	ErrUnavailable      error = code("unavailable") // 503: nothing was recorded; retried by the client
	ErrUnauthorized     error = code("unauthorized")
	ErrForbidden        error = code("forbidden")
	ErrRateLimited      error = code("rate_limited") // 429: retried by the client
	ErrInternal         error = code("internal")
	ErrUnknownNamespace error = code("unknown_namespace")
	ErrNamespaceExists  error = code("namespace_exists")
	ErrNamespaceLimit   error = code("namespace_limit") // 507: the server's --max-namespaces is reached
)

// Error is an error response of the ledger: {"error":{"code","message",
// "details"}} with its HTTP status. It matches the sentinel of its code
// with errors.Is.
type Error struct {
	Status  int
	Code    string
	Message string
	Details map[string]any
	// RetryAfter is the response's Retry-After, zero if none.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	return fmt.Sprintf("ledger: %d %s: %s", e.Status, e.Code, e.Message)
}

// Is reports whether target is the sentinel of e's code.
func (e *Error) Is(target error) bool {
	c, ok := target.(code)
	return ok && string(c) == e.Code
}

// Failure is an error an effect function returns to have its failure
// recorded with a code and a retryable flag. Any other error from the
// function is recorded as a non-retryable failure with code
// DefaultFailureCode, except ErrOutcomeUnknown and context errors (see
// Do).
type Failure struct {
	Code      string // 1–64 characters of A-Z, 0-9 and _
	Message   string // at most 1024 characters; Err's text when empty
	Retryable bool   // the error is transient: an idempotent effect may run again
	// NotApplied says the effect applied nothing (a validation error, "not
	// found", a refusal by the downstream): it is recorded as outcome
	// not_applied (SPEC §4.1), Retryable is ignored, and the key may be
	// reserved and run again by any execution.
	NotApplied bool
	Err        error
}

// DefaultFailureCode records a function error that is not a *Failure.
const DefaultFailureCode = "EFFECT_FAILED"

func (f *Failure) Error() string {
	if f.Err != nil {
		return f.Code + ": " + f.Err.Error()
	}
	if f.Message != "" {
		return f.Code + ": " + f.Message
	}
	return f.Code
}

// Unwrap returns the underlying error.
func (f *Failure) Unwrap() error { return f.Err }

// Retryable returns a *Failure with the given code marked retryable: the
// effect did not happen and may be tried again (if it is idempotent).
func Retryable(code string, err error) error { return &Failure{Code: code, Retryable: true, Err: err} }

// Permanent returns a *Failure with the given code that must not be
// retried.
func Permanent(code string, err error) error { return &Failure{Code: code, Err: err} }

// NotApplied returns a *Failure with the given code that applied nothing:
// Do commits it as outcome not_applied, and a later Do of the same key
// runs the effect again (SPEC §4.1). Use it only when nothing happened
// downstream; the audit lists every effect run again after one.
func NotApplied(code string, err error) error {
	return &Failure{Code: code, NotApplied: true, Err: err}
}

// ErrOutcomeUnknown, wrapped in the error an effect function returns,
// says that the effect may or may not have happened (a downstream call
// timed out, say). Do then records no outcome: the reservation stays open
// and becomes interrupted when its lease ends, so that the next attempt
// takes it over (idempotent effects) or a person resolves it.
var ErrOutcomeUnknown = errors.New("effect outcome unknown")

// ErrMalformedResult: the ledger replayed a recorded result that is not
// JSON, which no ledger writes (the file was edited). Do does not hand it
// back as the effect's result.
var ErrMalformedResult = errors.New("recorded result is not JSON")

// EffectError is returned by Do when the effect function failed and its
// failure was recorded (as not_applied when Failure.NotApplied). It
// unwraps to the function's error.
type EffectError struct {
	Key     string
	Failure Failure    // what was recorded
	Receipt ReceiptRef // the commit receipt
	Err     error      // the function's error
}

func (e *EffectError) Error() string {
	if e.Failure.NotApplied {
		return fmt.Sprintf("effect %s applied nothing (%s): %v", e.Key, e.Failure.Code, e.Err)
	}
	return fmt.Sprintf("effect %s failed (%s): %v", e.Key, e.Failure.Code, e.Err)
}

// Unwrap returns the function's error.
func (e *EffectError) Unwrap() error { return e.Err }

// CommitError is returned by Do when the effect ran but its outcome could
// not be recorded, even after retries (the ledger was unreachable, or the
// reservation was taken over). The reservation is not lost: it carries
// everything needed to record the outcome later with Client.Commit, and
// until then the key shows as reserved, then interrupted.
type CommitError struct {
	Key         string
	Reservation string
	Commit      Commit // what Do tried to record
	Err         error  // why it could not (an *Error, or a transport error)
	// EffectErr is the function's error when the effect failed.
	EffectErr error
}

func (e *CommitError) Error() string {
	return fmt.Sprintf("effect %s ran but its %s outcome was not recorded: %v", e.Key, e.Commit.Outcome, e.Err)
}

// Unwrap returns the commit's error and the function's error, if any.
func (e *CommitError) Unwrap() []error {
	if e.EffectErr != nil {
		return []error{e.Err, e.EffectErr}
	}
	return []error{e.Err}
}

// UnknownOutcomeError is returned by Do when the function's error says
// the effect may have happened (ErrOutcomeUnknown, or a context error):
// nothing was recorded and the reservation is left to its lease. Commit
// it with Client.Commit when the outcome becomes known.
type UnknownOutcomeError struct {
	Key         string
	Reservation string
	Err         error // the function's error
}

func (e *UnknownOutcomeError) Error() string {
	return fmt.Sprintf("effect %s: outcome unknown, reservation left open: %v", e.Key, e.Err)
}

// Unwrap returns the function's error.
func (e *UnknownOutcomeError) Unwrap() error { return e.Err }

// PanicError is the value Do panics with when the effect function
// panicked: the original value, with the key and reservation, since the
// effect may have happened. Nothing was recorded; the reservation stays
// open (see UnknownOutcomeError).
type PanicError struct {
	Key         string
	Reservation string
	Value       any    // what the function panicked with
	Stack       []byte // the function's stack at the panic
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("effect %s panicked, reservation left open: %v", e.Key, e.Value)
}

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}
