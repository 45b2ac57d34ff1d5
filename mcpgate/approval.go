package mcpgate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
)

// Approvals on the MCP path (SPEC §13): a call the namespace's policy
// sends to approval is asked in the ledger (the reserve answers
// approval_required and records an ask). When the rule's approvers list
// mcp-client and the policy allows self-approval, the gateway asks the
// agent's own client with a form elicitation and relays its answer;
// otherwise a person answers at the ledger, and the model is told so.
// Either way the next reserve of the same key by the same actor consumes
// the approval: the gateway reserves again at once after its client
// approved, and the model's next identical call (the same derived key)
// does after a person approved.

// MetaApproval is the _meta member of an approval_required answer: the
// ask's seq, expiry and the page where a person answers it.
const MetaApproval = "io.effect-ledger/approval"

// approvalInputID names the gateway's own elicitation among a 2026-07-28
// round's inputRequests.
const approvalInputID = "io.effect-ledger/approval"

// policyTTL is how long the gateway uses the ledger's policy it read
// before deciding whether a call's client may answer its ask (an ask
// reads it again).
const policyTTL = 5 * time.Second

// policyCache is the namespace's policy as last read, and the tools
// whose asks the ledger did not let the client answer.
type policyCache struct {
	mu      sync.Mutex
	p       *ledger.Policy // nil: it could not be read
	at      time.Time
	refused map[string]time.Time // ledger tool → until when its client is not asked
}

// policy returns the namespace's policy in force, read again when older
// than policyTTL or when fresh, or nil when it cannot be read (a ledgerd
// before contract v1.3, or a token limited to other namespaces): the
// ledger then decides whether the client's answer counts.
func (g *Gateway) policy(ctx context.Context, fresh bool) *ledger.Policy {
	g.pol.mu.Lock()
	defer g.pol.mu.Unlock()
	if !fresh && !g.pol.at.IsZero() && time.Since(g.pol.at) < policyTTL {
		return g.pol.p
	}
	p, err := g.port.Policy(ctx)
	if err != nil && (g.pol.at.IsZero() || g.pol.p != nil) {
		g.logger.InfoContext(ctx, "the ledger's policy cannot be read: a call that needs approval asks a client that can answer, "+
			"and the ledger decides whether its answer counts", "err", err)
	}
	if err != nil {
		p = nil
	}
	g.pol.p, g.pol.at = p, time.Now()
	return p
}

// refusedFor is how long the client is not asked again for a tool whose
// ask the ledger did not let it answer, when the policy is unknown.
const refusedFor = 5 * time.Minute

// clientRefused reports whether the ledger lately refused the client's
// answer for tool.
func (g *Gateway) clientRefused(tool string) bool {
	g.pol.mu.Lock()
	defer g.pol.mu.Unlock()
	return time.Now().Before(g.pol.refused[tool])
}

