package mcpgate

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/rounds"
	"github.com/effect-ledger/effect-ledger/mcpgate/serverreq"
	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// Failure codes a forwarded call is committed with (SPEC §11).
const (
	CodeToolError = "TOOL_ERROR" // the tool answered isError: true
	CodeMCPError  = "MCP_ERROR"  // the server answered with a JSON-RPC error
	// CodeUpstreamUnavailable: not_applied, the call could not be sent to
	// the upstream (its connection had failed).
	CodeUpstreamUnavailable = "UPSTREAM_UNAVAILABLE"
)

// request is one tools/call as the client sent it, classified: made once
// by callTool and never changed, it is what the core decides on.
type request struct {
	name       string // the upstream's tool name
	ledgerTool string // <server-name>.<tool>, LedgerToolName
	toolLabel  string // the metrics label
	args       json.RawMessage
	meta       mcp.Meta // as the client sent it
	// metaSubjects are the client's _meta subjects (subjects.go).
	metaSubjects []string
	session      *mcp.ServerSession
	version      string // the client's protocol revision
	caller       caller // the client that made the call (caller.go)
	class        Class
	// lease: a task-augmented call's is its task's ttl (tasks.Lease).
	lease time.Duration
	// A round of a multi round-trip call (SPEC §11.1): the client's
	// answers to the last round's inputRequests and its requestState (the
	// gateway's envelope, for a recorded call).
	inputResponses mcp.InputResponseMap
	state          string
}

// call is a request on its way: the round sent upstream, and what the
// extensions that take part in it keep of it.
type call struct {
	request
	// The round sent upstream (SPEC §11.1): the answers and the upstream's
	// own requestState; of a reserved call, its execution and attempt
	// (what the next round's envelope names) and its fingerprint.
	upInput mcp.InputResponseMap
	upState string
	key     string // the idempotency key of a recorded call, sent upstream in _meta
	exec    string
	attempt uint64
	hash    string
	// subjects: the reserve's, the rule's and the client's (subjects.go).
	subjects []string
	up       *mcp.ClientSession // the upstream session the call went to
	// On a session of its own upstream (package serverreq): where the
	// upstream's requests during the call go.
	peer  *serverreq.Peer
	route *serverreq.Route
	// ask is the ask a 2026-07-28 round asked the client to answer
	// (approvals.go).
	ask uint64
	// parked: a 2026-07-28 client's call to an older upstream, whose
	// requests become rounds (park.go); park is its parked call.
	parked bool
	park   *rounds.Parked
	// rsv is the reservation a round runs under, reserved at reservedAt
	// (at most: the first time execute saw it).
	rsv        *ledgerport.Reservation
	reservedAt time.Time
}

// callTool decides one tools/call (SPEC §11): reads are forwarded,
// effects are reserved first and forwarded only on a new reservation.
func (g *Gateway) callTool(ctx context.Context, req mcp.Request, p *mcp.CallToolParamsRaw, version string) (mcp.Result, error) {
	who := describeCaller(req, version) // before DescribeClient rewrites _meta
	if err := g.peers.DescribeClient(ctx, req); err != nil {
		return nil, err
	}
	r := request{name: p.Name, ledgerTool: LedgerToolName(g.cfg.ServerName, p.Name), args: p.Arguments, meta: p.Meta,
		toolLabel: unlistedToolLabel, inputResponses: p.InputResponses, state: p.RequestState, version: version,
		lease: tasks.Lease(p.Meta, g.cfg.Lease), caller: who}
	r.session, _ = req.GetSession().(*mcp.ServerSession)
	subjects, err := metaSubjects(r.meta)
	if err != nil {
		return nil, err
	}
	r.metaSubjects = subjects
	if len(r.args) == 0 || string(r.args) == "null" {
		r.args = json.RawMessage("{}") // what MCP clients send for a call without arguments
	}
	s, peer, err := g.toolSession(ctx, r.session, version)
	if err != nil {
		g.logger.WarnContext(ctx, "upstream unavailable", "tool", r.name, "err", err)
		return nil, err
	}
	tool, err := g.tools.Lookup(ctx, s, r.name)
	if err != nil {
		return nil, fmt.Errorf("list the upstream's tools: %w", err)
	}
	var ann *mcp.ToolAnnotations
	if tool != nil {
		ann, r.toolLabel = tool.Annotations, r.ledgerTool
	}
	r.class = Classify(g.cfg.Policy, r.name, r.ledgerTool, ann)
	c := &call{request: r, upInput: r.inputResponses, peer: peer, parked: g.parks(ctx, version)}
	if c.peer != nil {
		// The call's own upstream session: what the upstream asks on it
		// is this call's (package serverreq).
		var done func()
		if s, c.route, done, err = c.peer.Acquire(ctx); err != nil {
			g.logger.WarnContext(ctx, "upstream unavailable", "tool", c.name, "err", err)
			return nil, err
		}
		defer done()
	}
	c.up = s
	if !c.class.Recorded() {
		callsTotal.WithLabelValues(c.toolLabel, DecisionPassed).Inc()
		c.upState = c.state // a read's rounds are the upstream's alone
		return g.forwardCall(ctx, s, c)
	}
	return g.guarded(ctx, s, c)
}

