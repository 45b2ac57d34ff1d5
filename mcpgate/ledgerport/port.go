// Package ledgerport is the MCP gateway's one port to the effect ledger:
// the Ledger interface in the Go client's terms (a *client.Client is a
// ledgerd's port as it is, NewLocal a ledger's in this process), and Port,
// the calls the gateway's path makes through it: a reserve read as the
// Reservation the gateway decides on, a commit, the words of a replay,
// the policy, a client's answer to an ask.
package ledgerport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Ledger is the gateway's port to the effect ledger, in the Go client's
// terms: a *client.Client is the port to a ledgerd (--ledger), and
// NewLocal is the port to a ledger in this process (embedded.go). Only
// the methods the gateway's path needs: a reserve that may wait for an
// in-flight reservation of the same key (SPEC §8) or answer
// *client.ApprovalRequiredError (SPEC §13), a commit, a key's receipts
// for the words of a replay, the namespace's policy, the answer of the
// agent's own MCP client to an ask, a lookup's finding about an
// interrupted key (SPEC §15), and the namespace's derivation key for the
// keys of calls that name none (SPEC §14; the client asks the ledger
// once and keeps it).
//
// Refusals of the contract are *client.Error with their code; anything
// else means nothing was recorded (Error sorts them).
type Ledger interface {
	Reserve(ctx context.Context, r client.ReserveRequest) (*client.Reservation, error)
	Commit(ctx context.Context, key, token string, c client.Commit) (*client.CommitResult, error)
	Key(ctx context.Context, key string, history bool) (*client.KeyView, error)
	Policy(ctx context.Context) (*client.PolicyState, error)
	AnswerAsMCPClient(ctx context.Context, seq uint64, d client.Decision, clientName, note string) (*client.Approval, error)
	Reconcile(ctx context.Context, key string, r client.Reconciled) (*client.Reconciliation, error)
	DerivationKey(ctx context.Context) (*client.DerivationKey, error)
}

// The client satisfies the port as it is.
var _ Ledger = (*client.Client)(nil)

// Reservation is what the gateway decides on: the ledger's answer to a
// reserve as the client gives it (StatusReserved, StatusReplayed), or,
// for a call the policy sends to approval, StatusApprovalRequired with
// the pending ask (SPEC §13) and its receipt.
type Reservation struct {
	client.Reservation
	Ask *Ask
}

// Ask names an ask that awaits an approver's answer.
type Ask struct {
	Seq       uint64
	ExpiresAt time.Time
}