// refuseClient remembers that the ledger refused the client's answer for
// tool.
func (g *Gateway) refuseClient(tool string) {
	g.pol.mu.Lock()
	defer g.pol.mu.Unlock()
	if g.pol.refused == nil {
		g.pol.refused = map[string]time.Time{}
	}
	g.pol.refused[tool] = time.Now().Add(refusedFor)
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

// caller is what the gateway knows of the client that made a call.
type caller struct {
	name       string // clientInfo.name, as the ledger records it
	elicitForm bool   // it takes form elicitations
	elicitURL  bool   // it takes URL elicitations (MCP 2025-11-25)
	// caps: a 2026-07-28 client's capabilities, from its request's _meta
	// (for a parked call, park.go).
	caps *mcp.ClientCapabilities
}

// describeCaller reads the calling client's name and whether it takes
// form elicitations: from a 2026-07-28 request's _meta, else from its
// session's initialize. It runs before describeClient rewrites _meta.
func describeCaller(req mcp.Request, version string) caller {
	var name string
	var caps map[string]any
	if statelessRevision(version) {
		if p := req.GetParams(); p != nil {
			meta := p.GetMeta()
			name = jsonField(meta[mcp.MetaKeyClientInfo], "name")
			caps, _ = asMap(meta[mcp.MetaKeyClientCapabilities])
		}
	} else if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss.InitializeParams() != nil {
		ip := ss.InitializeParams()
		if ip.ClientInfo != nil {
			name = ip.ClientInfo.Name
		}
		caps = wireCapabilities(ip.Capabilities)
	}
	c := caller{name: clientName(name)}
	if statelessRevision(version) {
		c.caps = wireClientCapabilities(caps)
	}
	if e, ok := asMap(caps["elicitation"]); ok {
		_, form := e["form"]
		_, url := e["url"]
		c.elicitForm = form || !url // an empty elicitation capability is form's
		c.elicitURL = url
	}
	return c
}

// asMap reads a JSON object decoded into any (or a struct, through JSON).
func asMap(v any) (map[string]any, bool) {
	if m, ok := v.(map[string]any); ok {
		return m, true
	}
	if v == nil {
		return nil, false
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	var m map[string]any
	return m, json.Unmarshal(b, &m) == nil && m != nil
}

// jsonField is the string member name of a JSON object v.
func jsonField(v any, name string) string {
	m, _ := asMap(v)
	s, _ := m[name].(string)
	return s
}

// clientName is a client's name as the ledger takes it in an actor: 1–128
// visible ASCII bytes, others replaced with '_'; "unknown" for none.
func clientName(name string) string {
	b := []byte(name)
	for i := range b {
		if b[i] < 0x21 || b[i] > 0x7E {
			b[i] = '_'
		}
	}
	if len(b) > 128 {
		b = b[:128]
	}
	if len(b) == 0 {
		return "unknown"
	}
	return string(b)
}

// clientApproves reports whether the call's own client may answer its
// ask: the policy's gate for the tool requires approval, lists
// mcp-client and allows self-approval, and the client takes form
// elicitations. When the policy cannot be read, a client that can answer
// is asked, unless the ledger lately refused its answer for the tool.
func (g *Gateway) clientApproves(ctx context.Context, c *call, fresh bool) bool {
	if !c.caller.elicitForm || !statelessRevision(c.version) && c.session == nil {
		return false
	}
	p := g.policy(ctx, fresh)
	if p == nil {
		return !g.clientRefused(c.ledgerTool)
	}
	gate := p.GateFor(c.ledgerTool, c.class.Effect)
	if !gate.Approval || !gate.SelfApproval {
		return false
	}
	for _, a := range gate.Approvers {
		if a == ledger.ApproverMCPClient {
			return true
		}
	}
	return false
}

// reserveCall makes a call's first reserve. A call its client may
// approve does not wait (wait_ms) for the answer in the ledger, which
// would keep the client from being asked: it waits only for a duplicate
// in flight, and, sent to a person, waits for the answer after all
// (approvalRequired).
func (g *Gateway) reserveCall(ctx context.Context, c *call, key string) (*ledgerport.Reservation, error) {
	r := g.reserveOf(c, key)
	if r.Wait > 0 && (g.clientApproves(ctx, c, false) || g.pageable(c)) {
		r.Wait = 0
		rsv, err := g.port.Reserve(ctx, r)
		var refusal *ledgerport.Refusal
		if !errors.As(err, &refusal) || refusal.Code != ledger.ECodeInProgress {
			c.unwaited = err == nil && rsv.Status == ledger.StatusApprovalRequired
			return rsv, err
		}
		r.Wait = g.cfg.Wait
	}
	return g.port.Reserve(ctx, r)
}

// approvalRequired answers a call the ledger sent to approval: its client
// is asked when it may answer, else the model is told that a person
// must.
func (g *Gateway) approvalRequired(ctx context.Context, s *mcp.ClientSession, c *call, rsv *ledgerport.Reservation) (mcp.Result, error) {
	g.logger.InfoContext(ctx, "call awaits approval", "tool", c.ledgerTool, "key", rsv.Key, "ask", rsv.Ask.Seq)
	if !g.clientApproves(ctx, c, true) {
		if g.sendToPage(ctx, c, rsv) {
			// The user went to the page: wait (--wait) for the person's
			// answer, which the same reserve then consumes.
			next, err := g.port.Reserve(ctx, g.reserveOf(c, rsv.Key))
			return g.decided(ctx, s, c, rsv.Key, next, err, "")
		}
		if c.unwaited {
			// A person answers: the same reserve again waits for it.
			next, err := g.port.Reserve(ctx, g.reserveOf(c, rsv.Key))
			return g.decided(ctx, s, c, rsv.Key, next, err, "")
		}
		callsTotal.WithLabelValues(c.toolLabel, DecisionRefused).Inc()
		return g.personAnswer(rsv, ""), nil
	}
	if statelessRevision(c.version) {
		callsTotal.WithLabelValues(c.toolLabel, DecisionRefused).Inc()
		return g.approvalRound(c, rsv)
	}
	res, err := c.session.Elicit(ctx, approvalElicit(c, rsv))
	return g.clientAnswered(ctx, s, c, rsv, res, err)
}

// pageable reports whether the call's client can be sent to the
// approval page (a URL elicitation in its session) when one is known: its
// first reserve then does not wait, so that the user is sent there at once.
func (g *Gateway) pageable(c *call) bool {
	return c.caller.elicitURL && g.cfg.ApprovalURL != "" && c.session != nil && !statelessRevision(c.version)
}

// sendToPage sends the user to the page where a person answers the ask,
// with a URL elicitation (SPEC §13), when the call's client takes them and
// the page is known; it reports whether the user accepted to go there.
// Clients of 2026-07-28 are told the URL in the answer instead.
func (g *Gateway) sendToPage(ctx context.Context, c *call, rsv *ledgerport.Reservation) bool {
	url := g.approvalURL(rsv.Ask.Seq)
	if !g.pageable(c) || url == "" {
		return false
	}
	msg := fmt.Sprintf("The call %s needs a person's approval before it runs (approval request %d). Open the page to "+
		"approve or reject it; the call goes on once it is approved.", c.ledgerTool, rsv.Ask.Seq)
	res, err := c.session.Elicit(ctx, &mcp.ElicitParams{Mode: "url", Message: msg, URL: url,
		ElicitationID: "effect-ledger-approval-" + strconv.FormatUint(rsv.Ask.Seq, 10)})
	if err != nil {
		g.logger.InfoContext(ctx, "the client did not take the approval page", "ask", rsv.Ask.Seq, "err", err)
		return false
	}
	return res.Action == "accept"
}

// approvalElicit is the form the client shows its user.
func approvalElicit(c *call, rsv *ledgerport.Reservation) *mcp.ElicitParams {
	msg := fmt.Sprintf("Approve this tool call? %s with arguments %s\n\n"+
		"Accept runs it once; decline rejects it for good (recorded in the effect ledger as approved or rejected by %s). "+
		"Approval request %d, expires %s.", c.ledgerTool, summarize(c.args, 600), c.caller.name,
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
		return truncate(s, n) + "…"
	}
	return s
}

// approvalRound asks a 2026-07-28 client with an input_required round: a
// form elicitation and an envelope naming the ask, which the client's
// next round brings back with its answer (clientRound).
func (g *Gateway) approvalRound(c *call, rsv *ledgerport.Reservation) (mcp.Result, error) {
	key, err := g.stateKey()
	if err != nil {
		return nil, err
	}
	state, err := seal(key, envelope{Key: rsv.Key, Exec: c.exec, Attempt: c.attempt, Tool: c.ledgerTool,
		Input: c.hash, Ask: rsv.Ask.Seq, Exp: time.Now().Add(maxEnvelopeAge).UnixMilli()})
	if err != nil {
		return nil, err
	}
	res := &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{approvalInputID: approvalElicit(c, rsv)},
		RequestState: state}
	b, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("encode the approval round: %w", err)
	}
	b, err = withMembers(b, map[string]any{"resultType": "input_required", "content": nil})
	if err != nil {
		return nil, fmt.Errorf("encode the approval round: %w", err)
	}
	return rawCall{res, b}, nil
}

