package client

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"time"
)

// Class is the class of an effect (SPEC §1).
type Class string

// Effect classes. None and Read are not effects: Do runs them without
// the ledger.
const (
	ClassNone        Class = "none"
	ClassRead        Class = "read"
	ClassWrite       Class = "write"
	ClassDestructive Class = "destructive"
	ClassExternal    Class = "external"
)

// ReceiptRef names a receipt of the chain.
type ReceiptRef struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

// ReserveRequest is one reserve call (POST /v1/effects/reserve).
type ReserveRequest struct {
	Key         string // 8–255 bytes of 0x21–0x7E; shorter or empty: the ledger generates one
	ExecutionID string // required: the invocation of the tool this attempt belongs to
	Attempt     uint64 // runtime retry number within the execution, from 1 (0 means 1)
	Tool        string
	Class       Class
	Idempotent  bool   // the effect dedupes downstream: repeats are safe
	InputHash   string // the input's fingerprint (see Fingerprint); may be empty
	// Input is the call's input as JSON text, sent as "input": the ledger
	// fingerprints it itself, and keeps it off the chain for the approvers
	// when the namespace's policy sends the call to approval (SPEC §13),
	// which needs it. Give Input or InputHash, not both.
	Input json.RawMessage
	// ApprovalSummary is shown to the approver as the requester's account
	// of the call (approval_summary, at most 1024 bytes).
	ApprovalSummary string
	// Changed says what a retry of a failed call changed (SPEC §13: under
	// a repeat_failure rule, a retry must change something).
	Changed *Changed
	// Subjects are opaque ids of the people the effect concerns (a
	// customer, a recipient: never names or addresses themselves), at most
	// 8 of 1–128 bytes, so that an erasure by subject finds the key (SPEC
	// §14). The ledger keeps only their HMACs, never on the chain, fixed
	// by the first reserve of the key's generation.
	Subjects []string
	Lease    time.Duration
	// Wait lets the server hold the request up to this long while another
	// attempt holds the key, or while the call's ask awaits its answer
	// (wait_ms; whole milliseconds, at most 60 s).
	Wait time.Duration
}

// NotAppliedRef names the not_applied outcome a reservation follows.
type NotAppliedRef struct {
	Seq       uint64 `json:"seq"`
	ErrorCode string `json:"error_code"`
}

// Reservation is the answer to a reserve.
type Reservation struct {
	Status       string // "reserved", "replayed" or "not_recorded"
	Key          string
	KeyGenerated bool

	// Status "reserved": the secret token that commits, and its lease.
	Token          string
	Attempt        uint64
	LeaseExpiresAt time.Time
	Takeover       bool // the previous reservation was interrupted and this one takes over
	Retry          bool // the previous attempt failed retryably
	// Renewed is set when the key's earlier outcome had expired (a
	// namespace with a key lifetime, SPEC §12): this reservation starts a
	// new generation of the key, a new effect.
	Renewed *Renewal
	// AfterNotApplied is set when the key's last outcome was not_applied
	// (SPEC §4.1): this reservation runs the effect again.
	AfterNotApplied *NotAppliedRef
	// Approval is set when this reservation consumed an approval (SPEC
	// §13): the approval receipt and the ask it answered.
	Approval *ApprovalUse

	// Status "replayed": the recorded outcome.
	Outcome     string
	ExternalRef string
	Result      json.RawMessage
	// ResultEncoding is set when the stored result is not JSON (an edited
	// ledger file): Result is then a JSON string holding the stored text
	// ("text") or its base64 ("base64").
	ResultEncoding string
	Original       ReceiptRef // the receipt of the recorded outcome
	// Erased names the recorded fields an erasure removed (SPEC §14):
	// field ("result", "external_ref", "error_message", "note") → the seq
	// of the erase receipt. An erased result is nil, an erased
	// external_ref "". Nil when nothing was erased.
	Erased map[string]uint64

	Receipt ReceiptRef // the reserve or replay receipt appended
}

type reserveBody struct {
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	ExecutionID    string          `json:"execution_id"`
	Attempt        uint64          `json:"attempt"`
	Tool           string          `json:"tool"`
	Effect         Class           `json:"effect"`
	Idempotent     bool            `json:"idempotent"`
	InputHash      string          `json:"input_hash,omitempty"`
	Input          json.RawMessage `json:"input,omitempty"`
	Summary        string          `json:"approval_summary,omitempty"`
	Changed        *Changed        `json:"changed,omitempty"`
	Subjects       []string        `json:"subjects,omitempty"`
	LeaseMS        int64           `json:"lease_ms,omitempty"`
	WaitMS         int64           `json:"wait_ms,omitempty"`
}

