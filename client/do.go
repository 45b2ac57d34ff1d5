package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"time"
	"unicode/utf8"
)

// Effect describes one side effect for Do.
type Effect struct {
	Tool  string // the tool or capability, 1–128 bytes of visible ASCII
	Class Class  // ClassWrite, ClassDestructive or ClassExternal (None and Read skip the ledger)
	// Input is what the call does, as JSON (a json.RawMessage is taken as
	// is, anything else is marshalled). Do fingerprints it locally and
	// sends only the fingerprint; with no Key it also derives the key.
	Input any
	// InputHash is a fingerprint computed elsewhere; when set, Input is
	// used only to derive a missing Key.
	InputHash string
	// Key is the idempotency key. Empty: derived from Tool and Input,
	// which needs an Input: in a namespace that commits its payloads
	// DeriveKeyWith the namespace's derivation key (dk2_, fetched once per
	// Client), else DeriveKey (dk_). None and read calls, which skip the
	// ledger, get DeriveKey's.
	Key string
	// ExecutionID names the invocation (the model's tool-call id, say);
	// empty: a fresh one per Do.
	ExecutionID string
	// Attempt is the runtime retry number within ExecutionID (0 means 1).
	Attempt uint64
	// Idempotent declares that the effect dedupes downstream (it passes
	// the key on, say): an interrupted attempt may then be taken over and
	// a retryable failure retried.
	Idempotent bool
	// Lease is how long the reservation is held (default: the ledger's,
	// 30 s). Make it longer than the effect can take.
	Lease time.Duration
	// SendInput sends Input itself instead of its fingerprint: the ledger
	// then fingerprints it, and keeps it off the chain for the approvers
	// when the namespace's policy sends the call to approval, which needs
	// the input (SPEC §13). Not with InputHash.
	SendInput bool
	// ApprovalSummary is shown to the approver as the requester's account
	// of the call (at most 1024 bytes).
	ApprovalSummary string
	// Changed says what this call changed since the same call failed
	// (SPEC §13: a namespace's repeat_failure rule refuses an unchanged
	// retry with ErrUnchangedRetry).
	Changed *Changed
	// Subjects are opaque ids of the people the effect concerns (a
	// customer id, a recipient id), at most 8 of 1–128 bytes: an erasure
	// by subject (POST /v1/ns/{ns}/erasures {"subject"}) then removes the
	// recorded values of this key (SPEC §14). Only their HMACs are kept,
	// never on the chain; the first reserve of a key's generation fixes
	// them. Never put names, addresses or other personal data in them.
	Subjects []string
	// Reconcile, when set, is called when the reserve answers
	// unsafe_resume (an earlier attempt was interrupted and may have
	// happened): it asks the downstream, by the key, whether the effect
	// happened (SPEC §15). A definite answer is recorded with
	// Client.Reconcile: "succeeded" returns the found outcome as a replay
	// (Result.Reconciled; fn does not run), "not_applied" reserves again
	// and runs fn. An error leaves ErrUnsafeResume; reconcile_too_early is
	// waited out within ctx.
	Reconcile func(ctx context.Context, key string) (Reconciled, error)
}

// Outcome is what an effect function reports on success.
type Outcome struct {
	ExternalRef string // the downstream reference: charge id, message id, commit sha
	// Result is recorded and returned to every later repeat: a
	// json.RawMessage as is, anything else marshalled. At most 64 KiB.
	Result any
}

// Func runs an effect. It receives the idempotency key to pass
// downstream (an Idempotency-Key header, a client reference). It returns
// an error to record a failure: a *Failure (see Retryable and Permanent)
// says how (NotApplied: it applied nothing); an error wrapping ErrOutcomeUnknown, or a context error, says
// the effect may have happened and records nothing.
type Func func(ctx context.Context, key string) (Outcome, error)

