package mcpgate

import (
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/rounds"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// The rounds of one call (SPEC §11.1) are one execution, named by the
// requestState envelope (package rounds) the gateway returns with each
// input_required answer.

// continueRound opens the envelope of a call's next round: the round is
// the envelope's execution at its next attempt, and the upstream gets its
// own state back. An envelope issued for another call is refused.
func (g *Gateway) continueRound(c *call, key string) error {
	sk, err := g.stateKey()
	if err != nil {
		return err
	}
	e, err := rounds.Open(sk, c.state, time.Now())
	if err != nil {
		return err
	}
	if e.Key != key || e.Tool != c.ledgerTool || e.Input != c.hash {
		return fmt.Errorf("%w: issued for another call", rounds.ErrEnvelope)
	}
	c.exec, c.attempt, c.upState, c.ask = e.Exec, e.Attempt, e.Up, e.Ask
	return nil
}

// askClient answers a round that asked for input: the upstream's answer
// as it came, with its requestState sealed in an envelope that names the
// call's execution and next attempt.
func (g *Gateway) askClient(c *call, rsv *ledgerport.Reservation, res *mcp.CallToolResult, reply mcp.Result) (mcp.Result, error) {
	key, err := g.stateKey()
	if err != nil {
		return nil, err
	}
	state, err := rounds.Seal(key, rounds.Envelope{Key: rsv.Key, Exec: c.exec, Attempt: c.attempt + 1, Tool: c.ledgerTool,
		Input: c.hash, Up: res.RequestState, Exp: time.Now().Add(rounds.MaxEnvelopeAge).UnixMilli()})
	if err != nil {
		return nil, err
	}
	if r, ok := reply.(wire.RawResult); ok {
		if b, err := wire.WithMembers(r.RawJSON(), map[string]any{"requestState": state}); err == nil {
			return r.WithRaw(b), nil
		}
	}
	res.RequestState = state
	return res, nil
}