// clientRound continues a 2026-07-28 call whose last round asked the
// client to approve it: the answer is relayed, and the call decided
// again.
func (g *Gateway) clientRound(ctx context.Context, s *mcp.ClientSession, c *call, key string, ask uint64) (mcp.Result, error) {
	res, _ := c.inputResponses[approvalInputID].(*mcp.ElicitResult)
	c.upInput, c.upState = nil, "" // the upstream never saw this call
	var err error
	if res == nil {
		err = errors.New("the client's answer to the approval is missing")
	}
	return g.clientAnswered(ctx, s, c, &ledgerport.Reservation{Key: key, Ask: &ledgerport.Ask{Seq: ask}}, res, err)
}

// clientAnswered relays the client's answer to an ask and decides the
// call again: accept approves (the reserve then consumes the approval and
// the call runs), decline rejects (approval_rejected), cancel records
// nothing and leaves the ask to a person.
func (g *Gateway) clientAnswered(ctx context.Context, s *mcp.ClientSession, c *call, rsv *ledgerport.Reservation, res *mcp.ElicitResult, err error) (mcp.Result, error) {
	var why string
	wait := false // for a person's answer
	switch {
	case err != nil:
		g.logger.WarnContext(ctx, "the client could not be asked for approval", "tool", c.ledgerTool, "key", rsv.Key,
			"ask", rsv.Ask.Seq, "err", err)
		why = fmt.Sprintf("The client could not be asked to approve it (%v).", err)
	case res.Action != "accept" && res.Action != "decline":
		g.logger.InfoContext(ctx, "the client dismissed the approval", "tool", c.ledgerTool, "key", rsv.Key, "ask", rsv.Ask.Seq)
		why = "The user dismissed the question without answering, so nothing was recorded."
	default:
		decision := ledger.DecisionApprove
		if res.Action == "decline" {
			decision = ledger.DecisionReject
		}
		note, _ := res.Content["note"].(string)
		aerr := g.port.AnswerAsClient(ctx, rsv.Ask.Seq, decision, c.caller.name, truncate(note, ledger.MaxNoteLen))
		switch {
		case notClients(aerr):
			// The policy does not let the client answer (one the gateway
			// could not read, or one changed since): a person must.
			g.refuseClient(c.ledgerTool)
			wait = true
			g.logger.InfoContext(ctx, "the client's answer does not count: a person must approve", "tool", c.ledgerTool,
				"key", rsv.Key, "ask", rsv.Ask.Seq, "err", aerr)
			why = "The answer given through this client does not count for this tool (the ledger's policy wants a person), so it was not recorded."
		case aerr != nil:
			// A person answered first, the ask expired, the ledger is
			// unavailable: the reserve below says what stands.
			g.logger.WarnContext(ctx, "the client's answer was not recorded", "tool", c.ledgerTool, "key", rsv.Key,
				"ask", rsv.Ask.Seq, "decision", decision, "err", aerr)
			why = "The client's answer could not be recorded."
		default:
			g.logger.InfoContext(ctx, "the client answered the approval", "tool", c.ledgerTool, "key", rsv.Key,
				"ask", rsv.Ask.Seq, "decision", decision, "client", c.caller.name)
		}
	}
	// The same reserve again: it consumes an approval, is refused after a
	// rejection, or names the pending ask (after waiting for a person's
	// answer, when only a person may give it).
	r := g.reserveOf(c, rsv.Key)
	if !wait {
		r.Wait = 0
	}
	next, err := g.port.Reserve(ctx, r)
	return g.decided(ctx, s, c, rsv.Key, next, err, why)
}