// Record is what a replay tells of the receipt of a key's outcome.
type Record struct {
	At      time.Time // when it was recorded (zero: unknown)
	Expires time.Time // when the key is forgotten (zero: never)
	Kind    string    // commit, resolve (a person's decision) or reconcile (a lookup's finding)
	// Of a resolve: who decided, their note, and the external_ref given.
	Actor, Note, ExternalRef string
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

// Name is o's outcome as the ledger names it.
func (o Outcome) Name() string {
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

// MaxFailureMessage bounds a recorded error message (SPEC §4: ≤ 1024).
const MaxFailureMessage = 1024

// DefaultTimeout bounds each request to a remote ledger, beyond a
// reserve's wait (ledger-mcp's --ledger-timeout).
const DefaultTimeout = 10 * time.Second

// Port makes the gateway's calls to the ledger.
type Port struct {
	Ledger Ledger
	// Timeout bounds each request, a reserve's beyond its wait; 0: none
	// (an embedded ledger answers or fails on its own).
	Timeout time.Duration
	Logger  *slog.Logger
}

// bounded is ctx bounded by the Timeout beyond extra (none
// without a timeout): a ledger that does not answer makes the call
// ledger_unavailable, and an answer that comes later is not waited for,
// so no effect runs after the caller was told it did not.
func (p Port) bounded(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	if p.Timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, extra+p.Timeout)
}

// Reserve asks the ledger for the right to run one round of a call. A
// call sent to approval is a Reservation naming its ask; a refusal of
// the contract is a *Refusal; any other error wraps ErrUnavailable.
func (p Port) Reserve(ctx context.Context, r client.ReserveRequest) (*Reservation, error) {
	ctx, cancel := p.bounded(ctx, r.Wait)
	defer cancel()
	res, err := p.Ledger.Reserve(ctx, r)
	var are *client.ApprovalRequiredError
	if errors.As(err, &are) {
		rsv := client.Reservation{Status: ledger.StatusApprovalRequired, Key: are.IdempotencyKey, Receipt: are.Receipt}
		return &Reservation{Reservation: rsv, Ask: &Ask{Seq: are.Seq, ExpiresAt: are.ExpiresAt.UTC()}}, nil
	}
	if err != nil {
		return nil, Error("reserve", err)
	}
	return &Reservation{Reservation: *res}, nil
}

// CommitTimeout bounds recording an outcome once the upstream answered,
// however the caller's request ends.
const CommitTimeout = 30 * time.Second

// Commit records an outcome, however ctx ends (a cancellation, a client
// gone: the effect may have happened either way), within CommitTimeout.
// A success whose result the ledger refuses (it checks more than the
// gateway can) is recorded with a note in its place, so the success is on
// the chain all the same.
func (p Port) Commit(ctx context.Context, rsv *Reservation, o Outcome) error {
	ctx, detach := context.WithTimeout(context.WithoutCancel(ctx), CommitTimeout)
	defer detach()
	for noted := false; ; noted = true {
		cm := client.Commit{Outcome: o.Name(), Result: o.Result}
		if !o.Succeeded {
			cm.Failure = &client.Failure{Code: o.ErrorCode, Message: o.ErrorMessage}
		}
		bctx, cancel := p.bounded(ctx, 0)
		_, err := p.Ledger.Commit(bctx, rsv.Key, rsv.Token, cm)
		cancel()
		err = Error("commit", err)
		var refusal *Refusal
		if noted || !o.Succeeded || !errors.As(err, &refusal) || refusal.Code != ledger.ECodeInvalidRequest {
			return err
		}
		p.logger().WarnContext(ctx, "result refused by the ledger: a note is recorded in its place", "key", rsv.Key, "err", err)
		o.Result = ResultNote(fmt.Sprintf("The call succeeded; the ledger refused to record its result (%s), so it is not replayed.", refusal.Message))
	}
}

// Recorded tells of key's receipt seq (when it was recorded, its kind,
// and a resolve's actor, note and external_ref) and when the key expires,
// for the words of a replay.
func (p Port) Recorded(ctx context.Context, key string, seq uint64) (Record, error) {
	ctx, cancel := p.bounded(ctx, 0)
	defer cancel()
	v, err := p.Ledger.Key(ctx, key, true)
	if err != nil {
		return Record{}, Error("read key", err)
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

// Policy is the namespace's policy in force.
func (p Port) Policy(ctx context.Context) (*ledger.Policy, error) {
	ctx, cancel := p.bounded(ctx, 0)
	defer cancel()
	st, err := p.Ledger.Policy(ctx)
	if err != nil {
		return nil, Error("read the policy", err)
	}
	pol, err := ledger.ParsePolicy(st.Policy)
	if err != nil {
		return nil, fmt.Errorf("read the policy: %w", err)
	}
	return pol, nil
}

// DerivationKey is what the namespace derives the keys of calls with
// (SPEC §14): its payload mode in force and its fingerprint key.
func (p Port) DerivationKey(ctx context.Context) (*client.DerivationKey, error) {
	ctx, cancel := p.bounded(ctx, 0)
	defer cancel()
	dk, err := p.Ledger.DerivationKey(ctx)
	if err != nil {
		return nil, Error("read the derivation key", err)
	}
	return dk, nil
}

// AnswerAsClient records the answer of the agent's own MCP client to an
// ask (a self-approval the ledger accepts only from the gateway that
// asked).
func (p Port) AnswerAsClient(ctx context.Context, seq uint64, decision, clientName, note string) error {
	ctx, cancel := p.bounded(ctx, 0)
	defer cancel()
	_, err := p.Ledger.AnswerAsMCPClient(ctx, seq, client.Decision(decision), clientName, note)
	return Error("answer", err)
}

// Error sorts the port's errors: the ledger's refusals keep their
// code (a *Refusal); transport errors, 5xx answers, rate limits and auth
// failures mean nothing was recorded (ErrUnavailable). A 403 is a refusal
// of the contract when its code is one of the gate's (denied_by_policy,
// self_approval), an auth failure otherwise.
func Error(op string, err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	var e *client.Error
	if errors.As(err, &e) && e.Status < http.StatusInternalServerError && e.Status != http.StatusTooManyRequests &&
		e.Status != http.StatusUnauthorized && (e.Status != http.StatusForbidden || e.Code == ledger.ECodeDeniedByPolicy ||
		e.Code == ledger.ECodeSelfApproval) {
		return &Refusal{Code: e.Code, Message: e.Message, Details: e.Details}
	}
	return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
}

// ResultNote is a recorded result that says why the call's own result is
// not recorded.
func ResultNote(text string) json.RawMessage {
	b, _ := json.Marshal(&mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}})
	return b
}

func (p Port) logger() *slog.Logger {
	if p.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Logger
}

// Truncate cuts s to at most n bytes on a rune boundary: a text the
// ledger bounds (an error message, a note, a summary).
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// Reconcile records what a lookup found about the interrupted key (SPEC
// §15), within the timeout and however ctx ends, as a commit is: a
// refusal of the contract is a *Refusal (reconcile_too_early among them,
// NotBefore says until when), any other error wraps ErrUnavailable.
func (p Port) Reconcile(ctx context.Context, key string, r client.Reconciled) error {
	ctx, detach := context.WithTimeout(context.WithoutCancel(ctx), CommitTimeout)
	defer detach()
	ctx, cancel := p.bounded(ctx, 0)
	defer cancel()
	_, err := p.Ledger.Reconcile(ctx, key, r)
	return Error("reconcile", err)
}

// NotBefore is when the settle time of a reconcile_too_early has passed
// (its details.not_before, unix ms; zero: unknown).
func (r *Refusal) NotBefore() time.Time {
	var ms float64
	switch v := r.Details["not_before"].(type) {
	case float64:
		ms = v
	case uint64:
		ms = float64(v)
	case json.Number:
		ms, _ = v.Float64()
	}
	if ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(int64(ms))
}