type reserveReply struct {
	Status         string `json:"status"`
	IdempotencyKey string `json:"idempotency_key"`
	KeyGenerated   bool   `json:"key_generated"`
	Reservation    string `json:"reservation"`
	Attempt        uint64 `json:"attempt"`
	LeaseExpiresAt int64  `json:"lease_expires_at"`
	Takeover       bool   `json:"takeover"`
	Retry          bool   `json:"retry"`
	Renewed        *struct {
		Seq        uint64 `json:"seq"`
		RecordedAt int64  `json:"recorded_at"`
	} `json:"renewed"`
	AfterNotApplied *NotAppliedRef    `json:"after_not_applied"`
	Approval        *approvalReply    `json:"approval"`
	Outcome         string            `json:"outcome"`
	ExternalRef     string            `json:"external_ref"`
	Result          json.RawMessage   `json:"result"`
	ResultEncoding  string            `json:"result_encoding"`
	Original        ReceiptRef        `json:"original"`
	Receipt         ReceiptRef        `json:"receipt"`
	Erased          map[string]uint64 `json:"erased"`
}

// reserveOnce makes one reserve request.
func (c *Client) reserveOnce(ctx context.Context, r *ReserveRequest) (*Reservation, error) {
	attempt := r.Attempt
	if attempt == 0 {
		attempt = 1
	}
	body := reserveBody{IdempotencyKey: r.Key, ExecutionID: r.ExecutionID, Attempt: attempt, Tool: r.Tool,
		Effect: r.Class, Idempotent: r.Idempotent, InputHash: r.InputHash, Input: r.Input,
		Summary: r.ApprovalSummary, Changed: r.Changed, Subjects: r.Subjects,
		LeaseMS: r.Lease.Milliseconds(), WaitMS: r.Wait.Milliseconds()}
	var b reserveReply
	res, err := c.exchange(ctx, "reserve", http.MethodPost, c.route("/v1/effects/reserve"), body, &b)
	if err != nil {
		return nil, err
	}
	if res.status == http.StatusAccepted || b.Status == statusApprovalRequired {
		return nil, approvalRequired(&b, c.base, c.namespace)
	}
	out := &Reservation{Status: b.Status, Key: b.IdempotencyKey, KeyGenerated: b.KeyGenerated,
		Token: b.Reservation, Attempt: b.Attempt, Takeover: b.Takeover, Retry: b.Retry, AfterNotApplied: b.AfterNotApplied,
		Outcome: b.Outcome, ExternalRef: b.ExternalRef, ResultEncoding: b.ResultEncoding,
		Original: b.Original, Receipt: b.Receipt, Erased: b.Erased}
	if b.LeaseExpiresAt > 0 {
		out.LeaseExpiresAt = time.UnixMilli(b.LeaseExpiresAt)
	}
	if b.Approval != nil {
		out.Approval = &ApprovalUse{Seq: b.Approval.Seq, AskSeq: b.Approval.AskSeq}
	}
	if b.Renewed != nil {
		out.Renewed = &Renewal{Seq: b.Renewed.Seq, RecordedAt: time.UnixMilli(b.Renewed.RecordedAt)}
	}
	if len(b.Result) > 0 && string(b.Result) != "null" {
		out.Result = b.Result
	}
	return out, nil
}

// Reserve makes one reserve call, retried on 503, 429 and transport
// errors that happened before the request was sent. Other refusals come
// back as *Error (ErrInProgress when another attempt holds the key even
// after r.Wait; ErrApprovalRejected, ErrDeniedByPolicy, ErrUnchangedRetry
// from the namespace's policy). A call the policy sends to approval is an
// *ApprovalRequiredError; with WithApprovalWait, Reserve first waits for
// the answer and reserves again (see Do).
func (c *Client) Reserve(ctx context.Context, r ReserveRequest) (*Reservation, error) {
	rsv, err := c.reserveRetry(ctx, &r)
	var are *ApprovalRequiredError
	if c.approvalWait <= 0 || !errors.As(err, &are) {
		return rsv, err
	}
	return c.awaitApproval(ctx, are, &r, func(ctx context.Context, r *ReserveRequest) (*Reservation, error) {
		r.Wait = c.serverWaitCtx(ctx)
		return c.reserveRetry(ctx, r)
	})
}

