package mcpgate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Ledger is what the gateway needs of the effect ledger: a reserve that
// may wait for an in-flight reservation of the same key (SPEC §8), and a
// commit. NewLocal serves it from a ledger in this process and NewRemote
// from a ledgerd over its REST API, so both take one decision path.
//
// Reserve returns a *Refusal for the contract's refusals
// (fingerprint_mismatch, in_progress, unsafe_resume, retry_not_allowed,
// invalid_key, …) and an error wrapping ErrUnavailable when the ledger
// cannot be reached or written. Commit returns the same kinds of errors.
//
// Recorded tells of a key's receipt seq (when it was recorded, its kind,
// and a resolve's actor, note and external_ref) and when the key expires
// (zero if it does not), for the words of a replay.
//
// A reserve the namespace's policy sends to approval (SPEC §13) is a
// Reservation with Status ledger.StatusApprovalRequired naming the ask.
// Policy returns the namespace's policy in force, and AnswerAsClient
// records the answer of the agent's own MCP client to an ask (a
// self-approval the ledger accepts only from the gateway that asked).
type Ledger interface {
	Reserve(ctx context.Context, r Reserve) (*Reservation, error)
	Commit(ctx context.Context, key, token string, o Outcome) error
	Recorded(ctx context.Context, key string, seq uint64) (Record, error)
	Policy(ctx context.Context) (*ledger.Policy, error)
	AnswerAsClient(ctx context.Context, seq uint64, decision, clientName, note string) error
}

// Reserve asks for the right to run one tool call.
type Reserve struct {
	Key         string
	ExecutionID string
	// Attempt is the round of the execution (0 means 1): the rounds of
	// one MCP call are one execution with rising attempts (SPEC §11.1).
	Attempt    uint64
	Tool       string // the ledger's tool name, <server-name>.<tool>
	Class      string // write, destructive or external
	Idempotent bool
	InputHash  string // fingerprint of the call's arguments
	// Input is the call's arguments, sent instead of InputHash when set:
	// the ledger fingerprints them itself (the same RFC 8785 SHA-256) and
	// keeps them off the chain for the approver of an ask (SPEC §13).
	Input json.RawMessage
	// Summary is shown to the approver of an ask as the requester's claim.
	Summary string
	Lease   time.Duration
	Wait    time.Duration // wait_ms: how long to wait for an in-flight reservation
}

// Reservation is the ledger's answer to a Reserve.
type Reservation struct {
	Status   string // ledger.StatusReserved, ledger.StatusReplayed or ledger.StatusApprovalRequired
	Key      string
	Token    string // StatusReserved: the reservation that commits
	Takeover bool
	Retry    bool
	// StatusReplayed: the recorded result, the receipt of the outcome it
	// came from, and the replay receipt appended.
	Result   json.RawMessage
	Original Receipt
	Receipt  Receipt
	// StatusApprovalRequired: the pending ask (SPEC §13).
	Ask *Ask
	// StatusReserved: the approval this reservation consumed, if any.
	Approval *ApprovalUse
}

// Ask names an ask that awaits an approver's answer.
type Ask struct {
	Seq       uint64
	ExpiresAt time.Time
}

// ApprovalUse names the approval a reservation consumed and its ask.
type ApprovalUse struct {
	Seq    uint64 `json:"seq"`
	AskSeq uint64 `json:"ask_seq"`
}

// Record is what a replay tells of the receipt of a key's outcome.
type Record struct {
	At      time.Time // when it was recorded (zero: unknown)
	Expires time.Time // when the key is forgotten (zero: never)
	Kind    string    // commit, or resolve: a person's decision
	// Of a resolve: who decided, their note, and the external_ref given.
	Actor, Note, ExternalRef string
}

// Receipt names a receipt of the chain, as the gateway's _meta shows it.
type Receipt struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

// Outcome is what a forwarded call came to.
type Outcome struct {
	Succeeded bool
	Result    json.RawMessage
	// NotApplied records a failure that left nothing behind (SPEC §4.1):
	// the same call may run again.
	NotApplied   bool
	ErrorCode    string // failed or not applied: TOOL_ERROR, MCP_ERROR, INPUT_REQUIRED, …
	ErrorMessage string
}

// outcomeName is o's outcome as the ledger names it.
func (o Outcome) outcomeName() string {
	switch {
	case o.Succeeded:
		return "succeeded"
	case o.NotApplied:
		return "not_applied"
	}
	return "failed"
}

// Refusal is a refusal of the ledger with the contract's code.
type Refusal struct {
	Code    string
	Message string
	Details map[string]any
}

func (r *Refusal) Error() string { return fmt.Sprintf("ledger: %s: %s", r.Code, r.Message) }

// ErrUnavailable means the ledger cannot be reached or cannot be written:
// nothing was recorded, so no effect may run.
var ErrUnavailable = errors.New("the effect ledger is unavailable")

