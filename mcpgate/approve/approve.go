// Package approve is the MCP gateway's extension for approvals through
// the agent's own client (SPEC §13). A call the namespace's policy sends
// to approval is asked in the ledger (the reserve answers
// approval_required and records an ask). When the rule's approvers list
// mcp-client and the policy allows self-approval, the gateway asks the
// agent's client with a form elicitation (a 2026-07-28 client: an
// input_required round) and relays its answer; a client that takes URL
// elicitations may be sent to the page where a person answers; otherwise
// a person answers at the ledger, and the model is told so. Either way
// the next reserve of the same key by the same actor consumes the
// approval: the gateway reserves again at once after its client approved,
// and the model's next identical call (the same derived key) does after a
// person approved.
//
// The extension keeps its own state (Approvals: the policy as last read,
// and the tools whose asks the ledger did not let the client answer) and
// reaches the core's path through Core, four methods.
package approve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
)

// InputID names the gateway's own elicitation among a 2026-07-28 round's
// inputRequests.
const InputID = "io.effect-ledger/approval"

// Call is what the extension knows of one tools/call.
type Call struct {
	Key        string
	LedgerTool string // <server-name>.<tool>
	Effect     string // its class: write, destructive or external
	Args       json.RawMessage
	// Client is the calling client's name as the ledger records it; it
	// takes form and URL elicitations (MCP 2025-11-25) as it declared.
	Client                string
	ElicitForm, ElicitURL bool
	// Session is the client's session, nil when there is none; Stateless
	// is a 2026-07-28 request, asked with a round instead of a request.
	Session   *mcp.ServerSession
	Stateless bool
}

// Core is the gateway's path as the extension sees one call.
type Core interface {
	// Reserve makes the call's reserve again, with its wait (wait_ms: for
	// a person's answer) or without.
	Reserve(ctx context.Context, wait bool) (*ledgerport.Reservation, error)
	// Decide goes on with the ledger's answer to a reserve; why says why
	// the client's answer did not settle it.
	Decide(ctx context.Context, rsv *ledgerport.Reservation, err error, why string) (mcp.Result, error)
	// Person tells the model that a person must answer the ask.
	Person(rsv *ledgerport.Reservation) mcp.Result
	// Round answers a 2026-07-28 call with an input_required round that
	// asks the client form (as InputID) and whose requestState names the ask.
	Round(rsv *ledgerport.Reservation, form *mcp.ElicitParams) (mcp.Result, error)
}

// Approvals is the extension's state: the namespace's policy as last
// read, and the tools whose asks the ledger did not let the client answer.
type Approvals struct {
	port   ledgerport.Port
	page   string        // Config.ApprovalURL
	wait   time.Duration // Config.Wait
	logger *slog.Logger

	mu      sync.Mutex
	p       *ledger.Policy // nil: it could not be read
	at      time.Time
	refused map[string]time.Time // ledger tool → until when its client is not asked
}

// New returns the extension over port. page is the web page where a
// person answers an ask ({seq} replaced with its seq, else #approvals/<seq>
// appended; "" for none), wait the reserves' wait for an answer.
func New(port ledgerport.Port, page string, wait time.Duration, logger *slog.Logger) *Approvals {
	return &Approvals{port: port, page: page, wait: wait, logger: logger, refused: map[string]time.Time{}}
}

// policyTTL is how long the gateway uses the ledger's policy it read
// before deciding whether a call's client may answer its ask (an ask
// reads it again).
const policyTTL = 5 * time.Second

// refusedFor is how long the client is not asked again for a tool whose
// ask the ledger did not let it answer, when the policy is unknown.
const refusedFor = 5 * time.Minute

// policy returns the namespace's policy in force, read again when older
// than policyTTL or when fresh, or nil when it cannot be read (a ledgerd
// before contract v1.3, or a token limited to other namespaces): the
// ledger then decides whether the client's answer counts.
func (a *Approvals) policy(ctx context.Context, fresh bool) *ledger.Policy {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !fresh && !a.at.IsZero() && time.Since(a.at) < policyTTL {
		return a.p
	}
	p, err := a.port.Policy(ctx)
	if err != nil && (a.at.IsZero() || a.p != nil) {
		a.logger.InfoContext(ctx, "the ledger's policy cannot be read: a call that needs approval asks a client that can answer, "+
			"and the ledger decides whether its answer counts", "err", err)
	}
	if err != nil {
		p = nil
	}
	a.p, a.at = p, time.Now()
	return p
}

