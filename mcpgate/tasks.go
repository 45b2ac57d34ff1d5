package mcpgate

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// Tasks (SPEC §11.1: 2025-11-25 tasks and the 2026-07-28 extension) are
// the extension in package tasks; this file plugs it into the call's
// path: a repeat of a call whose task runs in guarded, an answer that is
// a task in finish and forwardCall, and the task's end committed through
// taskCore.

// taskCore is the call's path as the tasks extension reaches it
// (tasks.Core).
type taskCore struct{ g *Gateway }

func (h taskCore) Session(ctx context.Context) (*mcp.ClientSession, error) {
	return h.g.up.Session(ctx)
}

func (h taskCore) Outcome(result json.RawMessage, failure string) Outcome {
	return finalOutcome(result, failure)
}

func (h taskCore) Commit(ctx context.Context, rsv *ledgerport.Reservation, o Outcome) error {
	return h.g.port.Commit(ctx, rsv, o)
}

// startTask hands out the task a call answered (rsv: its reservation,
// nil for a read): the answer names it by its handle.
func (g *Gateway) startTask(ctx context.Context, c *call, rsv *ledgerport.Reservation, id string, obj json.RawMessage, reply mcp.Result) mcp.Result {
	callsTotal.WithLabelValues(c.toolLabel, DecisionExecuted).Inc()
	handle := g.tasks.Start(ctx, tasks.Call{Name: c.name, LedgerTool: c.ledgerTool, Failed: !c.class.errorsApplyNothing(),
		Up: c.up, Rsv: rsv}, id, obj)
	if rr, ok := reply.(wire.RawResult); ok {
		reply = rr.WithRaw(tasks.Rename(rr.RawJSON(), id, handle))
	}
	return reply
}

// runningAnswer answers a repeat of a call whose task runs: to the
// client that made the call, the task again; to another, in_progress.
func (g *Gateway) runningAnswer(ctx context.Context, c *call, key string) mcp.Result {
	again, running := g.tasks.Repeat(ctx, key, map[string]any{MetaStatus: ledger.ECodeInProgress, MetaKey: key})
	if !running {
		return nil
	}
	callsTotal.WithLabelValues(c.toolLabel, DecisionRefused).Inc()
	if again != nil {
		return wire.RawCall(&mcp.CallToolResult{}, again)
	}
	return answer(ledger.ECodeInProgress, key, fmt.Sprintf("The same call is still running as a task; it was not "+
		"started again (idempotency key %s). Call it again once it has finished to get its result.", key))
}
