package test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate"
)

// resultTexts are the text blocks of a result.
func resultTexts(res *mcp.CallToolResult) []string {
	var out []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			out = append(out, tc.Text)
		}
	}
	return out
}

// TestLedgerMCP_replaysVisible: a replayed answer tells the model, in its
// content, that the call already ran and was not run again (when, which
// receipt, until when it is remembered, how to make a new call count);
// --exact-replays keeps it as recorded.
func TestLedgerMCP_replaysVisible(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startGateway(t, append([]string{"--db", db}, sh.command()...)...)
	first := g.call(t, "charge", map[string]any{"order": "V1"}, nil)
	require.False(t, first.IsError, text(t, first))
	again := g.call(t, "charge", map[string]any{"order": "V1"}, nil)
	require.False(t, again.IsError)
	assert.Equal(t, true, again.Meta[mcpgate.MetaReplayed])
	got := resultTexts(again)
	require.Len(t, got, len(resultTexts(first))+1, "one block before the recorded content")
	notice := got[0]
	assert.True(t, strings.HasPrefix(notice, "[Replayed: this exact call already ran at "), notice)
	assert.Contains(t, notice, "was NOT run again")
	assert.Contains(t, notice, "receipt 2")
	assert.Contains(t, notice, "change its arguments")
	assert.Contains(t, notice, "when the ledger forgets this one", "keys of the embedded ledger expire by default")
	assert.Equal(t, resultTexts(first), got[1:], "the recorded content follows as it was")
	assert.Equal(t, first.StructuredContent, again.StructuredContent)
	assert.Equal(t, 1, sh.runs("charge", "V1"))
	g.stop(t)

	exact := startGateway(t, append([]string{"--db", db, "--exact-replays"}, sh.command()...)...)
	same := exact.call(t, "charge", map[string]any{"order": "V1"}, nil)
	assert.Equal(t, true, same.Meta[mcpgate.MetaReplayed])
	assert.Equal(t, resultTexts(first), resultTexts(same), "byte for byte as recorded")
	assert.Equal(t, 1, sh.runs("charge", "V1"))
}