// Result is what Do returns for an effect that succeeded, now or before.
type Result struct {
	Key      string
	Replayed bool // an earlier attempt's recorded result; the function did not run
	// Reconciled is set on a replay of what Effect.Reconcile found: the
	// interrupted attempt's effect happened (SPEC §15).
	Reconciled  bool
	NotRecorded bool // a none or read effect: the function ran without the ledger
	Takeover    bool // this run took over an interrupted idempotent attempt
	Retry       bool // this run retried a retryable failure
	// Renewed is set when the key's earlier outcome had expired (SPEC
	// §12): the function ran as a new effect under the same key.
	Renewed *Renewal
	// AfterNotApplied is set when the key's last outcome was not_applied
	// (SPEC §4.1): the function ran again.
	AfterNotApplied *NotAppliedRef
	// Approval is set when the run consumed an approver's approval (SPEC
	// §13).
	Approval    *ApprovalUse
	Attempt     uint64
	ExternalRef string
	Result      json.RawMessage // the recorded result (nil if none)
	// ResultDropped is set when the function's result could not be
	// recorded (not JSON, or over 64 KiB): the success was recorded
	// without it, and Result is nil.
	ResultDropped bool
	Receipt       ReceiptRef // the commit, or for a replay the replay receipt
	Original      ReceiptRef // for a replay: the receipt of the recorded outcome
	Late          bool       // committed after the lease had ended
	// Erased is set on a replay whose recorded values an erasure removed
	// (SPEC §14): field ("result", "external_ref", …) → the seq of the
	// erase receipt. An erased Result is nil, an erased ExternalRef "".
	Erased map[string]uint64
}

// Do runs the effect e at most once per key across every gateway that
// uses the same ledger:
//
//   - It reserves the key (derived from Tool and Input when e.Key is
//     empty). If an earlier attempt succeeded, Do returns its recorded
//     result with Replayed set, without calling fn.
//   - If another attempt holds the key, Do waits for it — on the server
//     (wait_ms), then by polling with Retry-After — until ctx's deadline
//     (or WithMaxWait without one), and then decides again: replay, retry,
//     takeover, or the error that the ledger answers.
//   - Otherwise it calls fn with the key and commits its outcome: success
//     with ExternalRef and Result, or failure (see Func). The commit is
//     retried with backoff for up to WithCommitTimeout, even after ctx has
//     ended, because the effect has happened.
//
// 503 and 429 answers are retried with jittered backoff honouring
// Retry-After. Errors:
//   - *Error for the ledger's refusals, matching ErrFingerprintMismatch,
//     ErrUnsafeResume (interrupted, not idempotent: a person must resolve
//     it, unless Effect.Reconcile finds the answer), ErrRetryNotAllowed, ErrInProgress (still held when the wait
//     ran out), ErrAttemptConflict, ErrUnauthorized, … with errors.Is;
//   - *ApprovalRequiredError when the namespace's policy sends the call
//     to approval: fn did not run (WithApprovalWait waits for the answer);
//     a rejected call is ErrApprovalRejected (see RejectionOf);
//   - *EffectError when fn failed and the failure was recorded;
//   - *UnknownOutcomeError when fn said the outcome is unknown;
//   - *CommitError when fn ran but its outcome could not be recorded:
//     it carries the key, the reservation token and the outcome, for
//     Client.Commit later.
//
// When fn panics, Do records nothing (the effect may have happened) and
// panics again with a *PanicError carrying the key and reservation; the
// reservation becomes interrupted when its lease ends.
func (c *Client) Do(ctx context.Context, e Effect, fn Func) (*Result, error) {
	req, err := c.prepare(ctx, &e)
	if err != nil {
		return nil, err
	}
	if e.Class == ClassNone || e.Class == ClassRead {
		o, err := fn(ctx, req.Key)
		if err != nil {
			return nil, err
		}
		raw, _ := encodeResult(o.Result)
		return &Result{Key: req.Key, NotRecorded: true, ExternalRef: o.ExternalRef, Result: raw}, nil
	}
	auto := e.Attempt == 0
	rsv, err := c.reserveWaiting(ctx, req, auto)
	var are *ApprovalRequiredError
	if c.approvalWait > 0 && errors.As(err, &are) {
		rsv, err = c.awaitApproval(ctx, are, req, func(ctx context.Context, r *ReserveRequest) (*Reservation, error) {
			return c.reserveWaiting(ctx, r, auto)
		})
	}
	if errors.Is(err, ErrUnsafeResume) && e.Reconcile != nil {
		var res *Result
		if rsv, res, err = c.reconcileUnsafe(ctx, req, auto, e.Reconcile, err); res != nil {
			return res, nil
		}
	}
	if err != nil {
		return nil, err
	}
	if rsv.Status == "replayed" {
		if rsv.ResultEncoding != "" {
			return nil, fmt.Errorf("replay of %s (receipt %d): %w: result_encoding %q; run ledgerctl verify",
				rsv.Key, rsv.Original.Seq, ErrMalformedResult, rsv.ResultEncoding)
		}
		return &Result{Key: rsv.Key, Replayed: true, ExternalRef: rsv.ExternalRef, Result: rsv.Result,
			Receipt: rsv.Receipt, Original: rsv.Original, Erased: rsv.Erased}, nil
	}
	if rsv.Status != "reserved" || rsv.Token == "" {
		return nil, fmt.Errorf("reserve %s: unexpected status %q", req.Key, rsv.Status)
	}
	o, ferr := c.run(ctx, rsv, fn)
	return c.record(ctx, rsv, o, ferr)
}