// toolSession is the upstream session whose tools a call of session ss
// sees: the shared one, or the client's own (package serverreq), with its peer.
func (g *Gateway) toolSession(ctx context.Context, ss *mcp.ServerSession, version string) (*mcp.ClientSession, *serverreq.Peer, error) {
	s, err := g.up.Session(ctx)
	if err != nil || !g.peers.UsesPeer(ss, version) {
		return s, nil, err
	}
	// The client's own upstream session, whose tools are the ones offered
	// to a client with its capabilities.
	p := g.peers.Of(ss)
	s, err = p.Session(ctx)
	return s, p, err
}

// guarded runs an effect through the ledger.
func (g *Gateway) guarded(ctx context.Context, s *mcp.ClientSession, c *call) (mcp.Result, error) {
	ctx = ledgerport.WithTraceContext(ctx, c.meta)
	key, err := explicitKey(c.meta)
	if err == nil && key == "" {
		// The namespace's derivation key: the remote port asks the ledger
		// once and keeps it. Without it no key, and no effect runs.
		dk, derr := g.port.DerivationKey(ctx)
		if derr != nil {
			return g.decided(ctx, s, c, "", nil, derr, "")
		}
		key, err = DeriveKey(dk, c.ledgerTool, c.args, g.scopeOf(c.session))
	}
	if err != nil {
		callsTotal.WithLabelValues(c.toolLabel, DecisionRefused).Inc()
		return answer(ledger.ECodeInvalidKey, "", fmt.Sprintf("This call was not run: %v.", err)), nil
	}
	hash, err := client.Fingerprint(c.args)
	if err != nil {
		return nil, fmt.Errorf("fingerprint arguments: %w", err)
	}
	c.key, c.exec, c.attempt, c.hash = key, executionOf(g.runOf(c)), 1, hash
	if c.subjects, err = g.subjectsOf(ctx, c, key); err != nil {
		callsTotal.WithLabelValues(c.toolLabel, DecisionRefused).Inc()
		return nil, err
	}
	if c.state != "" {
		if err := g.continueRound(c, key); err != nil {
			if !errors.Is(err, rounds.ErrEnvelope) {
				return nil, err
			}
			g.logger.WarnContext(ctx, "call refused: requestState", "tool", c.ledgerTool, "key", key, "err", err)
			callsTotal.WithLabelValues(c.toolLabel, DecisionRefused).Inc()
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
		}
	}
	if reply := g.runningAnswer(ctx, c, key); reply != nil {
		return reply, nil // a repeat while the call's task runs
	}
	ac, core := approval(c, key), approvalCore{g, s, c, key}
	if c.ask != 0 {
		c.upInput, c.upState = nil, "" // the upstream never saw this call
		return g.approvals.Answered(ctx, ac, core, c.ask, c.inputResponses)
	}
	if p, gone := g.heldRound(c, key); p != nil {
		// The execution's reservation, held by its parked call since the
		// upstream had an answer (park.go): this round runs under it, as
		// the attempt that reserved it.
		c.attempt--
		held, heldAt := p.Held()
		c.park, c.reservedAt = p, heldAt
		return g.execute(ctx, s, c, held)
	} else if gone {
		callsTotal.WithLabelValues(c.toolLabel, DecisionUnknown).Inc()
		return heldGoneAnswer(key), nil
	}
	rsv, unwaited, err := g.approvals.Reserve(ctx, ac, g.reserveOf(c, key))
	if reply, again := g.reconcileUnknown(ctx, s, c, key, err); reply != nil {
		callsTotal.WithLabelValues(c.toolLabel, DecisionRefused).Inc()
		return reply, nil
	} else if again {
		// The lookup's finding is on the chain: the ledger decides the
		// call again, a replay of the reconciled outcome or a reserve.
		rsv, unwaited, err = g.approvals.Reserve(ctx, ac, g.reserveOf(c, key))
	}
	if err == nil && rsv.Status == ledger.StatusApprovalRequired {
		return g.approvals.Required(ctx, ac, core, rsv, unwaited)
	}
	return g.decided(ctx, s, c, key, rsv, err, "")
}