// maxFailureMessage bounds a recorded error message (SPEC §4: ≤ 1024).
const maxFailureMessage = 1024

// local is a Ledger in this process.
type local struct{ ns *ledger.Namespace }

// NewLocal returns a Ledger over one namespace of an in-process ledger,
// the same service the REST API calls.
func NewLocal(ns *ledger.Namespace) Ledger { return local{ns: ns} }

func (l local) Reserve(ctx context.Context, r Reserve) (*Reservation, error) {
	lease, wait, attempt := r.Lease.Milliseconds(), r.Wait.Milliseconds(), int64(max(r.Attempt, 1))
	req := ledger.ReserveRequest{IdempotencyKey: r.Key, ExecutionID: r.ExecutionID, Attempt: &attempt,
		Tool: r.Tool, Effect: r.Class, Idempotent: r.Idempotent, InputHash: r.InputHash, LeaseMS: &lease, WaitMS: &wait,
		ApprovalSummary: r.Summary}
	if len(r.Input) > 0 {
		req.Input, req.InputHash = r.Input, ""
	}
	res, err := l.ns.Reserve(ctx, req)
	if err != nil {
		return nil, localError("reserve", err)
	}
	out := &Reservation{Status: res.Status, Key: res.IdempotencyKey, Token: res.Reservation,
		Takeover: res.Takeover, Retry: res.Retry,
		Original: Receipt{Seq: res.Original.Seq, Hash: res.Original.Hash.String()},
		Receipt:  Receipt{Seq: res.Receipt.Seq, Hash: res.Receipt.Hash.String()}}
	if res.Result != "" {
		out.Result = json.RawMessage(res.Result)
	}
	if res.Ask != nil {
		out.Ask = &Ask{Seq: res.Ask.Seq, ExpiresAt: time.UnixMilli(int64(res.Ask.ExpiresAt)).UTC()}
	}
	if res.Approval != nil {
		out.Approval = &ApprovalUse{Seq: res.Approval.Seq, AskSeq: res.Approval.AskSeq}
	}
	return out, nil
}

func (l local) Policy(ctx context.Context) (*ledger.Policy, error) {
	p, _, err := l.ns.Policy(ctx)
	if err != nil {
		return nil, localError("read the policy", err)
	}
	return p, nil
}

// AnswerAsClient records the client's answer in-process: the embedded
// ledger has no tokens, so the asker's actor is empty and the answer's
// is "/mcp-client:<name>".
func (l local) AnswerAsClient(ctx context.Context, seq uint64, decision, clientName, note string) error {
	_, _, err := l.ns.Answer(ctx, ledger.AnswerRequest{Seq: seq, Decision: decision, Note: note, MCPClient: clientName})
	return localError("answer", err)
}

func (l local) Commit(ctx context.Context, key, token string, o Outcome) error {
	req := ledger.CommitRequest{IdempotencyKey: key, Reservation: token, Outcome: o.outcomeName(), Result: o.Result}
	if !o.Succeeded {
		req.Error = &ledger.FailureDetail{Code: o.ErrorCode, Message: o.ErrorMessage}
	}
	_, err := l.ns.Commit(ctx, req)
	return localError("commit", err)
}

func (l local) Recorded(ctx context.Context, key string, seq uint64) (Record, error) {
	v, err := l.ns.Key(ctx, key, true)
	if err != nil {
		return Record{}, localError("read key", err)
	}
	var rec Record
	for i := range v.Receipts {
		if r := &v.Receipts[i]; r.Seq == seq {
			rec = Record{At: time.UnixMilli(int64(r.RecordedAt)).UTC(), Kind: r.Kind, Actor: r.Actor, Note: r.Note,
				ExternalRef: r.ExternalRef}
		}
	}
	if v.ExpiresAt != 0 {
		rec.Expires = time.UnixMilli(int64(v.ExpiresAt)).UTC()
	}
	return rec, nil
}

// localError turns the domain's errors into the gateway's: contract
// refusals keep their code, everything else means the ledger cannot be
// written.
func localError(op string, err error) error {
	if err == nil {
		return nil
	}
	var e *ledger.Error
	if errors.As(err, &e) && e.Code != ledger.ECodeUnavailable && e.Code != ledger.ECodeInternal {
		return &Refusal{Code: e.Code, Message: e.Message, Details: e.Details}
	}
	return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
}

// remote is a Ledger behind a ledgerd.
type remote struct {
	c       *client.Client
	timeout time.Duration
}

// DefaultLedgerTimeout bounds each request to a remote ledger, beyond a
// reserve's wait.
const DefaultLedgerTimeout = 10 * time.Second