// prepare validates e and builds its reserve request.
func (c *Client) prepare(ctx context.Context, e *Effect) (*ReserveRequest, error) {
	switch e.Class {
	case ClassNone, ClassRead, ClassWrite, ClassDestructive, ClassExternal:
	default:
		return nil, fmt.Errorf("effect %s: unknown class %q", e.Tool, e.Class)
	}
	if e.Tool == "" {
		return nil, errors.New("effect: empty tool")
	}
	req := &ReserveRequest{Key: e.Key, ExecutionID: e.ExecutionID, Attempt: e.Attempt, Tool: e.Tool,
		Class: e.Class, Idempotent: e.Idempotent, InputHash: e.InputHash, Lease: e.Lease,
		ApprovalSummary: e.ApprovalSummary, Changed: e.Changed, Subjects: e.Subjects}
	if req.Key == "" {
		if e.Input == nil {
			// Every call of the tool would be one effect.
			return nil, fmt.Errorf("effect %s: no Key, and no Input to derive one from", e.Tool)
		}
		k, err := c.deriveKey(ctx, e)
		if err != nil {
			return nil, fmt.Errorf("effect %s: %w", e.Tool, err)
		}
		req.Key = k
	}
	if e.SendInput {
		if e.InputHash != "" || e.Input == nil {
			return nil, fmt.Errorf("effect %s: SendInput needs Input and no InputHash", e.Tool)
		}
		canon, err := canonical(e.Input)
		if err != nil {
			return nil, fmt.Errorf("effect %s: %w", e.Tool, err)
		}
		req.Input = canon
	} else if req.InputHash == "" && e.Input != nil {
		h, err := Fingerprint(e.Input)
		if err != nil {
			return nil, fmt.Errorf("effect %s: %w", e.Tool, err)
		}
		req.InputHash = h
	}
	if req.ExecutionID == "" {
		req.ExecutionID = newExecutionID()
	}
	if req.Attempt == 0 {
		req.Attempt = 1
	}
	return req, nil
}

// deriveKey derives e's key: with the namespace's derivation key for a
// call the ledger records (fetched once; a failure fails the call as an
// unreachable ledger does), as DeriveKey for a none or read call, which
// never asks the ledger.
func (c *Client) deriveKey(ctx context.Context, e *Effect) (string, error) {
	if e.Class == ClassNone || e.Class == ClassRead {
		return DeriveKey(e.Tool, e.Input)
	}
	dk, err := c.DerivationKey(ctx)
	if err != nil {
		return "", err
	}
	return dk.DeriveKey(e.Tool, e.Input)
}

// waitMargin is kept between a server-side wait and the caller's
// deadline, for the decision and the answer to arrive: a quarter of the
// time left, from 250 ms to 2 s.
func waitMargin(left time.Duration) time.Duration {
	return min(max(left/4, 250*time.Millisecond), 2*time.Second)
}

