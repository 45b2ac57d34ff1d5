package mcpgate

import (
	"crypto/rand"
	"strings"

	"github.com/effect-ledger/effect-ledger/chain"
)

// A gateway's executions are named mcp-<run>-<random>: run is the
// process's run id (Config.RunID), so that a later process of the same
// embedded ledger can tell the reservations of an earlier one, which
// died with them (EarlierRun).

// NewRunID returns a new run id: 13 characters of [A-Z2-7].
func NewRunID() string { return rand.Text()[:13] }

// execution returns a new execution id of the run.
func executionOf(run string) string { return "mcp-" + run + "-" + rand.Text() }

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