// clientRefused reports whether the ledger lately refused the client's
// answer for tool.
func (a *Approvals) clientRefused(tool string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return time.Now().Before(a.refused[tool])
}

// refuseClient remembers that the ledger refused the client's answer for
// tool.
func (a *Approvals) refuseClient(tool string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refused[tool] = time.Now().Add(refusedFor)
}

// notClients reports whether err is the ledger refusing an answer of the
// agent's client by the policy: the rule does not list mcp-client, or
// self-approval is denied.
func notClients(err error) bool {
	var r *ledgerport.Refusal
	if errors.As(err, &r) {
		return r.Code == ledger.ECodeForbidden || r.Code == ledger.ECodeSelfApproval
	}
	var e *client.Error
	return errors.As(err, &e) && (e.Code == ledger.ECodeForbidden || e.Code == ledger.ECodeSelfApproval)
}

// clientApproves reports whether the call's own client may answer its
// ask: the policy's gate for the tool requires approval, lists
// mcp-client and allows self-approval, and the client takes form
// elicitations. When the policy cannot be read, a client that can answer
// is asked, unless the ledger lately refused its answer for the tool.
func (a *Approvals) clientApproves(ctx context.Context, c Call, fresh bool) bool {
	if !c.ElicitForm || !c.Stateless && c.Session == nil {
		return false
	}
	p := a.policy(ctx, fresh)
	if p == nil {
		return !a.clientRefused(c.LedgerTool)
	}
	gate := p.GateFor(c.LedgerTool, c.Effect)
	if !gate.Approval || !gate.SelfApproval {
		return false
	}
	for _, ap := range gate.Approvers {
		if ap == ledger.ApproverMCPClient {
			return true
		}
	}
	return false
}

// Reserve makes a call's first reserve r. A call its client may approve
// does not wait (wait_ms) for the answer in the ledger, which would keep
// the client from being asked: it waits only for a duplicate in flight,
// and, sent to a person, waits for the answer after all (Required; unwaited
// says so).
func (a *Approvals) Reserve(ctx context.Context, c Call, r client.ReserveRequest) (rsv *ledgerport.Reservation, unwaited bool, err error) {
	if r.Wait > 0 && (a.clientApproves(ctx, c, false) || a.pageable(c)) {
		r.Wait = 0
		rsv, err := a.port.Reserve(ctx, r)
		var refusal *ledgerport.Refusal
		if !errors.As(err, &refusal) || refusal.Code != ledger.ECodeInProgress {
			return rsv, err == nil && rsv.Status == ledger.StatusApprovalRequired, err
		}
		r.Wait = a.wait
	}
	rsv, err = a.port.Reserve(ctx, r)
	return rsv, false, err
}

// Required answers a call the ledger sent to approval: its client is
// asked when it may answer, else the model is told that a person must.
// unwaited is Reserve's.
func (a *Approvals) Required(ctx context.Context, c Call, core Core, rsv *ledgerport.Reservation, unwaited bool) (mcp.Result, error) {
	a.logger.InfoContext(ctx, "call awaits approval", "tool", c.LedgerTool, "key", rsv.Key, "ask", rsv.Ask.Seq)
	if !a.clientApproves(ctx, c, true) {
		if a.sendToPage(ctx, c, rsv) || unwaited {
			// The user went to the page, or a person answers: the same
			// reserve again waits (--wait) for the person's answer, and
			// consumes it.
			next, err := core.Reserve(ctx, true)
			return core.Decide(ctx, next, err, "")
		}
		return core.Person(rsv), nil
	}
	if c.Stateless {
		return core.Round(rsv, a.form(c, rsv))
	}
	res, err := c.Session.Elicit(ctx, a.form(c, rsv))
	return a.answered(ctx, c, core, rsv, res, err)
}