// reserveRetry is one reserve call, retried as Reserve says.
func (c *Client) reserveRetry(ctx context.Context, r *ReserveRequest) (*Reservation, error) {
	for n := 0; ; n++ {
		res, err := c.reserveOnce(ctx, r)
		if err == nil || n >= c.maxRetries || !retryable(err) || !isError(err) && !unsent(err) {
			return res, err
		}
		if err := c.pause(ctx, n, err, "reserve"); err != nil {
			return nil, err
		}
	}
}

func isError(err error) bool {
	var e *Error
	return errors.As(err, &e)
}

// Commit is an outcome to record for a reservation.
type Commit struct {
	Outcome     string          // "succeeded", "failed" or "not_applied" (SPEC §4.1: nothing was applied)
	ExternalRef string          // the downstream reference (charge id, message id); not with "not_applied"
	Result      json.RawMessage // any JSON, at most 64 KiB compacted
	Failure     *Failure        // required with "failed" and "not_applied": Code, Message, Retryable (ignored with "not_applied")
}

// CommitResult is the answer to a commit.
type CommitResult struct {
	Key     string
	Outcome string
	Late    bool // recorded after the lease had ended
	Repeat  bool // the same commit was recorded before; nothing was appended now
	Receipt ReceiptRef
}

type commitBody struct {
	Reservation string          `json:"reservation"`
	Outcome     string          `json:"outcome"`
	ExternalRef string          `json:"external_ref,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
	Error       *failureBody    `json:"error,omitempty"`
}

type failureBody struct {
	Code      string `json:"code"`
	Message   string `json:"message,omitempty"`
	Retryable bool   `json:"retryable"`
}

func (c *Client) commitOnce(ctx context.Context, key, token string, cm *Commit) (*CommitResult, error) {
	body := commitBody{Reservation: token, Outcome: cm.Outcome, ExternalRef: cm.ExternalRef, Result: cm.Result}
	if cm.Failure != nil {
		body.Error = &failureBody{Code: cm.Failure.Code, Message: cm.Failure.Message, Retryable: cm.Failure.Retryable}
	}
	var b struct {
		IdempotencyKey string     `json:"idempotency_key"`
		Outcome        string     `json:"outcome"`
		Late           bool       `json:"late"`
		Receipt        ReceiptRef `json:"receipt"`
	}
	res, err := c.exchange(ctx, "commit", http.MethodPost, c.route("/v1/effects/"+url.PathEscape(key)+"/commit"), body, &b)
	if err != nil {
		return nil, err
	}
	return &CommitResult{Key: b.IdempotencyKey, Outcome: b.Outcome, Late: b.Late, Receipt: b.Receipt,
		Repeat: res.header.Get("Idempotent-Replayed") == "true"}, nil
}

// Commit records the outcome of the reservation token on key. An
// identical commit is idempotent, so Commit retries 503, 429, 502, 504 and
// transport errors with backoff until ctx ends or the retries run out.
// Use it to record an outcome that Do could not (CommitError,
// UnknownOutcomeError, PanicError).
func (c *Client) Commit(ctx context.Context, key, token string, cm Commit) (*CommitResult, error) {
	return c.commitRetry(ctx, key, token, &cm, c.maxRetries)
}

func (c *Client) commitRetry(ctx context.Context, key, token string, cm *Commit, maxRetries int) (*CommitResult, error) {
	for n := 0; ; n++ {
		res, err := c.commitOnce(ctx, key, token, cm)
		if err == nil || n >= maxRetries || !commitRetryable(err) {
			return res, err
		}
		if err := c.pause(ctx, n, err, "commit"); err != nil {
			return nil, err
		}
	}
}

// commitRetryable: a commit may be repeated whenever its answer is
// unknown or the server said nothing was recorded.
func commitRetryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		switch e.Status {
		case http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusBadGateway, http.StatusGatewayTimeout:
			return true
		}
		return false
	}
	return err != nil && !isContextErr(err)
}

// newExecutionID returns a fresh execution id: 128 random bits in 26
// base32 letters and digits.
func newExecutionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics instead)
	return "exec-" + base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:])
}
