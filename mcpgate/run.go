package mcpgate

import (
	"crypto/rand"
	"strings"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// A gateway's executions are named mcp-<run>-<random>: run is the
// process's run id (Config.RunID), so that a later process of the same
// embedded ledger can tell the reservations of an earlier one, which
// died with them (EarlierRun).

// NewRunID returns a new run id: 13 characters of [A-Z2-7].
func NewRunID() string { return rand.Text()[:13] }

// runOf is the run id that names c's execution: this process's, unless
// the call may become a task (a 2025-11-25 call with params.task, a
// 2026-07-28 call to a 2026-07-28 upstream, which may answer with one,
// tasks.go; a parked call runs as a plain call, park.go), whose
// handle outlives the process: a later one takes the task up with its
// reservation, so that reservation is not dead work, and its execution
// names no run.
func (g *Gateway) runOf(c *call) string {
	if _, task := c.meta[tasks.MetaParamsTask]; task || (wire.Stateless(c.version) && !c.parked) {
		return ""
	}
	return g.cfg.RunID
}

// executionOf returns a new execution id of the run ("": of none).
func executionOf(run string) string {
	if run == "" {
		return "mcp-" + rand.Text()
	}
	return "mcp-" + run + "-" + rand.Text()
}

// RunOf is the run id of a gateway's execution id, "" for another's (or
// a gateway's from before run ids).
func RunOf(execution string) string {
	rest, ok := strings.CutPrefix(execution, "mcp-")
	run, _, ok2 := strings.Cut(rest, "-")
	if !ok || !ok2 || len(run) != 13 {
		return ""
	}
	return run
}

// EarlierRun reports whether a reserve receipt is a gateway's of another
// run than run: with an embedded ledger that one process holds at a time
// (a SQLite file is locked), a process that is gone.
func EarlierRun(run string) func(*chain.Receipt) bool {
	return func(r *chain.Receipt) bool {
		other := RunOf(r.ExecutionID)
		return other != "" && other != run
	}
}