// Answered continues a 2026-07-28 call whose last round asked the client
// to approve it (ask): the client's answer among responses is relayed,
// and the call decided again.
func (a *Approvals) Answered(ctx context.Context, c Call, core Core, ask uint64, responses mcp.InputResponseMap) (mcp.Result, error) {
	res, _ := responses[InputID].(*mcp.ElicitResult)
	var err error
	if res == nil {
		err = errors.New("the client's answer to the approval is missing")
	}
	return a.answered(ctx, c, core, &ledgerport.Reservation{Reservation: client.Reservation{Key: c.Key}, Ask: &ledgerport.Ask{Seq: ask}}, res, err)
}

// pageable reports whether the call's client can be sent to the
// approval page (a URL elicitation in its session) when one is known: its
// first reserve then does not wait, so that the user is sent there at once.
func (a *Approvals) pageable(c Call) bool {
	return c.ElicitURL && a.page != "" && c.Session != nil && !c.Stateless
}

// sendToPage sends the user to the page where a person answers the ask,
// with a URL elicitation (SPEC §13), when the call's client takes them and
// the page is known; it reports whether the user accepted to go there.
// Clients of 2026-07-28 are told the URL in the answer instead.
func (a *Approvals) sendToPage(ctx context.Context, c Call, rsv *ledgerport.Reservation) bool {
	url := a.URL(rsv.Ask.Seq)
	if !a.pageable(c) || url == "" {
		return false
	}
	msg := fmt.Sprintf("The call %s needs a person's approval before it runs (approval request %d). Open the page to "+
		"approve or reject it; the call goes on once it is approved.", c.LedgerTool, rsv.Ask.Seq)
	res, err := c.Session.Elicit(ctx, &mcp.ElicitParams{Mode: "url", Message: msg, URL: url,
		ElicitationID: "effect-ledger-approval-" + strconv.FormatUint(rsv.Ask.Seq, 10)})
	if err != nil {
		a.logger.InfoContext(ctx, "the client did not take the approval page", "ask", rsv.Ask.Seq, "err", err)
		return false
	}
	return res.Action == "accept"
}

// form is the form the client shows its user.
func (a *Approvals) form(c Call, rsv *ledgerport.Reservation) *mcp.ElicitParams {
	msg := fmt.Sprintf("Approve this tool call? %s with arguments %s\n\n"+
		"Accept runs it once; decline rejects it for good (recorded in the effect ledger as approved or rejected by %s). "+
		"Approval request %d, expires %s.", c.LedgerTool, summarize(c.Args, 600), c.Client,
		rsv.Ask.Seq, rsv.Ask.ExpiresAt.Format(time.RFC3339))
	schema := map[string]any{"type": "object", "properties": map[string]any{
		"note": map[string]any{"type": "string", "title": "Note", "description": "recorded with your answer (optional)"}}}
	return &mcp.ElicitParams{Mode: "form", Message: msg, RequestedSchema: schema}
}

// summarize is the compact JSON of args, cut to about n bytes.
func summarize(args json.RawMessage, n int) string {
	var b bytes.Buffer
	s := string(args)
	if json.Compact(&b, args) == nil {
		s = b.String()
	}
	if len(s) > n {
		return ledgerport.Truncate(s, n) + "…"
	}
	return s
}

// answered relays the client's answer to an ask and decides the call
// again: accept approves (the reserve then consumes the approval and the
// call runs), decline rejects (approval_rejected), cancel records nothing
// and leaves the ask to a person.
func (a *Approvals) answered(ctx context.Context, c Call, core Core, rsv *ledgerport.Reservation, res *mcp.ElicitResult, err error) (mcp.Result, error) {
	var why string
	wait := false // for a person's answer
	switch {
	case err != nil:
		a.logger.WarnContext(ctx, "the client could not be asked for approval", "tool", c.LedgerTool, "key", rsv.Key,
			"ask", rsv.Ask.Seq, "err", err)
		why = fmt.Sprintf("The client could not be asked to approve it (%v).", err)
	case res.Action != "accept" && res.Action != "decline":
		a.logger.InfoContext(ctx, "the client dismissed the approval", "tool", c.LedgerTool, "key", rsv.Key, "ask", rsv.Ask.Seq)
		why = "The user dismissed the question without answering, so nothing was recorded."
	default:
		why, wait = a.relay(ctx, c, rsv, res)
	}
	// The same reserve again: it consumes an approval, is refused after a
	// rejection, or names the pending ask (after waiting for a person's
	// answer, when only a person may give it).
	next, err := core.Reserve(ctx, wait)
	return core.Decide(ctx, next, err, why)
}