// reserveWaiting reserves req, waiting while another attempt holds the
// key and retrying what the server did not record. With autoAttempt (the
// caller left Attempt unset), an attempt the execution already used is
// replaced by the next one: calling Do again for the same execution is
// then its next runtime retry.
func (c *Client) reserveWaiting(ctx context.Context, req *ReserveRequest, autoAttempt bool) (*Reservation, error) {
	until, ok := ctx.Deadline()
	if !ok {
		until = time.Now().Add(c.maxWait)
	}
	retries := 0
	var busy error // the last in_progress answer
	for {
		req.Wait = c.serverWait(until)
		start := time.Now()
		rsv, err := c.reserveOnce(ctx, req)
		var le *Error
		isLedgerErr := errors.As(err, &le)
		switch {
		case err == nil:
			return rsv, nil
		case busy != nil && isContextErr(err):
			return nil, errors.Join(busy, err) // still in progress when ctx ended
		case errors.Is(err, ErrInProgress):
			busy = err
			left := time.Until(until)
			if left <= 0 {
				return nil, err
			}
			if req.Wait > 0 && time.Since(start) >= req.Wait/2 {
				continue // the server waited: ask again at once
			}
			d := min(le.RetryAfter, c.pollInterval, left)
			if d <= 0 {
				d = min(c.pollInterval, left)
			}
			c.logger.DebugContext(ctx, "ledger: key in progress, polling", "key", req.Key, "after", d)
			if serr := c.sleep(ctx, d); serr != nil {
				return nil, err
			}
		case isLedgerErr && le.Code == string(ErrInvalidRequest.(code)) && le.Details["field"] == "wait_ms" && req.Wait > 0:
			c.noServerWait.Store(true) // a ledger without SPEC §8: poll instead
		case autoAttempt && errors.Is(err, ErrAttemptConflict) && recordedAttempt(le) >= req.Attempt:
			req.Attempt = recordedAttempt(le) + 1
			autoAttempt = false // once: a second conflict is a real one
		case retryable(err) && retries < c.maxRetries:
			if !isLedgerErr && !unsent(err) {
				// The request may have been recorded and its answer lost:
				// the same attempt again would conflict with it, so this
				// is the next attempt. If the lost one did reserve, this
				// one waits for its lease to end.
				req.Attempt++
			}
			if perr := c.pause(ctx, retries, err, "reserve"); perr != nil {
				return nil, perr
			}
			retries++
		default:
			return nil, err
		}
	}
}

// recordedAttempt reads the recorded attempt of an attempt_conflict.
func recordedAttempt(e *Error) uint64 {
	n, _ := e.Details["recorded_attempt"].(float64)
	if n < 1 || n >= 1<<53 {
		return 0
	}
	return uint64(n)
}

// serverWait is the wait_ms for a reserve that should answer by until.
func (c *Client) serverWait(until time.Time) time.Duration {
	if c.noServerWait.Load() {
		return 0
	}
	left := time.Until(until)
	w := min(c.wait, left-waitMargin(left))
	if c.hc.Timeout > 0 {
		w = min(w, c.hc.Timeout-time.Second)
	}
	if w < time.Millisecond {
		return 0
	}
	return w.Truncate(time.Millisecond)
}

// run calls fn, turning a panic into a *PanicError panic.
func (c *Client) run(ctx context.Context, rsv *Reservation, fn Func) (o Outcome, err error) {
	defer func() {
		if v := recover(); v != nil {
			c.logger.ErrorContext(ctx, "ledger: effect panicked; reservation left open", "key", rsv.Key, "panic", fmt.Sprint(v))
			panic(&PanicError{Key: rsv.Key, Reservation: rsv.Token, Value: v, Stack: debug.Stack()})
		}
	}()
	return fn(ctx, rsv.Key)
}

