package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// This file is the requester's side of approvals (SPEC §13): the 202
// approval_required answer as an error, waiting for the answer, and what
// a reserve says when it consumed one. approver.go is the approver's side.

// statusApprovalRequired is the status of a reserve's 202 answer.
const statusApprovalRequired = "approval_required"

// Changed says what a retry of a failed call changed (the reserve's
// "changed" member). Under a repeat_failure rule, a reserve of the same
// tool and input as a recent failure is refused (ErrUnchangedRetry) unless
// one of these differs from the failed attempt's. Empty members are not
// sent.
type Changed struct {
	ContextHash string `json:"context_hash,omitempty"` // a fingerprint of the context the call was made in
	Component   string `json:"component,omitempty"`    // the component (model, tool version) that changed
	Strategy    string `json:"strategy,omitempty"`     // the approach the retry takes
}

// ApprovalUse names the approval a reservation consumed: the approval
// receipt (the reservation's ref_seq) and the ask it answered.
type ApprovalUse struct {
	Seq    uint64 // the approval receipt
	AskSeq uint64 // the ask it answered
}

// approvalReply is the "approval" member of a reserve's answer: of a 202,
// the ask; of a 201, the approval it consumed.
type approvalReply struct {
	Seq       uint64 `json:"seq"`
	AskSeq    uint64 `json:"ask_seq"`
	ExpiresAt int64  `json:"expires_at"`
	State     string `json:"state"`
}

// ApprovalRequiredError is returned by Reserve and Do when the namespace's
// policy sends the call to a person (202 approval_required): the ledger
// recorded an ask, and nothing ran. An approver answers it (ledgerctl
// approvals approve SEQ, the web page, Client.Answer); the same call made
// again then consumes the approval and runs once, or gets
// ErrApprovalRequired. errors.Is(err, ErrApprovalRequired) holds. Its
// message names the ask, its expiry and the page where a person answers
// it.
type ApprovalRequiredError struct {
	IdempotencyKey string
	Seq            uint64    // the ask's seq: what the approver answers
	ExpiresAt      time.Time // when the ask expires unanswered
	State          string    // "pending"
	// URL is the ledger's web page where a person answers the ask:
	// <base URL>/ui/#approvals/<seq>, as ledger-mcp names it (the page
	// shows the namespace chosen in it).
	URL     string
	Receipt ReceiptRef
	// answer is the ledgerctl command that answers the ask, named in the
	// message beside URL.
	answer string
	// Err says why a wait (WithApprovalWait) ended without an answer:
	// ErrApprovalExpired when the ask expired (Seq is then the new ask
	// if the ledger asked again), the context's error when it ended. It
	// is nil without a wait, or when the wait ran out first.
	Err error
}