// decided acts on the ledger's answer to a call's reserve: a refusal or
// a replay is answered, a reservation runs the call. An ask still
// pending is the person's to answer (why says why the client's answer
// did not settle it).
func (g *Gateway) decided(ctx context.Context, s *mcp.ClientSession, c *call, key string, rsv *ledgerport.Reservation, err error, why string) (mcp.Result, error) {
	var refusal *ledgerport.Refusal
	switch {
	case errors.As(err, &refusal):
		g.logger.InfoContext(ctx, "call refused", "tool", c.ledgerTool, "key", key, "code", refusal.Code)
		callsTotal.WithLabelValues(c.toolLabel, DecisionRefused).Inc()
		return refusalAnswer(refusal, key, g.cfg.AdminURL), nil
	case err != nil:
		g.logger.ErrorContext(ctx, "ledger unavailable: call not run", "tool", c.ledgerTool, "key", key, "err", err)
		callsTotal.WithLabelValues(c.toolLabel, DecisionRefused).Inc()
		return unavailableAnswer(key), nil
	case rsv.Status == ledger.StatusReplayed:
		callsTotal.WithLabelValues(c.toolLabel, DecisionReplayed).Inc()
		g.logger.InfoContext(ctx, "call replayed", "tool", c.ledgerTool, "key", key, "receipt", rsv.Receipt.Seq)
		return g.replay(ctx, rsv)
	case rsv.Status == ledger.StatusApprovalRequired && rsv.Ask != nil:
		callsTotal.WithLabelValues(c.toolLabel, DecisionRefused).Inc()
		return g.personAnswer(rsv, why), nil
	case rsv.Status != ledger.StatusReserved:
		return nil, fmt.Errorf("reserve %s: unexpected status %q", key, rsv.Status)
	}
	if rsv.Approval != nil {
		g.logger.InfoContext(ctx, "call approved: the approval is consumed", "tool", c.ledgerTool, "key", key,
			"approval", rsv.Approval.Seq, "ask", rsv.Approval.AskSeq)
	}
	return g.execute(ctx, s, c, rsv)
}

// replay answers with a key's recorded result: as it was recorded with
// ExactReplays, else after a text block that tells the model it is a
// replay (SPEC §11's _meta marks it either way, but most hosts never show
// _meta to the model). A result an erasure removed (SPEC §14) is always
// told in words: there is nothing recorded to replay exactly.
func (g *Gateway) replay(ctx context.Context, rsv *ledgerport.Reservation) (mcp.Result, error) {
	if _, erased := rsv.Erased[erasedResult]; g.cfg.ExactReplays && !erased {
		return replayAnswer(rsv, "")
	}
	rec, err := g.port.Recorded(ctx, rsv.Key, rsv.Original.Seq)
	if err != nil {
		g.logger.WarnContext(ctx, "replay: when the call ran is unknown", "key", rsv.Key, "err", err)
	}
	return replayAnswer(rsv, replayNotice(rsv, rec, g.cfg.Scope == ScopeSession))
}