// personAnswer tells the model that a person must approve the call
// first: the ask, when it expires, where a person answers it, and that
// the same call made again then runs once.
func (g *Gateway) personAnswer(rsv *ledgerport.Reservation, why string) *mcp.CallToolResult {
	ask := rsv.Ask
	where := "at the effect ledger (ledgerctl approvals approve --server URL " + strconv.FormatUint(ask.Seq, 10) + ", or its web page)"
	url := g.approvalURL(ask.Seq)
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
	text := fmt.Sprintf("%sThis call needs a person's approval before it runs, so it was NOT run: it awaits approval request %d%s. "+
		"Tell the user to approve or reject it %s. Once it is approved, make exactly the same call again (the same tool "+
		"and arguments): it then runs once. If it is rejected, it will not run. (Idempotency key %s.)",
		why, ask.Seq, expires, where, rsv.Key)
	res := answer(ledger.StatusApprovalRequired, rsv.Key, text)
	meta := map[string]any{"seq": ask.Seq}
	if !ask.ExpiresAt.IsZero() {
		meta["expires_at"] = ask.ExpiresAt.Format(time.RFC3339Nano)
	}
	if url != "" {
		meta["url"] = url
	}
	res.Meta[MetaApproval] = meta
	return res
}

// approvalURL is the page where a person answers the ask at seq: the
// configured URL with {seq} replaced, or with #approvals/<seq> appended
// when it has no {seq}; "" when none is known.
func (g *Gateway) approvalURL(seq uint64) string {
	u := g.cfg.ApprovalURL
	if u == "" {
		return ""
	}
	s := strconv.FormatUint(seq, 10)
	if strings.Contains(u, "{seq}") {
		return strings.ReplaceAll(u, "{seq}", s)
	}
	return u + "#approvals/" + s
}
