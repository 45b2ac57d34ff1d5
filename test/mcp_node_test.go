package test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit"
)

// TestLedgerMCP_node runs code nobody here wrote through ledger-mcp: the
// TypeScript SDK's client in front of the reference memory server, both
// from npm at the versions test/mcp-node/package-lock.json pins
// (test/mcp-node/mcp.test.mjs). It needs node and npm, which .ci/run
// installs: under CI=true it fails without them instead of skipping.
func TestLedgerMCP_node(t *testing.T) {
	t.Parallel()
	node, dir := nodeInstall(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	run := exec.Command(node, "mcp.test.mjs")
	run.Dir = dir
	run.Env = append(os.Environ(), "LEDGER_MCP="+filepath.Join(binDir, "ledger-mcp"), "LEDGER_MCP_DB="+db,
		"WORK_DIR="+t.TempDir())
	out, err := run.CombinedOutput()
	require.NoError(t, err, "node mcp.test.mjs:\n%s", out)
	t.Logf("node mcp.test.mjs:\n%s", out)

	out2, errOut, code := ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, out2+errOut)
	out2, _, code = ledgerctl(t, "audit", "--db", db, "--json")
	require.Equal(t, 0, code)
	var audit struct {
		ReInvocations []struct {
			Key string `json:"key"`
		} `json:"re_invocations"`
	}
	require.NoError(t, json.Unmarshal([]byte(out2), &audit))
	require.Len(t, audit.ReInvocations, 1, out2)
	out2, _, code = ledgerctl(t, "receipts", "--db", db, "--json")
	require.Equal(t, 0, code)
	assert.Contains(t, out2, `"tool":"memory-server.create_entities"`)
	assert.NotContains(t, out2, "read_graph")
}

// nodeInstall installs test/mcp-node's pinned packages (npm ci) into a
// copy, so the source tree gets no node_modules, and returns node and
// the copy. Without node and npm the test is skipped, or fails under
// CI=true (.ci/run installs them).
func nodeInstall(t *testing.T) (node, dir string) {
	t.Helper()
	node, nerr := exec.LookPath("node")
	npm, perr := exec.LookPath("npm")
	if nerr != nil || perr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("node and npm are needed (Debian: apt-get install nodejs npm)")
		}
		t.Skip("node or npm not installed")
	}
	dir = t.TempDir()
	for _, f := range []string{"package.json", "package-lock.json", "mcp.test.mjs", "everything.test.mjs"} {
		testkit.CopyFile(t, filepath.Join("mcp-node", f), filepath.Join(dir, f))
	}
	install := exec.Command(npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
	install.Dir = dir
	out, err := install.CombinedOutput()
	require.NoError(t, err, "npm ci:\n%s", out)
	return node, dir
}

// TestLedgerMCP_nodeEverything: the TypeScript SDK's client (2025-11-25)
// in front of the reference everything server, both pinned by
// test/mcp-node/package-lock.json (test/mcp-node/everything.test.mjs):
// the server's elicitation/create, sampling/createMessage and roots/list
// during a call reach the client and its answers the server, and the
// server's log messages reach the client.
func TestLedgerMCP_nodeEverything(t *testing.T) {
	t.Parallel()
	node, dir := nodeInstall(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	run := exec.Command(node, "everything.test.mjs")
	run.Dir = dir
	run.Env = append(os.Environ(), "LEDGER_MCP="+filepath.Join(binDir, "ledger-mcp"), "LEDGER_MCP_DB="+db)
	out, err := run.CombinedOutput()
	require.NoError(t, err, "node everything.test.mjs:\n%s", out)
	t.Logf("node everything.test.mjs:\n%s", out)
	verified(t, db)
}
