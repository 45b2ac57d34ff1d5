package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/testkit"

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
		if status(res) == "UPSTREAM_UNAVAILABLE" {
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
	var line string
	assert.Eventually(t, func() bool {
		for l := range strings.Lines(g.logs.String()) {
			if strings.Contains(l, "did not answer within --upstream-timeout") && strings.Contains(l, "wrong-id-0001") {
				line = l
			}
		}
		return line != ""
	}, 10*time.Second, 10*time.Millisecond, g.logs.String())
	assert.Contains(t, line, `"unmatched_ids":["not-`, "the log names the id the upstream answered under:\n%s", g.logs.String())

	ok := g.call(t, "charge", map[string]any{"id": "after-wrong"}, nil)
	require.False(t, ok.IsError, text(t, ok))
}

// TestLedgerMCP_restartEndsDeadCalls (issue 44, items 5 and 9): a
// ledger-mcp killed (kill -9) in the middle of a call leaves its
// reservation holding the lease; the next ledger-mcp of the same embedded
// SQLite ledger (which only one process holds at a time) ends it as
// interrupted when it starts, on the chain, so the identical call is
// told at once that a person must resolve it — not "still running" for
// the lease. Once a person resolves it as succeeded, a replay says who
// decided and when, with their note and external reference, and points
// at no answer below, since none was recorded.
// On PostgreSQL, which gateways may share while they run, only a run
// whose process is gone is ended: a live gateway's call stays in
// progress for another gateway started beside it.
func TestLedgerMCP_restartEndsDeadCalls(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, restartEndsDeadCalls)
}

func restartEndsDeadCalls(t *testing.T, db string) {
	sh := newHostile(t) // a server of an older revision: the client's calls run as plain calls, never tasks
	t.Cleanup(func() { sh.release("dead-1") })
	args := append([]string{"--db", db}, sh.command()...)

	first, cmd := startGatewayCmd(t, args...)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = first.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"id": "dead-1"}})
	}()
	require.Eventually(t, func() bool { return sh.runs("slow", "dead-1") == 1 }, 30*time.Second, 10*time.Millisecond)
	if strings.HasPrefix(db, "postgres") {
		beside := startGateway(t, append([]string{"--wait", "0"}, args...)...)
		res := beside.call(t, "slow", map[string]any{"id": "dead-1"}, nil)
		assert.Equal(t, "in_progress", status(res), "a live gateway's call is not ended: %s", text(t, res))
		beside.stop(t)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_, _ = cmd.Process.Wait()

	second := startGateway(t, args...)
	start := time.Now()
	res := second.call(t, "slow", map[string]any{"id": "dead-1"}, nil)
	took := time.Since(start)
	require.True(t, res.IsError, text(t, res))
	assert.Equal(t, "unsafe_resume", status(res), "the dead call is interrupted at start-up: %s\nlogs:\n%s", text(t, res), second.logs.String())
	assert.Contains(t, text(t, res), "ledgerctl resolve")
	assert.Less(t, took, 10*time.Second, "no wait for the dead call's lease")
	assert.Equal(t, 1, sh.runs("slow", "dead-1"), "never run again blindly")
	key, _ := res.Meta[mcpgate.MetaKey].(string)
	require.NotEmpty(t, key)
	second.stop(t)
	verified(t, db)

	l := StartLedgerd(t, db)
	out, errOut, code := ledgerctl(t, "resolve", key, "--server", l.URL, "--outcome", "succeeded",
		"--ref", "shop-order-77", "--note", "checked the shop: the order went through")
	require.Equal(t, 0, code, out+errOut)
	require.NoError(t, l.Stop())

	third := startGateway(t, args...)
	replay := third.call(t, "slow", map[string]any{"id": "dead-1"}, nil)
	require.False(t, replay.IsError, text(t, replay))
	notice := text(t, replay)
	assert.Contains(t, notice, "resolved")
	assert.Contains(t, notice, "a person")
	assert.Contains(t, notice, "checked the shop: the order went through", "the operator's note")
	assert.Contains(t, notice, "shop-order-77", "the external reference")
	assert.NotContains(t, notice, "below is the answer", "nothing was recorded below")
	assert.NotContains(t, notice, "already ran at", "the resolve's time is not when the call ran")
	assert.Equal(t, 1, sh.runs("slow", "dead-1"))
	third.stop(t)
	verified(t, db)
}

// startGatewayCmd is startGateway, with the ledger-mcp process.
func startGatewayCmd(t *testing.T, args ...string) (*gateway, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "ledger-mcp"), append([]string{"--log-format", "json"}, args...)...)
	logs := &testkit.Buffer{}
	cmd.Stderr = logs
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err, "ledger-mcp logs:\n%s", logs.String())
	t.Cleanup(func() { _ = s.Close() })
	return &gateway{ClientSession: s, logs: logs}, cmd
}