// execute forwards a reserved call and records what it came to. An
// answer that never came leaves the reservation to run out: the outcome
// is unknown, and the ledger decides the next identical call.
func (g *Gateway) execute(ctx context.Context, s *mcp.ClientSession, c *call, rsv *ledgerport.Reservation) (mcp.Result, error) {
	// Once forwarded, the call runs to its answer and that answer is
	// recorded, whatever becomes of the caller's request (a cancellation,
	// a client gone): the effect may happen either way. It gets no longer
	// than its lease, past which another call of an idempotent tool may
	// take the key over.
	// A held parked round (park.go) runs within what is left of the
	// lease of the reservation it runs under.
	deadline := time.Now().Add(g.cfg.Lease)
	if end := c.reservedAt.Add(cmp.Or(c.lease, g.cfg.Lease)); !c.reservedAt.IsZero() && end.Before(deadline) {
		deadline = end
	}
	cctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	for round := 1; ; round++ {
		c.rsv = rsv
		if c.reservedAt.IsZero() {
			c.reservedAt = time.Now()
		}
		res, slot, err := g.sendBounded(cctx, s, c)
		v := judge(res, slot, err)
		if !v.inputRequired || !c.bridges() {
			return g.finish(ctx, c, rsv, res, v, err)
		}
		next, reply := g.bridgeRound(ctx, c, rsv, res, round)
		if reply != nil {
			return reply, nil
		}
		rsv = next
	}
}

// finish records what a round of a reserved call came to and answers.
func (g *Gateway) finish(ctx context.Context, c *call, rsv *ledgerport.Reservation, res *mcp.CallToolResult, v verdict, err error) (mcp.Result, error) {
	if v.taskID != "" {
		return g.startTask(ctx, c, rsv, v.taskID, v.task, v.reply), nil // committed when the task ends
	}
	if v.known && !v.outcome.Succeeded && !v.inputRequired {
		v.outcome.NotApplied = c.class.errorsApplyNothing()
	}
	if errors.Is(err, rounds.ErrNotSent) {
		v = verdict{known: true, outcome: Outcome{NotApplied: true, ErrorCode: rounds.CodeUpstreamBusy, ErrorMessage: ledgerport.Truncate(err.Error(), ledgerport.MaxFailureMessage)},
			reply: answer(rounds.CodeUpstreamBusy, rsv.Key, fmt.Sprintf("This call was not run: %v. Nothing was applied; "+
				"call it again later (idempotency key %s).", err, rsv.Key))}
	} else if v.unsent && !c.parked {
		g.logger.WarnContext(ctx, "call not sent: the upstream connection refused it", "tool", c.ledgerTool, "key", rsv.Key, "err", err)
		v = unsentVerdict(rsv.Key, err)
	}
	if v.inputRequired && c.parked && g.parked.Holds(c.park, rsv) {
		// The upstream had an answer before it asked again: it may have
		// acted, so the round is not an outcome; the reservation stays
		// with the parked call for the next round (park.go).
		g.logger.InfoContext(ctx, "parked round held: the call's outcome is its final answer", "tool", c.ledgerTool, "key", rsv.Key)
		return g.askClient(c, rsv, res, v.reply)
	}
	if first, merr := serverreq.MissingCapability(c.peer, c.route, v.known && !v.outcome.Succeeded && !v.inputRequired, v.outcome.ErrorMessage); merr != nil {
		// The upstream failed the call for want of what the client
		// cannot give: nothing applied if it had asked nothing before,
		// else it may have acted and the outcome is unknown.
		if first {
			v.outcome, v.rpcErr, v.reply = rounds.CapabilityMissing(merr), nil, capabilityAnswer(rsv.Key, merr)
		} else {
			v, err = verdict{}, merr
		}
	}
	if !v.known {
		msg := "outcome unknown: no answer from the upstream"
		if errors.Is(err, wire.ErrUpstreamTimeout) {
			msg = "outcome unknown: the upstream did not answer within --upstream-timeout"
		}
		g.logger.WarnContext(ctx, msg, "tool", c.ledgerTool, "key", rsv.Key, "err", err,
			"upstream_timeout", g.cfg.UpstreamTimeout.String(), "unmatched_ids", v.strays)
		callsTotal.WithLabelValues(c.toolLabel, DecisionUnknown).Inc()
		return unknownAnswer(rsv.Key, err), nil
	}
	callsTotal.WithLabelValues(c.toolLabel, DecisionExecuted).Inc()
	if cerr := g.port.Commit(ctx, rsv, v.outcome); cerr != nil {
		// The effect ran; its answer still goes back. Unrecorded, the key
		// becomes interrupted when the lease ends and a person decides.
		g.logger.ErrorContext(ctx, "outcome not recorded", "tool", c.ledgerTool, "key", rsv.Key, "err", cerr)
	} else {
		g.logger.InfoContext(ctx, "call executed", "tool", c.ledgerTool, "key", rsv.Key, "outcome", v.outcome.Name(),
			"takeover", rsv.Takeover, "retry", rsv.Retry)
	}
	if v.rpcErr != nil {
		return nil, v.rpcErr
	}
	if v.inputRequired {
		return g.askClient(c, rsv, res, v.reply)
	}
	return v.reply, nil
}

