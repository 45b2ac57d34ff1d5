package test

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// TestLedgerMCP_stdio drives ledger-mcp over stdio in front of a stdio
// upstream, with an embedded SQLite ledger: the decisions of SPEC §11.
func TestLedgerMCP_stdio(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startGateway(t, append([]string{"--db", db, "--metrics", "127.0.0.1:0"}, sh.command()...)...)
	metrics := g.logAddr(t, "metrics ready")
	ctx := context.Background()

	t.Run("ForwardsLists", func(t *testing.T) {
		tools, err := g.ListTools(ctx, nil)
		require.NoError(t, err)
		direct := startDirect(t, sh)
		want, err := direct.ListTools(ctx, nil)
		require.NoError(t, err)
		gotJSON, _ := json.Marshal(tools.Tools)
		wantJSON, _ := json.Marshal(want.Tools)
		assert.JSONEq(t, string(wantJSON), string(gotJSON))
		p, err := g.GetPrompt(ctx, &mcp.GetPromptParams{Name: "greet", Arguments: map[string]string{"name": "ada"}})
		require.NoError(t, err)
		assert.Equal(t, "hello ada", p.Messages[0].Content.(*mcp.TextContent).Text)
		r, err := g.ReadResource(ctx, &mcp.ReadResourceParams{URI: "shop://terms"})
		require.NoError(t, err)
		assert.Equal(t, "no refunds", r.Contents[0].Text)
		require.NoError(t, g.Ping(ctx, nil))
		assert.Equal(t, "test-shop", g.InitializeResult().ServerInfo.Name)
	})

	t.Run("SameCallTwice", func(t *testing.T) {
		args := map[string]any{"order": "A1", "amount": 12.5}
		first := g.call(t, "charge", args, nil)
		require.False(t, first.IsError, text(t, first))
		second := g.call(t, "charge", args, nil)
		assert.Equal(t, 1, sh.runs("charge", "A1"))
		require.NotEmpty(t, second.Content)
		assert.Contains(t, second.Content[0].(*mcp.TextContent).Text, "was NOT run again")
		assert.Equal(t, first.Content, second.Content[1:], "the recorded content after the replay's notice")
		assert.Equal(t, first.StructuredContent, second.StructuredContent)
		assert.Equal(t, true, second.Meta["io.effect-ledger/replayed"])
		assert.Contains(t, second.Meta["io.effect-ledger/key"], "dk2_", "a new ledger is committed: keyed derived keys (SPEC §14)")
		receipt, _ := second.Meta["io.effect-ledger/receipt"].(map[string]any)
		assert.NotZero(t, receipt["seq"])
		assert.Len(t, receipt["hash"], 64)
		assert.Nil(t, first.Meta["io.effect-ledger/replayed"])
	})

	t.Run("ReadsPassEveryTime", func(t *testing.T) {
		a := g.call(t, "lookup", map[string]any{"order": "R1"}, nil)
		b := g.call(t, "lookup", map[string]any{"order": "R1"}, nil)
		assert.Equal(t, "order R1, lookup 1", text(t, a))
		assert.Equal(t, "order R1, lookup 2", text(t, b))
		assert.Empty(t, status(b))
		out, _, code := ledgerctl(t, "receipts", "--db", db, "--tool", "test-shop.lookup", "--json")
		require.Equal(t, 0, code)
		assert.NotContains(t, out, "test-shop.lookup")
	})

	t.Run("ExplicitKeyOtherArguments", func(t *testing.T) {
		key := mcp.Meta{"io.effect-ledger/idempotency-key": "order-B1-charge"}
		res := g.call(t, "charge", map[string]any{"order": "B1"}, key)
		require.False(t, res.IsError, text(t, res))
		res = g.call(t, "charge", map[string]any{"order": "B2"}, key)
		assert.True(t, res.IsError)
		assert.Equal(t, "fingerprint_mismatch", status(res))
		assert.Equal(t, "order-B1-charge", res.Meta["io.effect-ledger/key"])
		assert.Contains(t, text(t, res), "order-B1-charge")
		assert.Equal(t, 0, sh.runs("charge", "B2"))
	})

	t.Run("ParamsIdempotencyKey", func(t *testing.T) {
		first := g.call(t, "charge", map[string]any{"order": "P1"}, mcp.Meta{paramsKeyMeta: "params-key-P1"})
		require.False(t, first.IsError, text(t, first))
		again := g.call(t, "charge", map[string]any{"order": "P1"}, mcp.Meta{paramsKeyMeta: "params-key-P1"})
		assert.Equal(t, "params-key-P1", again.Meta["io.effect-ledger/key"])
		assert.Equal(t, true, again.Meta["io.effect-ledger/replayed"])
		// The _meta key wins over params.idempotencyKey.
		other := g.call(t, "charge", map[string]any{"order": "P1"},
			mcp.Meta{paramsKeyMeta: "params-key-P1", "io.effect-ledger/idempotency-key": "meta-key-P1"})
		require.False(t, other.IsError, text(t, other))
		assert.Equal(t, 2, sh.runs("charge", "P1"))
		out, _, code := ledgerctl(t, "show", "meta-key-P1", "--db", db, "--json")
		require.Equal(t, 0, code)
		assert.Contains(t, out, `"succeeded"`)
	})

	t.Run("ToolErrorAppliedNothing", func(t *testing.T) {
		// By default a tool's error answer is recorded not_applied (SPEC
		// §4.1): the same call runs again. TestLedgerMCP_failedThenFixed
		// has the "on_error": "failed" rule that refuses it.
		res := g.call(t, "refund", map[string]any{"order": "F1"}, nil)
		assert.True(t, res.IsError)
		assert.Equal(t, "card declined for F1 (run 1)", text(t, res))
		assert.Empty(t, status(res))
		res = g.call(t, "refund", map[string]any{"order": "F1"}, nil)
		assert.True(t, res.IsError)
		assert.Empty(t, status(res))
		assert.Equal(t, "card declined for F1 (run 2)", text(t, res))
		assert.Equal(t, 2, sh.runs("refund", "F1"))
	})

	t.Run("IdenticalCallsAtOnce", func(t *testing.T) {
		args := map[string]any{"id": "S1"}
		results := make([]*mcp.CallToolResult, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		slow := func(i int) {
			results[i], errs[i] = g.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: args})
		}
		wg.Go(func() { slow(0) })
		require.Eventually(t, func() bool { return sh.runs("slow", "S1") == 1 }, 30*time.Second, 5*time.Millisecond)
		wg.Go(func() { slow(1) })
		// The second call is parked in the ledger, waiting for the first.
		require.Eventually(t, func() bool { return metric(t, metrics, "ledger_reserve_waiting") == "1" },
			30*time.Second, 5*time.Millisecond)
		sh.release("S1")
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		assert.Equal(t, 1, sh.runs("slow", "S1"))
		assert.Equal(t, "slow S1 done, run 1", text(t, results[0]))
		assert.Equal(t, "slow S1 done, run 1", resultTexts(results[1])[1])
		assert.Equal(t, true, results[1].Meta["io.effect-ledger/replayed"])
	})

	t.Run("Metrics", func(t *testing.T) {
		assert.Equal(t, "2", metric(t, metrics, `ledger_mcp_calls_total{decision="passed_through",tool="test-shop.lookup"}`))
		assert.Equal(t, "2", metric(t, metrics, `ledger_mcp_calls_total{decision="executed",tool="test-shop.refund"}`))
		assert.Equal(t, "1", metric(t, metrics, `ledger_mcp_calls_total{decision="replayed",tool="test-shop.slow"}`))
		// The embedded ledger's gauge of keys waiting (ledger/openkeys.go).
		assert.NotEmpty(t, metric(t, metrics, `ledger_keys_waiting{idempotent="false",namespace="default",state="interrupted"}`))
	})

	g.stop(t)

	t.Run("RestartReplays", func(t *testing.T) {
		g2 := startGateway(t, append([]string{"--db", db}, sh.command()...)...)
		res := g2.call(t, "charge", map[string]any{"order": "A1", "amount": 12.5}, nil)
		assert.Equal(t, true, res.Meta["io.effect-ledger/replayed"])
		assert.Equal(t, 1, sh.runs("charge", "A1"))
		g2.stop(t)
	})

	t.Run("ScopeIsNewWork", func(t *testing.T) {
		g3 := startGateway(t, append([]string{"--db", db, "--scope", "run-2"}, sh.command()...)...)
		res := g3.call(t, "charge", map[string]any{"order": "A1", "amount": 12.5}, nil)
		assert.Nil(t, res.Meta["io.effect-ledger/replayed"])
		assert.Equal(t, 2, sh.runs("charge", "A1"))
		again := g3.call(t, "charge", map[string]any{"order": "A1", "amount": 12.5}, nil)
		assert.Equal(t, true, again.Meta["io.effect-ledger/replayed"])
		assert.Equal(t, 2, sh.runs("charge", "A1"))
		g3.stop(t)
	})

	t.Run("VerifyAndAudit", func(t *testing.T) {
		out, errOut, code := ledgerctl(t, "verify", "--db", db)
		require.Equal(t, 0, code, out+errOut)
		out, errOut, code = ledgerctl(t, "audit", "--db", db, "--json")
		require.Equal(t, 0, code, out+errOut)
		var audit struct {
			ReInvocations []map[string]any `json:"re_invocations"`
			Reruns        []map[string]any `json:"not_applied_reruns"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &audit))
		// charge A1 twice (two repeats), P1's key, slow S1, scope run-2's repeat.
		assert.GreaterOrEqual(t, len(audit.ReInvocations), 4, out)
		assert.NotEmpty(t, audit.Reruns, "refund F1 ran again after its not_applied answer: %s", out)
	})
}

// startDirect connects to the test upstream itself, without the gateway.
func startDirect(t *testing.T, sh *shop) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "direct", Version: "1"}, nil)
	s, err := c.Connect(context.Background(), &mcp.CommandTransport{Command: exec.Command(sh.bin, "--dir", t.TempDir())}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestLedgerMCP_upstreamDies: a call whose server dies mid-call has an
// unknown outcome, is never run again blindly, and the server is started
// again for the next call.
func TestLedgerMCP_upstreamDies(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startGateway(t, append([]string{"--db", db, "--lease", "300ms", "--wait", "50ms"}, sh.command()...)...)

	t.Run("NotIdempotent", func(t *testing.T) {
		res := g.call(t, "crash", map[string]any{"id": "K1"}, nil)
		assert.True(t, res.IsError)
		assert.Equal(t, "outcome_unknown", status(res))
		key, _ := res.Meta["io.effect-ledger/key"].(string)
		require.NotEmpty(t, key)
		// While the lease runs the key is in progress (each call waits
		// --wait for it); then a person must resolve it.
		res = pollStatus(t, g, "crash", map[string]any{"id": "K1"}, "in_progress")
		require.Equal(t, "unsafe_resume", status(res))
		assert.Contains(t, text(t, res), "ledgerctl resolve "+key)
		assert.Equal(t, 1, sh.runs("crash", ""))
		out, _, code := ledgerctl(t, "show", key, "--db", db, "--json")
		require.Equal(t, 0, code)
		assert.Contains(t, out, `"interrupted"`)
	})

	t.Run("RestartedForNextCall", func(t *testing.T) {
		res := g.call(t, "charge", map[string]any{"order": "after-crash"}, nil)
		require.False(t, res.IsError, text(t, res))
		assert.Equal(t, 1, sh.runs("charge", "after-crash"))
	})

	t.Run("IdempotentTakenOver", func(t *testing.T) {
		res := g.call(t, "crash_idem", map[string]any{"id": "I1"}, nil)
		assert.Equal(t, "outcome_unknown", status(res))
		res = pollStatus(t, g, "crash_idem", map[string]any{"id": "I1"}, "in_progress")
		require.False(t, res.IsError, text(t, res))
		assert.Equal(t, "set I1", text(t, res))
		assert.Equal(t, 2, sh.runs("crash_idem", "I1"))
	})

	out, errOut, code := ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, out+errOut)
	out, _, code = ledgerctl(t, "audit", "--db", db, "--json")
	require.Equal(t, 0, code)
	var audit struct {
		Interrupted []map[string]any `json:"interrupted"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &audit))
	require.Len(t, audit.Interrupted, 1, out)
	assert.Equal(t, false, audit.Interrupted[0]["idempotent"])
}

