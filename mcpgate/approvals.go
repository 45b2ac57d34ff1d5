package mcpgate

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/approve"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/rounds"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// Approvals through the agent's own client (SPEC §13) are the extension
// in package approve; this file plugs it into the call's path: the first
// reserve and an approval_required answer in guarded, a 2026-07-28
// client's answer to its round in guarded too, and the person's answer
// in decided.

// MetaApproval is the _meta member of an approval_required answer: the
// ask's seq, expiry and the page where a person answers it.
const MetaApproval = "io.effect-ledger/approval"

// approval is a call as the approvals extension knows it.
func approval(c *call, key string) approve.Call {
	return approve.Call{Key: key, LedgerTool: c.ledgerTool, Effect: c.class.Effect, Args: c.args, Client: c.caller.name,
		ElicitForm: c.caller.elicitForm, ElicitURL: c.caller.elicitURL, Session: c.session,
		Stateless: wire.Stateless(c.version)}
}

// approvalCore is the call's path as the approvals extension reaches it
// (approve.Core).
type approvalCore struct {
	g   *Gateway
	s   *mcp.ClientSession
	c   *call
	key string
}

func (h approvalCore) Reserve(ctx context.Context, wait bool) (*ledgerport.Reservation, error) {
	r := h.g.reserveOf(h.c, h.key)
	if !wait {
		r.Wait = 0
	}
	return h.g.port.Reserve(ctx, r)
}

func (h approvalCore) Decide(ctx context.Context, rsv *ledgerport.Reservation, err error, why string) (mcp.Result, error) {
	return h.g.decided(ctx, h.s, h.c, h.key, rsv, err, why)
}

func (h approvalCore) Person(rsv *ledgerport.Reservation) mcp.Result {
	callsTotal.WithLabelValues(h.c.toolLabel, DecisionRefused).Inc()
	return h.g.personAnswer(rsv, "")
}

func (h approvalCore) Round(rsv *ledgerport.Reservation, form *mcp.ElicitParams) (mcp.Result, error) {
	callsTotal.WithLabelValues(h.c.toolLabel, DecisionRefused).Inc()
	return h.g.approvalRound(h.c, rsv, form)
}

// personAnswer tells the model that a person must approve the call
// first: the ask, when it expires, where a person answers it, and that
// the same call made again then runs once.
func (g *Gateway) personAnswer(rsv *ledgerport.Reservation, why string) *mcp.CallToolResult {
	text, meta := g.approvals.PersonText(rsv, why)
	res := answer(ledger.StatusApprovalRequired, rsv.Key, text)
	res.Meta[MetaApproval] = meta
	return res
}

// approvalRound asks a 2026-07-28 client with an input_required round: a
// form elicitation and an envelope naming the ask, which the client's
// next round brings back with its answer (approve.Approvals.Answered).
func (g *Gateway) approvalRound(c *call, rsv *ledgerport.Reservation, form *mcp.ElicitParams) (mcp.Result, error) {
	key, err := g.stateKey()
	if err != nil {
		return nil, err
	}
	state, err := rounds.Seal(key, rounds.Envelope{Key: rsv.Key, Exec: c.exec, Attempt: c.attempt, Tool: c.ledgerTool,
		Input: c.hash, Ask: rsv.Ask.Seq, Exp: time.Now().Add(rounds.MaxEnvelopeAge).UnixMilli()})
	if err != nil {
		return nil, err
	}
	res := &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{approve.InputID: form},
		RequestState: state}
	b, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("encode the approval round: %w", err)
	}
	b, err = wire.WithMembers(b, map[string]any{"resultType": "input_required", "content": nil})
	if err != nil {
		return nil, fmt.Errorf("encode the approval round: %w", err)
	}
	return wire.RawCall(res, b), nil
}