// TestLedgerMCP_failedThenFixed: a tool's error answer applied nothing by
// default (recorded not_applied), so the same call runs again once its
// cause is fixed; a policy rule with "on_error": "failed" keeps such a
// failure from running again, and says a person can mark it not applied.
func TestLedgerMCP_failedThenFixed(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startGateway(t, append([]string{"--db", db}, sh.command()...)...)
	miss := g.call(t, "observe", map[string]any{"id": "alice"}, nil)
	require.True(t, miss.IsError)
	assert.Contains(t, text(t, miss), "not found (run 1)")
	again := g.call(t, "observe", map[string]any{"id": "alice"}, nil)
	assert.Contains(t, text(t, again), "not found (run 2)", "nothing was applied: it runs again")
	created := g.call(t, "create_entity", map[string]any{"id": "alice"}, nil)
	require.False(t, created.IsError, text(t, created))
	ok := g.call(t, "observe", map[string]any{"id": "alice"}, nil)
	require.False(t, ok.IsError, text(t, ok))
	assert.Equal(t, "observation added to alice (run 3)", text(t, ok))
	replay := g.call(t, "observe", map[string]any{"id": "alice"}, nil)
	assert.Equal(t, true, replay.Meta[mcpgate.MetaReplayed], "once it succeeded, it is replayed")
	assert.Equal(t, 3, sh.runs("observe", "alice"))
	g.stop(t)
	out, errOut, code := ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, out+errOut)
	out, _, code = ledgerctl(t, "audit", "--db", db, "--json")
	require.Equal(t, 0, code)
	var audit struct {
		Reruns []map[string]any `json:"not_applied_reruns"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &audit), out)
	assert.Len(t, audit.Reruns, 2, "each run after a not_applied answer is visible to the audit: %s", out)

	policy := filepath.Join(t.TempDir(), "policy.json")
	require.NoError(t, os.WriteFile(policy, []byte(`[{"tool": "observe", "effect": "write", "on_error": "failed"}]`), 0o600))
	strict := startGateway(t, append([]string{"--db", filepath.Join(t.TempDir(), "strict.db"), "--policy", policy}, sh.command()...)...)
	fail := strict.call(t, "observe", map[string]any{"id": "bob"}, nil)
	require.True(t, fail.IsError)
	refused := strict.call(t, "observe", map[string]any{"id": "bob"}, nil)
	assert.Equal(t, "retry_not_allowed", status(refused))
	assert.Contains(t, text(t, refused), "--outcome not_applied", "it says how a person lets it run again")
	assert.Equal(t, 1, sh.runs("observe", "bob"))
}

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

// TestLedgerMCP_failedThenFixedAuditedOnce: the probe's case through
// ledger-mcp — a tool that answers an error twice (recorded not_applied),
// then succeeds once its cause is fixed — is one repeated failure naming
// the call's key once, with its three runs.
func TestLedgerMCP_failedThenFixedAuditedOnce(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startGateway(t, append([]string{"--db", db}, sh.command()...)...)
	for range 2 {
		require.True(t, g.call(t, "observe", map[string]any{"id": "alice"}, nil).IsError)
	}
	require.False(t, g.call(t, "create_entity", map[string]any{"id": "alice"}, nil).IsError)
	require.False(t, g.call(t, "observe", map[string]any{"id": "alice"}, nil).IsError)
	g.stop(t)
	got := auditRepeats(t, "--db", db)
	require.Len(t, got, 1)
	assert.Len(t, got[0].Keys, 1, "one call, one key: %v", got[0])
	assert.Len(t, got[0].Executions, 3, "%v", got[0])
	assert.Len(t, got[0].Seqs, 3, "%v", got[0])
}

// TestLedgerMCP_adminListen: an interrupted call of a non-idempotent tool
// is never run again without a person; with --admin-listen the embedded
// ledger's API and page are served, the refusal names them, and a person
// resolves the key with ledgerctl --server while the gateway runs.
func TestLedgerMCP_adminListen(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startGateway(t, append([]string{"--db", db, "--lease", "300ms", "--wait", "0s", "--admin-listen", "127.0.0.1:0"},
		sh.command()...)...)
	admin := "http://" + g.logAddr(t, "admin API ready")

	lost := g.call(t, "slow", map[string]any{"id": "u1"}, nil)
	assert.Equal(t, "outcome_unknown", status(lost), text(t, lost))
	sh.release("u1")
	var refused *mcp.CallToolResult
	require.Eventually(t, func() bool {
		refused = g.call(t, "slow", map[string]any{"id": "u1"}, nil)
		return status(refused) == "unsafe_resume"
	}, 30*time.Second, 50*time.Millisecond)
	assert.Contains(t, text(t, refused), "--server "+admin)
	assert.Contains(t, text(t, refused), admin+"/ui/")
	key, _ := refused.Meta[mcpgate.MetaKey].(string)
	assert.Equal(t, 1, sh.runs("slow", "u1"), "an interrupted call is not run again without a person")

	res, err := httpGet(admin + "/ui/")
	require.NoError(t, err)
	assert.Equal(t, 200, res)
	token := strings.TrimSpace(readFile(t, db+".admin-token"))
	out, errOut, code := ledgerctlEnv(t, []string{"LEDGER_TOKEN=" + token}, "resolve", key, "--server", admin, "--outcome", "not_applied",
		"--error-code", "CHECKED_NOTHING_APPLIED", "--note", "the server log shows it stopped before writing")
	require.Equal(t, 0, code, out+errOut)
	sh.release("u1")
	ran := g.call(t, "slow", map[string]any{"id": "u1"}, nil)
	require.False(t, ran.IsError, text(t, ran))
	assert.Equal(t, 2, sh.runs("slow", "u1"), "resolved as not applied, the call runs again")
	g.stop(t)
	verified(t, db)
}

// TestLedgerMCP_resolveHowNamesToken (issue 44): the command the model is
// given to have a key resolved names the admin token (never where it is
// kept: the text reaches the agent), so that it works as printed with it.
func TestLedgerMCP_resolveHowNamesToken(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		sh := newShop(t)
		g := startAdminGateway(t, sh, db, "--lease", "300ms", "--wait", "0s")
		key := g.interrupt(t, sh, "tok1")
		refused := g.call(t, "slow", map[string]any{"id": "tok1"}, nil)
		require.Equal(t, "unsafe_resume", status(refused), text(t, refused))
		msg := text(t, refused)
		assert.Contains(t, msg, "LEDGER_TOKEN=<admin token> ledgerctl resolve "+key+" --server "+g.url+" --outcome ")
		assert.NotContains(t, msg, g.tokenFile, "the model is never told where the admin token is kept")
		assert.NotContains(t, msg, filepath.Base(g.tokenFile))
		assert.Contains(t, msg, "or the page "+g.url+"/ui/")

		m := regexp.MustCompile(`LEDGER_TOKEN=<admin token> (ledgerctl resolve \S+ --server \S+) --outcome`).FindStringSubmatch(msg)
		require.Len(t, m, 2, msg)
		args := append(strings.Fields(m[1])[1:], "--outcome", "succeeded", "--note", "checked: it went through")
		out, errOut, code := ledgerctlEnv(t, []string{"LEDGER_TOKEN=" + g.token(t)}, args...)
		require.Equal(t, 0, code, out+errOut)
	})
}

// httpGet is the status of a GET.
func httpGet(url string) (int, error) {
	res, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	_ = res.Body.Close()
	return res.StatusCode, nil
}

// TestLedgerMCP_defaultKeyTTL: an embedded ledger created by ledger-mcp
// remembers keys for an hour by default (SPEC §12), --key-ttl 0 forever.
func TestLedgerMCP_defaultKeyTTL(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "1h0m0s"},
		{[]string{"--key-ttl", "0"}, "-"},
	} {
		db := filepath.Join(t.TempDir(), "mcp.db")
		g := startGateway(t, append(append([]string{"--db", db}, tc.args...), sh.command()...)...)
		g.call(t, "lookup", map[string]any{"order": "T"}, nil)
		g.stop(t)
		out, errOut, code := ledgerctl(t, "namespace", "list", "--db", db, "--json")
		require.Equal(t, 0, code, out+errOut)
		var list []struct {
			Name     string `json:"name"`
			KeyTTLMS uint64 `json:"key_ttl_ms"`
		}
		if json.Unmarshal([]byte(out), &list) != nil {
			var wrapped struct {
				Namespaces []struct {
					Name     string `json:"name"`
					KeyTTLMS uint64 `json:"key_ttl_ms"`
				} `json:"namespaces"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &wrapped), out)
			for _, n := range wrapped.Namespaces {
				list = append(list, struct {
					Name     string `json:"name"`
					KeyTTLMS uint64 `json:"key_ttl_ms"`
				}{n.Name, n.KeyTTLMS})
			}
		}
		require.NotEmpty(t, list, out)
		want := uint64(0)
		if tc.want == "1h0m0s" {
			want = uint64(time.Hour.Milliseconds())
		}
		assert.Equal(t, want, list[0].KeyTTLMS, "%v: %s", tc.args, out)
	}
}

