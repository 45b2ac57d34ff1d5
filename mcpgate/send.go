package mcpgate

import (
	"context"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/serverreq"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// sendBounded is send within Config.UpstreamTimeout: an upstream that
// never answers (or answers another id) leaves the call's outcome unknown
// then, not at the end of its lease. The time counts while the upstream
// owes the answer: not while a request of its to the client (an
// elicitation a person answers) waits on the call's route (package
// serverreq).
// A parked call (park.go) waits for its client's rounds as well, and is
// bounded in await.
func (g *Gateway) sendBounded(ctx context.Context, s *mcp.ClientSession, c *call) (*mcp.CallToolResult, *wire.Slot, error) {
	if c.parked {
		return g.send(ctx, s, c)
	}
	tctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	tctx, slot := wire.WithSlot(tctx) // the one send uses
	defer context.AfterFunc(tctx, slot.Abandon)()
	w := serverreq.NewWatchdog(g.cfg.UpstreamTimeout, func() { cancel(wire.ErrUpstreamTimeout) })
	defer w.Stop()
	c.route.Watch(w)
	res, slot, err := g.send(tctx, s, c)
	if _, answered := slot.Answer(); err == nil && !answered && tctx.Err() != nil {
		// The SDK took an answer that came after the wait ended: none.
		res, err = nil, context.Cause(tctx)
	}
	if err != nil && errors.Is(context.Cause(tctx), wire.ErrUpstreamTimeout) {
		err = fmt.Errorf("%w (%s): %w", wire.ErrUpstreamTimeout, g.cfg.UpstreamTimeout, err)
	}
	return res, slot, err
}

// unsentVerdict is the outcome of a call never written to the upstream
// (verdict.unsent): nothing was applied.
func unsentVerdict(key string, err error) verdict {
	return verdict{known: true, outcome: Outcome{NotApplied: true, ErrorCode: CodeUpstreamUnavailable,
		ErrorMessage: ledgerport.Truncate("not sent to the upstream: "+err.Error(), ledgerport.MaxFailureMessage)},
		reply: answer(CodeUpstreamUnavailable, key, fmt.Sprintf("This call was not run: the connection to the "+
			"tool's server failed before the call could be sent (%v), and is made again for the next call. "+
			"Nothing was applied; call it again (idempotency key %s).", err, key))}
}
