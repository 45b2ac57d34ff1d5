package mcpgate

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Failure codes a forwarded call is committed with (SPEC §11).
const (
	CodeToolError = "TOOL_ERROR" // the tool answered isError: true
	CodeMCPError  = "MCP_ERROR"  // the server answered with a JSON-RPC error
)

// commitTimeout bounds recording an outcome once the upstream answered,
// however the caller's request ends.
const commitTimeout = 30 * time.Second

// call is one tools/call being decided.
type call struct {
	name       string // the upstream's tool name
	ledgerTool string // <server-name>.<tool>
	toolLabel  string // the metrics label
	args       json.RawMessage
	meta       mcp.Meta // as the client sent it
	session    *mcp.ServerSession
	class      Class
}

// callTool decides one tools/call (SPEC §11): reads are forwarded,
// effects are reserved first and forwarded only on a new reservation.
func (g *Gateway) callTool(ctx context.Context, ss *mcp.ServerSession, p *mcp.CallToolParamsRaw) (mcp.Result, error) {
	c := &call{name: p.Name, ledgerTool: g.cfg.ServerName + "." + p.Name, args: p.Arguments, meta: p.Meta,
		session: ss, toolLabel: unlistedToolLabel}
	if len(c.args) == 0 || string(c.args) == "null" {
		c.args = json.RawMessage("{}") // what MCP clients send for a call without arguments
	}
	s, err := g.up.Session(ctx)
	if err != nil {
		g.logger.WarnContext(ctx, "upstream unavailable", "tool", c.name, "err", err)
		return nil, err
	}
	tool, err := g.tools.lookup(ctx, s, c.name)
	if err != nil {
		return nil, fmt.Errorf("list the upstream's tools: %w", err)
	}
	var ann *mcp.ToolAnnotations
	if tool != nil {
		ann, c.toolLabel = tool.Annotations, c.ledgerTool
	}
	c.class = Classify(g.cfg.Policy, c.name, c.ledgerTool, ann)
	if !c.class.Recorded() {
		callsTotal.WithLabelValues(c.toolLabel, DecisionPassed).Inc()
		return g.forwardCall(ctx, s, c)
	}
	return g.guarded(ctx, s, c)
}

// guarded runs an effect through the ledger.
func (g *Gateway) guarded(ctx context.Context, s *mcp.ClientSession, c *call) (mcp.Result, error) {
	ctx = withTraceContext(ctx, c.meta)
	key, err := callKey(c.meta, c.ledgerTool, c.args, g.cfg.Scope)
	if err != nil {
		callsTotal.WithLabelValues(c.toolLabel, DecisionRefused).Inc()
		return answer(ledger.ECodeInvalidKey, "", fmt.Sprintf("This call was not run: %v.", err)), nil
	}
	hash, err := client.Fingerprint(c.args)
	if err != nil {
		return nil, fmt.Errorf("fingerprint arguments: %w", err)
	}
	rsv, err := g.cfg.Ledger.Reserve(ctx, Reserve{Key: key, ExecutionID: "mcp-" + rand.Text(), Tool: c.ledgerTool,
		Class: c.class.Effect, Idempotent: c.class.Idempotent, InputHash: hash, Lease: g.cfg.Lease, Wait: g.cfg.Wait})
	var refusal *Refusal
	switch {
	case errors.As(err, &refusal):
		g.logger.InfoContext(ctx, "call refused", "tool", c.ledgerTool, "key", key, "code", refusal.Code)
		callsTotal.WithLabelValues(c.toolLabel, DecisionRefused).Inc()
		return refusalAnswer(refusal, key), nil
	case err != nil:
		g.logger.ErrorContext(ctx, "ledger unavailable: call not run", "tool", c.ledgerTool, "key", key, "err", err)
		callsTotal.WithLabelValues(c.toolLabel, DecisionRefused).Inc()
		return unavailableAnswer(key), nil
	case rsv.Status == ledger.StatusReplayed:
		callsTotal.WithLabelValues(c.toolLabel, DecisionReplayed).Inc()
		g.logger.InfoContext(ctx, "call replayed", "tool", c.ledgerTool, "key", key, "receipt", rsv.Receipt.Seq)
		return replayAnswer(rsv)
	case rsv.Status != ledger.StatusReserved:
		return nil, fmt.Errorf("reserve %s: unexpected status %q", key, rsv.Status)
	}
	return g.execute(ctx, s, c, rsv)
}

// execute forwards a reserved call and records what it came to. An
// answer that never came leaves the reservation to run out: the outcome
// is unknown, and the ledger decides the next identical call.
func (g *Gateway) execute(ctx context.Context, s *mcp.ClientSession, c *call, rsv *Reservation) (mcp.Result, error) {
	// The call gets no longer than its lease: past it another call of an
	// idempotent tool may take the key over.
	cctx, cancel := context.WithTimeout(ctx, g.cfg.Lease)
	defer cancel()
	res, raw, err := g.send(cctx, s, c)
	var o Outcome
	var wire *jsonrpc.Error
	switch {
	case err == nil && !res.IsError:
		result, rerr := recordedResult(res, raw)
		if rerr != nil {
			return nil, rerr
		}
		o = Outcome{Succeeded: true, Result: result}
	case err == nil:
		o = Outcome{ErrorCode: CodeToolError, ErrorMessage: truncate(firstText(res), maxFailureMessage)}
	case errors.As(err, &wire):
		o = Outcome{ErrorCode: CodeMCPError, ErrorMessage: truncate(wire.Message, maxFailureMessage)}
	default:
		g.logger.WarnContext(ctx, "outcome unknown: no answer from the upstream", "tool", c.ledgerTool, "key", rsv.Key, "err", err)
		callsTotal.WithLabelValues(c.toolLabel, DecisionUnknown).Inc()
		return unknownAnswer(rsv.Key, err), nil
	}
	callsTotal.WithLabelValues(c.toolLabel, DecisionExecuted).Inc()
	cmctx, cmcancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cmcancel()
	if cerr := g.cfg.Ledger.Commit(cmctx, rsv.Key, rsv.Token, o); cerr != nil {
		// The effect ran; its answer still goes back. Unrecorded, the key
		// becomes interrupted when the lease ends and a person decides.
		g.logger.ErrorContext(ctx, "outcome not recorded", "tool", c.ledgerTool, "key", rsv.Key, "err", cerr)
	} else {
		g.logger.InfoContext(ctx, "call executed", "tool", c.ledgerTool, "key", rsv.Key, "succeeded", o.Succeeded,
			"takeover", rsv.Takeover, "retry", rsv.Retry)
	}
	if err != nil {
		return nil, err
	}
	return asRaw(res, raw), nil
}

// forwardCall passes a read through unrecorded.
func (g *Gateway) forwardCall(ctx context.Context, s *mcp.ClientSession, c *call) (mcp.Result, error) {
	res, raw, err := g.send(ctx, s, c)
	if err != nil {
		return nil, err
	}
	return asRaw(res, raw), nil
}

// send makes the upstream call, with the client's progress token routed
// back to it, and returns the typed and, where kept, the raw result.
func (g *Gateway) send(ctx context.Context, s *mcp.ClientSession, c *call) (*mcp.CallToolResult, json.RawMessage, error) {
	meta, release := g.progress.open(ctx, c.session, c.meta)
	defer release()
	rctx, slot := withRawSlot(ctx)
	res, err := s.CallTool(rctx, &mcp.CallToolParams{Meta: meta, Name: c.name, Arguments: c.args})
	return res, slot.get(), err
}

// truncate cuts s to at most n bytes on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