// TestLedgerMCP_scopeSession: with --scope session the same call runs
// once within a session (on stdio: one gateway process), and again in a
// new one.
func TestLedgerMCP_scopeSession(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	for round := 1; round <= 2; round++ {
		g := startGateway(t, append([]string{"--db", db, "--scope", "session"}, sh.command()...)...)
		g.call(t, "charge", map[string]any{"order": "S1"}, nil)
		again := g.call(t, "charge", map[string]any{"order": "S1"}, nil)
		assert.Equal(t, true, again.Meta[mcpgate.MetaReplayed])
		assert.Contains(t, resultTexts(again)[0], "or call it in a new session")
		assert.Equal(t, round, sh.runs("charge", "S1"), "round %d", round)
		g.stop(t)
	}
	url, logs := startHTTPGateway(t, append([]string{"--db", filepath.Join(t.TempDir(), "http.db"), "--scope", "session"},
		sh.command()...)...)
	for i := 1; i <= 2; i++ {
		// Sessions are of revisions before 2026-07-28: a stateless
		// 2026-07-28 request has none (docs/mcp.md).
		s := connectHTTPRev(t, url, logs, rev1125, nil)
		s.call(t, "charge", map[string]any{"order": "S2"}, nil)
		again := s.call(t, "charge", map[string]any{"order": "S2"}, nil)
		assert.Equal(t, true, again.Meta[mcpgate.MetaReplayed])
		assert.Equal(t, i, sh.runs("charge", "S2"), "session %d", i)
	}
}