// TestLedgerMCP_upstreamStartsPerSession (issue 44, item 9): over stdio
// a stdio upstream is started once for the client: the gateway's shared
// connection speaks for it (SPEC §11.1: the capabilities of an older
// revision's client, and no other) and is its own session, and requests
// that come at once start no more (calls in flight at once each get a
// session of their own, by design; these come one after the other).
func TestLedgerMCP_upstreamStartsPerSession(t *testing.T) {
	t.Parallel()
	// The SDK's client speaks 2026-07-28 (server/discover, its calls on a
	// parking peer); 2025-11-25 initializes (its own peer).
	for _, rev := range []string{mcpgate.Version20260728, "2025-11-25"} {
		t.Run(rev, func(t *testing.T) {
			t.Parallel()
			sh := newHostile(t)
			starts := filepath.Join(sh.dir, "starts")
			script := filepath.Join(t.TempDir(), "upstream.sh")
			require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho started >> '"+starts+"'\nexec '"+sh.bin+"' --dir '"+sh.dir+"'\n"), 0o700))
			g := startGatewayRev(t, rev, nil, "--db", filepath.Join(t.TempDir(), "mcp.db"), "--", script)

			var wg sync.WaitGroup
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				_, err := g.ListTools(ctx, nil)
				assert.NoError(t, err)
			})
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				res, err := g.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"id": "together"}})
				if assert.NoError(t, err) {
					assert.False(t, res.IsError)
				}
			})
			wg.Wait()
			for i := range 2 {
				res := g.call(t, "charge", map[string]any{"id": fmt.Sprint("s", i)}, nil)
				require.False(t, res.IsError, text(t, res))
			}
			b, err := os.ReadFile(starts)
			require.NoError(t, err)
			assert.Equal(t, 1, strings.Count(string(b), "started\n"), "the shared connection is the client's own session")
		})
	}
}

// TestLedgerMCP_replayOfResolved (issue 44, item 9): the replay of an
// outcome a person resolved as succeeded says so — who decided and when,
// with the note and the external reference — and points at no answer
// below when none was recorded; it never says the call "ran at" the
// resolve's time.
func TestLedgerMCP_replayOfResolved(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		sh := newHostile(t)
		args := append([]string{"--db", db, "--lease", "200ms"}, sh.command()...)
		g := startGateway(t, args...)
		lost := g.call(t, "drop", map[string]any{"id": "r1"}, nil)
		require.Equal(t, mcpgate.StatusOutcomeUnknown, status(lost), text(t, lost))
		key, _ := lost.Meta[mcpgate.MetaKey].(string)
		require.NotEmpty(t, key)
		g.stop(t)
		time.Sleep(300 * time.Millisecond) // the lease runs out: interrupted

		l := StartLedgerd(t, db)
		out, errOut, code := ledgerctl(t, "resolve", key, "--server", l.URL, "--outcome", "succeeded",
			"--ref", "shop-order-78", "--note", "checked the shop: it went through")
		require.Equal(t, 0, code, out+errOut)
		require.NoError(t, l.Stop())

		g = startGateway(t, args...)
		replay := g.call(t, "drop", map[string]any{"id": "r1"}, nil)
		require.False(t, replay.IsError, text(t, replay))
		notice := text(t, replay)
		assert.Contains(t, notice, "resolved its outcome as succeeded")
		assert.Contains(t, notice, "checked the shop: it went through")
		assert.Contains(t, notice, "shop-order-78")
		assert.Contains(t, notice, "none follows")
		assert.NotContains(t, notice, "below is the answer")
		assert.NotContains(t, notice, "already ran at")
		assert.Equal(t, 1, sh.runs("drop", "r1"))
		g.stop(t)
		verified(t, db)
	})
}

// TestLedgerMCP_remoteLedgerNamesNoRun (issue 44, item 5): a gateway that
// cannot prove its run live — here one on a ledgerd (--ledger), which
// other gateways share and which ends no dead work — names no run in its
// execution ids, so no other gateway's start can take its live calls for
// a dead process's and end them.
func TestLedgerMCP_remoteLedgerNamesNoRun(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	sh := newShop(t)
	g := startGatewayEnv(t, nil, append([]string{"--ledger", l.URL}, sh.command()...)...)
	g.call(t, "create_entity", map[string]any{"id": "e1"}, nil)
	r := l.Do("GET", "/v1/receipts?kind=reserve", "")
	require.Equal(t, 200, r.Status, r.Raw)
	rs, _ := r.Body["receipts"].([]any)
	require.NotEmpty(t, rs, r.Raw)
	for _, x := range rs {
		exec, _ := x.(map[string]any)["execution_id"].(string)
		assert.True(t, strings.HasPrefix(exec, "mcp-"), exec)
		assert.Empty(t, mcpgate.RunOf(exec), "execution %s names a run", exec)
	}
}
