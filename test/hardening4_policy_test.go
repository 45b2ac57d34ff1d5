package test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLedgerMCP_onErrorRule: a --policy rule whose only member is
// "on_error" (docs/mcp.md's "a rule with \"on_error\": \"failed\"") is
// taken, not refused at start: the tool keeps the class of its
// annotations (observe: write, not idempotent) and its error answers are
// recorded failed, so the same call is refused (retry_not_allowed) and the
// upstream ran it once. It sets no member of the gate: no policy receipt.
func TestLedgerMCP_onErrorRule(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	policy := writePolicy(t, `[{"tool": "observe", "on_error": "failed"}]`)
	g := startGateway(t, append([]string{"--db", db, "--policy", policy}, sh.command()...)...)
	fail := g.call(t, "observe", map[string]any{"id": "bob"}, nil)
	require.True(t, fail.IsError)
	assert.Contains(t, text(t, fail), "not found (run 1)")
	refused := g.call(t, "observe", map[string]any{"id": "bob"}, nil)
	assert.Equal(t, "retry_not_allowed", status(refused), text(t, refused))
	assert.Equal(t, 1, sh.runs("observe", "bob"))
	// Another tool keeps the default: its error applied nothing.
	declined := g.call(t, "refund", map[string]any{"order": "R1"}, nil)
	require.True(t, declined.IsError)
	g.stop(t)

	var commits []map[string]any
	for _, r := range dbReceipts(t, db) {
		if r["kind"] == "commit" {
			commits = append(commits, r)
		}
	}
	require.Len(t, commits, 2)
	assert.Equal(t, "test-shop.observe", commits[0]["tool"])
	assert.Equal(t, "write", commits[0]["effect"], "the class of its annotations")
	assert.Equal(t, false, commits[0]["idempotent"])
	assert.Equal(t, "failed", commits[0]["outcome"])
	assert.Equal(t, "TOOL_ERROR", commits[0]["error_code"])
	assert.Equal(t, "test-shop.refund", commits[1]["tool"])
	assert.Equal(t, "not_applied", commits[1]["outcome"], "the default for the other tools")
	assert.Zero(t, kinds(t, db)["policy"], "on_error is no member of the gate")
	verified(t, db)
}
