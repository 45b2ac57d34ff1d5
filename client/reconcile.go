package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Reconciled is what a lookup of the downstream found about an
// interrupted effect (SPEC §15): the answer Client.Reconcile records.
type Reconciled struct {
	// Outcome is "succeeded" (the effect happened: ExternalRef is what
	// the lookup found) or "not_applied" (it did not: Failure.Code says
	// why). The ledger refuses any other outcome: an unknown answer is
	// an error of the lookup, and the key waits for a person.
	Outcome     string
	ExternalRef string
	Result      json.RawMessage // any JSON, with "succeeded": what a replay returns
	Failure     *Failure        // required with "not_applied": Code (and Message)
	// Lookup names what was asked (a tool or endpoint) and Answer is its
	// answer, any JSON of at most 16 KiB: the evidence, recorded in the
	// receipt's note.
	Lookup string
	Answer json.RawMessage
}

// Outcomes a commit or a reconcile records (a commit may also record
// "failed").
const (
	OutcomeSucceeded  = "succeeded"
	OutcomeNotApplied = "not_applied"
)

// ReconcileFunc asks the downstream whether the effect of key happened;
// see Effect.Reconcile.
type ReconcileFunc func(ctx context.Context, key string) (Reconciled, error)

// Reconciliation is the answer to a reconcile.
type Reconciliation struct {
	Key     string
	State   string // the key's state now: "succeeded" or "not_applied"
	Receipt ReceiptRef
}

// Reconcile records what a lookup found about the interrupted key (POST
// /v1/effects/{key}/reconcile): the caller must be the actor of the
// interrupted reserve (or an admin), and a rule of the namespace's policy
// must allow it for the tool. Errors: ErrReconcileNotAllowed,
// ErrNotInterrupted, ErrReconcileTooEarly (a not_applied before the
// settle time; RetryAfter says when), ErrUnknownKey, ErrInvalidRequest.
func (c *Client) Reconcile(ctx context.Context, key string, req Reconciled) (*Reconciliation, error) {
	if len(req.Answer) == 0 || req.Lookup == "" {
		return nil, fmt.Errorf("reconcile %s: the evidence, Lookup and Answer, is required", key)
	}
	body := struct {
		Outcome     string          `json:"outcome"`
		ExternalRef string          `json:"external_ref,omitempty"`
		Result      json.RawMessage `json:"result,omitempty"`
		Error       *failureBody    `json:"error,omitempty"`
		Evidence    struct {
			Lookup string          `json:"lookup"`
			Answer json.RawMessage `json:"answer"`
		} `json:"evidence"`
	}{Outcome: req.Outcome, ExternalRef: req.ExternalRef, Result: req.Result}
	body.Evidence.Lookup, body.Evidence.Answer = req.Lookup, req.Answer
	if f := req.Failure; f != nil {
		body.Error = &failureBody{Code: f.Code, Message: f.Message}
	}
	var b struct {
		IdempotencyKey string     `json:"idempotency_key"`
		State          string     `json:"state"`
		Receipt        ReceiptRef `json:"receipt"`
	}
	if _, err := c.exchange(ctx, "reconcile", http.MethodPost, c.route("/v1/effects/"+url.PathEscape(key)+"/reconcile"), body, &b); err != nil {
		return nil, err
	}
	return &Reconciliation{Key: b.IdempotencyKey, State: b.State, Receipt: b.Receipt}, nil
}

// reconcileUnsafe handles an unsafe_resume answer to Do's reserve with
// the effect's lookup (SPEC §15): a definite answer is recorded; a
// success returns as a replay (fn does not run), a not_applied reserves
// again. A failed lookup, or a reconcile the ledger refuses, leaves the
// unsafe_resume error.
func (c *Client) reconcileUnsafe(ctx context.Context, req *ReserveRequest, auto bool, lookup ReconcileFunc,
	unsafe error) (*Reservation, *Result, error) {
	found, rec, err := c.reconcileWaiting(ctx, req.Key, lookup)
	switch {
	case errors.Is(err, errNoAnswer):
		c.logger.WarnContext(ctx, "ledger: lookup found no definite answer; the key waits for a person", "key", req.Key, "err", err)
		return nil, nil, unsafe
	case errors.Is(err, ErrNotInterrupted):
		// Someone ended the key meanwhile: decide again.
	case err != nil:
		return nil, nil, errors.Join(unsafe, fmt.Errorf("reconcile %s: %w", req.Key, err))
	case found.Outcome == OutcomeSucceeded:
		return nil, &Result{Key: req.Key, Replayed: true, Reconciled: true, ExternalRef: found.ExternalRef,
			Result: found.Result, Receipt: rec.Receipt, Original: rec.Receipt}, nil
	}
	rsv, err := c.reserveWaiting(ctx, req, auto)
	return rsv, nil, err
}

// errNoAnswer wraps a lookup's failure: no definite answer.
var errNoAnswer = errors.New("the lookup gave no definite answer")

// reconcileWaiting asks lookup and records its answer. A reconcile_too_early
// (the original call may still land) is waited out within ctx's deadline
// (or WithMaxWait without one), and then the lookup is asked again: an
// answer from before the settle time is never recorded after it. A
// transient failure of the ledger sends the same answer again.
func (c *Client) reconcileWaiting(ctx context.Context, key string, lookup ReconcileFunc) (Reconciled, *Reconciliation, error) {
	until, ok := ctx.Deadline()
	if !ok {
		until = time.Now().Add(c.maxWait)
	}
	found, err := lookup(ctx, key)
	if err != nil {
		return found, nil, fmt.Errorf("%w: %w", errNoAnswer, err)
	}
	for retries := 0; ; {
		rec, err := c.Reconcile(ctx, key, found)
		var le *Error
		switch {
		case err == nil:
			return found, rec, nil
		case errors.Is(err, ErrReconcileTooEarly) && errors.As(err, &le):
			d := max(le.RetryAfter, c.pollInterval/10, time.Millisecond)
			if time.Until(until) < d {
				return found, nil, err // the settle time ends after the caller's deadline
			}
			c.logger.DebugContext(ctx, "ledger: reconcile too early, waiting to ask again", "key", key, "after", d)
			if serr := c.sleep(ctx, d); serr != nil {
				return found, nil, errors.Join(err, serr)
			}
			if found, err = lookup(ctx, key); err != nil {
				return found, nil, fmt.Errorf("%w: %w", errNoAnswer, err)
			}
		case retryable(err) && retries < c.maxRetries:
			if perr := c.pause(ctx, retries, err, "reconcile"); perr != nil {
				return found, nil, perr
			}
			retries++
		default:
			return found, nil, err
		}
	}
}
