package test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate"
)

// TestLedgerMCP_frameLimitNextCall (issue 44, item 3): an upstream answer
// over the 50 MB frame limit leaves that call's outcome unknown (it was
// sent, its answer lost), but the next call, with other arguments, is not
// blamed for it: the connection is made again and the call runs, or, if
// it could not be sent, it is not_applied UPSTREAM_UNAVAILABLE (never
// outcome_unknown, never a key left in progress), and a retry runs it.
func TestLedgerMCP_frameLimitNextCall(t *testing.T) {
	t.Parallel()
	sh := newHostile(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startGateway(t, append([]string{"--db", db}, sh.command()...)...)

	huge := g.call(t, "huge", map[string]any{"id": "h1"}, mcp.Meta{mcpgate.MetaIdempotencyKey: "frame-huge-0001"})
	require.True(t, huge.IsError, text(t, huge))
	assert.Equal(t, mcpgate.StatusOutcomeUnknown, status(huge), "the huge call was sent: its outcome is unknown")

	for i := range 3 {
		key := "frame-next-000" + string(rune('1'+i))
		res := g.call(t, "charge", map[string]any{"id": key}, mcp.Meta{mcpgate.MetaIdempotencyKey: key})
		assert.NotEqual(t, mcpgate.StatusOutcomeUnknown, status(res), "call %d after the huge answer: %s\nlogs:\n%s", i, text(t, res), g.logs.String())
		if status(res) == mcpgate.CodeUpstreamUnavailable {
			assert.Equal(t, "not_applied", keyState(t, db, key))
			assert.Equal(t, 0, sh.runs("charge", key))
			res = g.call(t, "charge", map[string]any{"id": key}, mcp.Meta{mcpgate.MetaIdempotencyKey: key})
		}
		require.False(t, res.IsError, text(t, res))
		assert.Equal(t, "succeeded", keyState(t, db, key))
		assert.Equal(t, 1, sh.runs("charge", key))
	}
	assert.Equal(t, "reserved", keyState(t, db, "frame-huge-0001"), "the lost answer's key waits for its lease")
	g.stop(t)
	verified(t, db)
}

// TestLedgerMCP_upstreamWrongID (issue 44, item 4): an upstream that
// answers under another id leaves the call waiting only until
// --upstream-timeout: then outcome_unknown, and a log line naming the
// unmatched id it saw. The gateway still serves the next call.
func TestLedgerMCP_upstreamWrongID(t *testing.T) {
	t.Parallel()
	sh := newHostile(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startGateway(t, append([]string{"--db", db, "--upstream-timeout", "2s"}, sh.command()...)...)

	start := time.Now()
	res := g.call(t, "wrongid", map[string]any{"id": "w1"}, mcp.Meta{mcpgate.MetaIdempotencyKey: "wrong-id-0001"})
	took := time.Since(start)
	require.True(t, res.IsError, text(t, res))
	assert.Equal(t, mcpgate.StatusOutcomeUnknown, status(res), text(t, res))
	assert.Less(t, took, 30*time.Second, "bounded by --upstream-timeout, not the 5-minute lease")
	assert.GreaterOrEqual(t, took, 2*time.Second)
	assert.Equal(t, 1, sh.runs("wrongid", "w1"))
	logs := g.logs.String()
	assert.Contains(t, logs, "did not answer within --upstream-timeout", logs)
	var line string
	for l := range strings.Lines(logs) {
		if strings.Contains(l, "wrong-id-0001") && strings.Contains(l, "unmatched_ids") {
			line = l
		}
	}
	assert.Contains(t, line, `"unmatched_ids":["not-`, "the log names the id the upstream answered under:\n%s", logs)

	ok := g.call(t, "charge", map[string]any{"id": "after-wrong"}, nil)
	require.False(t, ok.IsError, text(t, ok))
}