// NewRemote returns a Ledger over a ledgerd reached with c. Each request
// gets timeout (DefaultLedgerTimeout if 0), a reserve its wait on top: a
// ledgerd that does not answer makes the call ledger_unavailable, and an
// answer that comes later is not waited for, so no effect runs after the
// caller was told it did not.
func NewRemote(c *client.Client, timeout time.Duration) Ledger {
	if timeout <= 0 {
		timeout = DefaultLedgerTimeout
	}
	return remote{c: c, timeout: timeout}
}

func (r remote) Reserve(ctx context.Context, q Reserve) (*Reservation, error) {
	ctx, cancel := context.WithTimeout(ctx, q.Wait+r.timeout)
	defer cancel()
	req := client.ReserveRequest{Key: q.Key, ExecutionID: q.ExecutionID, Attempt: max(q.Attempt, 1),
		Tool: q.Tool, Class: client.Class(q.Class), Idempotent: q.Idempotent, InputHash: q.InputHash,
		ApprovalSummary: q.Summary, Lease: q.Lease, Wait: q.Wait}
	if len(q.Input) > 0 {
		req.Input, req.InputHash = q.Input, ""
	}
	res, err := r.c.Reserve(ctx, req)
	var are *client.ApprovalRequiredError
	if errors.As(err, &are) {
		return &Reservation{Status: ledger.StatusApprovalRequired, Key: are.IdempotencyKey,
			Ask:     &Ask{Seq: are.Seq, ExpiresAt: are.ExpiresAt.UTC()},
			Receipt: Receipt{Seq: are.Receipt.Seq, Hash: are.Receipt.Hash}}, nil
	}
	if err != nil {
		return nil, remoteError("reserve", err)
	}
	out := &Reservation{Status: res.Status, Key: res.Key, Token: res.Token, Takeover: res.Takeover,
		Retry: res.Retry, Result: res.Result, Original: Receipt{Seq: res.Original.Seq, Hash: res.Original.Hash},
		Receipt: Receipt{Seq: res.Receipt.Seq, Hash: res.Receipt.Hash}}
	if res.Approval != nil {
		out.Approval = &ApprovalUse{Seq: res.Approval.Seq, AskSeq: res.Approval.AskSeq}
	}
	return out, nil
}

func (r remote) Policy(ctx context.Context) (*ledger.Policy, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	st, err := r.c.Policy(ctx)
	if err != nil {
		return nil, remoteError("read the policy", err)
	}
	p, err := ledger.ParsePolicy(st.Policy)
	if err != nil {
		return nil, fmt.Errorf("read the policy: %w", err)
	}
	return p, nil
}

// AnswerAsClient relays the client's answer with the gateway's own token
// (POST …/approvals/{seq}/mcp-client).
func (r remote) AnswerAsClient(ctx context.Context, seq uint64, decision, clientName, note string) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	_, err := r.c.AnswerAsMCPClient(ctx, seq, client.Decision(decision), clientName, note)
	return remoteError("answer", err)
}

func (r remote) Commit(ctx context.Context, key, token string, o Outcome) error {
	cm := client.Commit{Outcome: o.outcomeName(), Result: o.Result}
	if !o.Succeeded {
		cm.Failure = &client.Failure{Code: o.ErrorCode, Message: o.ErrorMessage}
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	_, err := r.c.Commit(ctx, key, token, cm)
	return remoteError("commit", err)
}

func (r remote) Recorded(ctx context.Context, key string, seq uint64) (Record, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	v, err := r.c.Key(ctx, key, true)
	if err != nil {
		return Record{}, remoteError("read key", err)
	}
	rec := Record{Expires: v.ExpiresAt}
	for _, rc := range v.Receipts {
		if rc.Seq == seq {
			var more struct{ Actor, Note string }
			_ = json.Unmarshal(rc.JSON, &more)
			rec.At, rec.Kind, rec.ExternalRef = time.UnixMilli(rc.RecordedAt).UTC(), rc.Kind, rc.ExternalRef
			rec.Actor, rec.Note = more.Actor, more.Note
		}
	}
	return rec, nil
}

// remoteError: the ledgerd's refusals keep their code; transport errors,
// 5xx answers, rate limits and auth failures mean nothing was recorded.
// A 403 is a refusal of the contract when its code is one of the gate's
// (denied_by_policy, self_approval), an auth failure otherwise.
func remoteError(op string, err error) error {
	if err == nil {
		return nil
	}
	var e *client.Error
	if errors.As(err, &e) && e.Status < http.StatusInternalServerError && e.Status != http.StatusTooManyRequests &&
		e.Status != http.StatusUnauthorized && (e.Status != http.StatusForbidden || e.Code == ledger.ECodeDeniedByPolicy ||
		e.Code == ledger.ECodeSelfApproval) {
		return &Refusal{Code: e.Code, Message: e.Message, Details: e.Details}
	}
	return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
}