// relay records the client's accept or decline of the ask; why says why
// it did not count, wait that a person's answer is to be waited for.
func (a *Approvals) relay(ctx context.Context, c Call, rsv *ledgerport.Reservation, res *mcp.ElicitResult) (why string, wait bool) {
	decision := ledger.DecisionApprove
	if res.Action == "decline" {
		decision = ledger.DecisionReject
	}
	note, _ := res.Content["note"].(string)
	aerr := a.port.AnswerAsClient(ctx, rsv.Ask.Seq, decision, c.Client, ledgerport.Truncate(note, ledger.MaxNoteLen))
	switch {
	case notClients(aerr):
		// The policy does not let the client answer (one the gateway
		// could not read, or one changed since): a person must.
		a.refuseClient(c.LedgerTool)
		a.logger.InfoContext(ctx, "the client's answer does not count: a person must approve", "tool", c.LedgerTool,
			"key", rsv.Key, "ask", rsv.Ask.Seq, "err", aerr)
		return "The answer given through this client does not count for this tool (the ledger's policy wants a person), so it was not recorded.", true
	case aerr != nil:
		// A person answered first, the ask expired, the ledger is
		// unavailable: the reserve after it says what stands.
		a.logger.WarnContext(ctx, "the client's answer was not recorded", "tool", c.LedgerTool, "key", rsv.Key,
			"ask", rsv.Ask.Seq, "decision", decision, "err", aerr)
		return "The client's answer could not be recorded.", false
	}
	a.logger.InfoContext(ctx, "the client answered the approval", "tool", c.LedgerTool, "key", rsv.Key,
		"ask", rsv.Ask.Seq, "decision", decision, "client", c.Client)
	return "", false
}

// PersonText tells the model that a person must approve the call first:
// the ask, when it expires, where a person answers it, and that the same
// call made again then runs once; meta is what the answer's _meta names
// of the ask. why goes first.
func (a *Approvals) PersonText(rsv *ledgerport.Reservation, why string) (text string, meta map[string]any) {
	ask := rsv.Ask
	where := "at the effect ledger (ledgerctl approvals approve --server URL " + strconv.FormatUint(ask.Seq, 10) + ", or its web page)"
	url := a.URL(ask.Seq)
	if url != "" {
		where = "at " + url
	}
	expires := ""
	if !ask.ExpiresAt.IsZero() {
		expires = ", which expires " + ask.ExpiresAt.Format(time.RFC3339)
	}
	if why != "" {
		why += " "
	}
	text = fmt.Sprintf("%sThis call needs a person's approval before it runs, so it was NOT run: it awaits approval request %d%s. "+
		"Tell the user to approve or reject it %s. Once it is approved, make exactly the same call again (the same tool "+
		"and arguments): it then runs once. If it is rejected, it will not run. (Idempotency key %s.)",
		why, ask.Seq, expires, where, rsv.Key)
	meta = map[string]any{"seq": ask.Seq}
	if !ask.ExpiresAt.IsZero() {
		meta["expires_at"] = ask.ExpiresAt.Format(time.RFC3339Nano)
	}
	if url != "" {
		meta["url"] = url
	}
	return text, meta
}

// URL is the page where a person answers the ask at seq: the configured
// page with {seq} replaced, or with #approvals/<seq> appended when it has
// no {seq}; "" when none is known.
func (a *Approvals) URL(seq uint64) string {
	if a.page == "" {
		return ""
	}
	s := strconv.FormatUint(seq, 10)
	if strings.Contains(a.page, "{seq}") {
		return strings.ReplaceAll(a.page, "{seq}", s)
	}
	return a.page + "#approvals/" + s
}