// pollStatus repeats a call while its answer has status while, and
// returns the first answer that does not. The gateway's --wait paces it.
func pollStatus(t *testing.T, g *gateway, tool string, args map[string]any, while string) *mcp.CallToolResult {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res := g.call(t, tool, args, nil)
		if status(res) != while {
			return res
		}
		require.True(t, time.Now().Before(deadline), "still %s after 30s", while)
	}
}

// TestLedgerMCP_postgres: the embedded ledger on PostgreSQL (--db URL).
func TestLedgerMCP_postgres(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	sh := newShop(t)
	g := startGateway(t, append([]string{"--db", url}, sh.command()...)...)
	first := g.call(t, "charge", map[string]any{"order": "G1"}, nil)
	require.False(t, first.IsError, text(t, first))
	g.stop(t)
	g = startGateway(t, append([]string{"--db", url}, sh.command()...)...)
	again := g.call(t, "charge", map[string]any{"order": "G1"}, nil)
	assert.Equal(t, true, again.Meta["io.effect-ledger/replayed"])
	assert.Equal(t, first.StructuredContent, again.StructuredContent)
	assert.Equal(t, 1, sh.runs("charge", "G1"))
	g.stop(t)
	out, errOut, code := ledgerctl(t, "verify", "--db", url)
	require.Equal(t, 0, code, out+errOut)
}