func (e *ApprovalRequiredError) Error() string {
	msg := fmt.Sprintf("effect %s awaits approval: ask %d", e.IdempotencyKey, e.Seq)
	if !e.ExpiresAt.IsZero() {
		msg += ", expires " + e.ExpiresAt.UTC().Format(time.RFC3339)
	}
	if e.URL != "" {
		msg += "; a person approves or rejects it at " + e.URL
		if e.answer != "" {
			msg += " (or: " + e.answer + ")"
		}
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrApprovalRequired.
func (e *ApprovalRequiredError) Is(target error) bool { return target == ErrApprovalRequired }

// Unwrap returns why the wait ended, if it did.
func (e *ApprovalRequiredError) Unwrap() error { return e.Err }

// approvalRequired turns a 202 answer of the ledger at base, in
// namespace ns ("" for default), into its error.
func approvalRequired(b *reserveReply, base, ns string) *ApprovalRequiredError {
	e := &ApprovalRequiredError{IdempotencyKey: b.IdempotencyKey, Receipt: b.Receipt}
	if b.Approval != nil {
		e.Seq, e.State = b.Approval.Seq, b.Approval.State
		e.URL = ApprovalPageURL(base, e.Seq)
		e.answer = "ledgerctl approvals approve " + strconv.FormatUint(e.Seq, 10) + " --server " + base
		if ns != "" {
			e.answer += " -n " + ns
		}
		if b.Approval.ExpiresAt > 0 {
			e.ExpiresAt = time.UnixMilli(b.Approval.ExpiresAt)
		}
	}
	return e
}

// ApprovalPageURL is the page of the ledger at base where a person
// answers the ask at seq: base + "/ui/#approvals/" + seq, the URL
// ledger-mcp names to the model.
func ApprovalPageURL(base string, seq uint64) string {
	return strings.TrimSuffix(base, "/") + "/ui/#approvals/" + strconv.FormatUint(seq, 10)
}

// Rejection is what a 409 approval_rejected says about the answer that
// rejected the call.
type Rejection struct {
	Seq    uint64 // the approval receipt (outcome rejected)
	AskSeq uint64
	Note   string
	Actor  string // the approver
}

// RejectionOf returns the rejection an ErrApprovalRejected error carries.
func RejectionOf(err error) (*Rejection, bool) {
	var e *Error
	if !errors.As(err, &e) || e.Code != string(ErrApprovalRejected.(code)) {
		return nil, false
	}
	m, _ := e.Details["approval"].(map[string]any)
	num := func(k string) uint64 {
		n, _ := m[k].(float64)
		if n < 0 || n >= 1<<53 {
			return 0
		}
		return uint64(n)
	}
	note, _ := m["note"].(string)
	actor, _ := m["actor"].(string)
	return &Rejection{Seq: num("seq"), AskSeq: num("ask_seq"), Note: note, Actor: actor}, true
}

// WithApprovalWait makes Reserve and Do wait up to d for the answer to a
// call the namespace's policy sends to approval, instead of returning the
// *ApprovalRequiredError at once (the default, 0). They reserve again,
// letting the ledger hold each request up to the wait of WithWait: an
// approval runs the call once, a rejection is ErrApprovalRejected, and
// an ask that expires, a wait that runs out or ctx's end return the
// *ApprovalRequiredError (see its Err). Every reserve carries wait_ms,
// so even without this option the ledger may hold a call that needs
// approval up to WithWait's wait for a quick answer.
func WithApprovalWait(d time.Duration) Option { return func(c *Client) { c.approvalWait = d } }

// awaitApproval reserves req again with reserve until the ask of are is
// answered, expires, or the approval wait or ctx ends.
func (c *Client) awaitApproval(ctx context.Context, are *ApprovalRequiredError, req *ReserveRequest,
	reserve func(context.Context, *ReserveRequest) (*Reservation, error)) (*Reservation, error) {
	until := time.Now().Add(c.approvalWait)
	if !are.ExpiresAt.IsZero() && are.ExpiresAt.Before(until) {
		until = are.ExpiresAt
	}
	poll := req.Wait == 0 // the ledger did not wait for the answer: poll
	for {
		if poll {
			d := min(c.pollInterval, time.Until(until))
			c.logger.DebugContext(ctx, "ledger: awaiting approval", "key", are.IdempotencyKey, "ask", are.Seq, "after", d)
			if d > 0 && c.sleep(ctx, d) != nil {
				are.Err = ctx.Err()
				return nil, are
			}
		}
		if time.Until(until) <= 0 {
			if !are.ExpiresAt.IsZero() && !time.Now().Before(are.ExpiresAt) {
				are.Err = ErrApprovalExpired
			}
			return nil, are
		}
		wctx, cancel := context.WithDeadline(ctx, until)
		start := time.Now()
		rsv, err := reserve(wctx, req)
		cancel()
		var next *ApprovalRequiredError
		switch {
		case err == nil:
			return rsv, nil
		case ctx.Err() != nil:
			are.Err = ctx.Err()
			return nil, are
		case isContextErr(err):
			poll = false
			continue // the wait's own deadline: decided above
		case !errors.As(err, &next):
			return nil, err
		case next.Seq != are.Seq:
			next.Err = ErrApprovalExpired // the ask expired and the ledger asked again
			return nil, next
		}
		are = next
		poll = req.Wait == 0 || time.Since(start) < req.Wait/2
	}
}

// serverWaitCtx is the wait_ms for a reserve that should answer by ctx's
// deadline (or within WithMaxWait without one).
func (c *Client) serverWaitCtx(ctx context.Context) time.Duration {
	until, ok := ctx.Deadline()
	if !ok {
		until = time.Now().Add(c.maxWait)
	}
	return c.serverWait(until)
}