// reserveOf is the reserve of a call's current round.
func (g *Gateway) reserveOf(c *call, key string) client.ReserveRequest {
	r := client.ReserveRequest{Key: key, ExecutionID: c.exec, Attempt: c.attempt, Tool: c.ledgerTool,
		Class: client.Class(c.class.Effect), Idempotent: c.class.Idempotent, InputHash: c.hash, Subjects: c.subjects,
		Lease: cmp.Or(c.lease, g.cfg.Lease), Wait: g.cfg.Wait, ApprovalSummary: ledgerport.Truncate(fmt.Sprintf("MCP tools/call of %q by the client %q, through ledger-mcp", c.name, c.caller.name),
			ledger.MaxApprovalSummary)}
	// The arguments themselves, which the ledger fingerprints as the
	// gateway does (client.Fingerprint: SHA-256 of RFC 8785) and keeps
	// off the chain for the approver when the policy asks (SPEC §13).
	// Arguments beyond what an ask keeps go as their fingerprint.
	if input := compactJSON(c.args); len(input) <= ledger.MaxAskInput {
		r.Input, r.InputHash = input, ""
	}
	return r
}

// compactJSON is raw without insignificant whitespace (raw if it does not
// parse).
func compactJSON(raw json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return raw
	}
	return b.Bytes()
}

// forwardCall passes a read through unrecorded.
func (g *Gateway) forwardCall(ctx context.Context, s *mcp.ClientSession, c *call) (mcp.Result, error) {
	res, slot, err := g.sendBounded(ctx, s, c)
	if err == nil {
		if id, task, ok := tasks.Of(slot.Get()); ok {
			return g.startTask(ctx, c, nil, id, task, wire.AsRaw(res, slot.Get())), nil
		}
		return wire.AsRaw(res, slot.Get()), nil
	}
	v := judge(res, slot, err)
	switch {
	case v.rpcErr != nil:
		return nil, v.rpcErr
	case v.known:
		return v.reply, nil
	}
	return nil, err
}

// send makes the upstream call, with the client's progress token routed
// back to it, and returns the typed result and the slot that saw the
// upstream's answer.
func (g *Gateway) send(ctx context.Context, s *mcp.ClientSession, c *call) (*mcp.CallToolResult, *wire.Slot, error) {
	if c.parked {
		return g.sendParked(ctx, c)
	}
	return g.sendOn(ctx, s, c)
}

// sendOn makes the upstream call on s.
func (g *Gateway) sendOn(ctx context.Context, s *mcp.ClientSession, c *call) (*mcp.CallToolResult, *wire.Slot, error) {
	meta, release := g.progress.Open(ctx, c.session, forwardMeta(c.meta, c.key))
	defer release()
	rctx, slot := wire.WithSlot(ctx)
	res, err := s.CallTool(rctx, &mcp.CallToolParams{Meta: meta, Name: c.name, Arguments: c.args,
		InputResponses: c.upInput, RequestState: c.upState})
	return res, slot, err
}