// record commits fn's outcome and builds Do's answer.
func (c *Client) record(ctx context.Context, rsv *Reservation, o Outcome, ferr error) (*Result, error) {
	var f *Failure
	isFailure := errors.As(ferr, &f)
	if ferr != nil && !isFailure && (errors.Is(ferr, ErrOutcomeUnknown) || isContextErr(ferr)) {
		c.logger.WarnContext(ctx, "ledger: effect outcome unknown; reservation left open", "key", rsv.Key, "err", ferr)
		return nil, &UnknownOutcomeError{Key: rsv.Key, Reservation: rsv.Token, Err: ferr}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.commitTimeout)
	defer cancel()
	if ferr != nil {
		cm := Commit{Outcome: "failed", Failure: failureOf(f, ferr)}
		if cm.Failure.NotApplied {
			cm.Outcome = OutcomeNotApplied
		}
		cr, err := c.commitRetry(cctx, rsv.Key, rsv.Token, &cm, 1<<30)
		if err != nil {
			return nil, c.commitFailed(ctx, rsv, cm, err, ferr)
		}
		return nil, &EffectError{Key: rsv.Key, Failure: *cm.Failure, Receipt: cr.Receipt, Err: ferr}
	}
	raw, encErr := encodeResult(o.Result)
	cm := Commit{Outcome: OutcomeSucceeded, ExternalRef: o.ExternalRef, Result: raw}
	cr, err := c.commitRetry(cctx, rsv.Key, rsv.Token, &cm, 1<<30)
	var le *Error
	if err != nil && raw != nil && errors.As(err, &le) && le.Code == string(ErrInvalidRequest.(code)) && le.Details["field"] == "result" {
		encErr, cm.Result = err, nil // too large: record the success without it
		cr, err = c.commitRetry(cctx, rsv.Key, rsv.Token, &cm, 1<<30)
	}
	if err != nil {
		return nil, c.commitFailed(ctx, rsv, cm, err, nil)
	}
	if encErr != nil {
		c.logger.WarnContext(ctx, "ledger: result not recorded", "key", rsv.Key, "err", encErr)
	}
	return &Result{Key: rsv.Key, Takeover: rsv.Takeover, Retry: rsv.Retry, Renewed: rsv.Renewed,
		AfterNotApplied: rsv.AfterNotApplied, Approval: rsv.Approval, Attempt: rsv.Attempt,
		ExternalRef: o.ExternalRef, Result: cm.Result, ResultDropped: encErr != nil,
		Receipt: cr.Receipt, Late: cr.Late}, nil
}

func (c *Client) commitFailed(ctx context.Context, rsv *Reservation, cm Commit, err, ferr error) error {
	c.logger.ErrorContext(ctx, "ledger: effect ran but its outcome was not recorded", "key", rsv.Key,
		"outcome", cm.Outcome, "err", err)
	return &CommitError{Key: rsv.Key, Reservation: rsv.Token, Commit: cm, Err: err, EffectErr: ferr}
}

// encodeResult marshals an outcome's result; nil stays nil.
func encodeResult(v any) (json.RawMessage, error) {
	switch r := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if len(r) == 0 {
			return nil, nil
		}
		if !json.Valid(r) {
			return nil, errors.New("result is not valid JSON")
		}
		return r, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode result: %w", err)
	}
	return b, nil
}

// Limits of a recorded failure (SPEC §4).
const (
	maxErrorCodeLen    = 64
	maxErrorMessageLen = 1024
)

// failureOf is the failure to record for fn's error: f when it is one
// (with a code the ledger accepts), else DefaultFailureCode.
func failureOf(f *Failure, err error) *Failure {
	out := &Failure{Code: DefaultFailureCode, Message: err.Error()}
	if f != nil {
		out.Retryable, out.NotApplied = f.Retryable && !f.NotApplied, f.NotApplied
		if validCode(f.Code) {
			out.Code = f.Code
		}
		switch {
		case f.Message != "":
			out.Message = f.Message
		case f.Err != nil:
			out.Message = f.Err.Error()
		}
	}
	out.Message = truncateRunes(out.Message, maxErrorMessageLen)
	return out
}

func validCode(s string) bool {
	if s == "" || len(s) > maxErrorCodeLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func truncateRunes(s string, n int) string {
	if !utf8.ValidString(s) {
		s = string([]rune(s)) // replaces invalid bytes
	}
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n])
}
