package mcpgate

import (
	"context"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/rounds"
	"github.com/effect-ledger/effect-ledger/mcpgate/serverreq"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// A client of a revision before 2026-07-28 is asked a round's input by
// the gateway (rounds.Fulfil, SPEC §11.1); here the round is committed
// and the execution's next attempt reserved with the answers.

// bridges reports whether the gateway asks the client for a round's
// input itself.
func (c *call) bridges() bool { return !wire.Stateless(c.version) && c.session != nil }

// capabilityAnswer tells the model that the call needs what its client
// cannot give.
func capabilityAnswer(key string, err error) *mcp.CallToolResult {
	return answer(ledger.CodeClientCapabilityMissing, key, fmt.Sprintf("This call was not run: the tool asked for input "+
		"this client cannot give (%v). Nothing was applied (idempotency key %s).", err, key))
}

// bridgeRound asks an older client for a round's input on the upstream's
// behalf (bridge.go): the round is committed, and the next attempt of the
// execution reserved with the answers. A reply ends the call instead.
func (g *Gateway) bridgeRound(ctx context.Context, c *call, rsv *ledgerport.Reservation, res *mcp.CallToolResult, round int) (*ledgerport.Reservation, mcp.Result) {
	callsTotal.WithLabelValues(c.toolLabel, DecisionExecuted).Inc()
	answers, err := rounds.Fulfil(ctx, c.session, res.InputRequests)
	if err == nil && round >= rounds.MaxBridgedRounds {
		err = fmt.Errorf("the tool asked for input more than %d times", rounds.MaxBridgedRounds)
	}
	o := Outcome{NotApplied: true, ErrorCode: ledger.CodeInputRequired, ErrorMessage: "the call asked the client for input"}
	if errors.Is(err, serverreq.ErrCapabilityMissing) {
		o = rounds.CapabilityMissing(err)
	}
	if cerr := g.port.Commit(ctx, rsv, o); cerr != nil {
		g.logger.ErrorContext(ctx, "round not recorded", "tool", c.ledgerTool, "key", rsv.Key, "err", cerr)
	}
	switch {
	case errors.Is(err, serverreq.ErrCapabilityMissing):
		g.logger.InfoContext(ctx, "call not run: the client cannot answer", "tool", c.ledgerTool, "key", rsv.Key, "err", err)
		return nil, capabilityAnswer(rsv.Key, err)
	case err != nil:
		g.logger.InfoContext(ctx, "call not run: no input from the client", "tool", c.ledgerTool, "key", rsv.Key, "err", err)
		return nil, answer(ledger.CodeInputRequired, rsv.Key, fmt.Sprintf("This call was not run: the tool asked for input "+
			"and none came (%v). Nothing was applied (idempotency key %s).", err, rsv.Key))
	}
	c.upInput, c.upState, c.attempt = answers, res.RequestState, c.attempt+1
	next, err := g.port.Reserve(ctx, g.reserveOf(c, rsv.Key))
	var refusal *ledgerport.Refusal
	switch {
	case errors.As(err, &refusal):
		return nil, refusalAnswer(refusal, rsv.Key, g.cfg.AdminURL)
	case err != nil:
		return nil, unavailableAnswer(rsv.Key)
	case next.Status == ledger.StatusReplayed:
		reply, err := g.replay(ctx, next)
		if err != nil {
			return nil, unavailableAnswer(rsv.Key)
		}
		return nil, reply
	case next.Status == ledger.StatusApprovalRequired && next.Ask != nil:
		// The execution's rounds are covered by the approval it consumed
		// (SPEC §13); one asked here is for a person (a policy changed).
		return nil, g.personAnswer(next, "")
	case next.Status != ledger.StatusReserved:
		return nil, unavailableAnswer(rsv.Key)
	}
	return next, nil
}
