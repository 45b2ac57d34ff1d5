package test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/testkit"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate"
)

// mcpHostileBin is the hand-written MCP server of testdata/mcp-hostile,
// built once.
var mcpHostileBin = builtOnce("mcp-hostile", "./testdata/mcp-hostile")

// newHostile is a shop whose server is mcp-hostile: the same executions
// file, the same command line.
func newHostile(t *testing.T) *shop {
	t.Helper()
	bin, err := mcpHostileBin()
	require.NoError(t, err)
	return &shop{t: t, dir: t.TempDir(), bin: bin}
}

// keyState is a key's state in a ledger file, read with ledgerctl.
func keyState(t *testing.T, db, key string) string {
	t.Helper()
	out, errOut, code := ledgerctl(t, "show", key, "--db", db, "--json")
	require.Equal(t, 0, code, out+errOut)
	var k struct {
		State string `json:"state"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &k), out)
	return k.State
}

// TestLedgerMCP_explicitKeyTooShort: an explicit key the ledger would
// replace with a generated one (under 8 bytes, "" included) is refused
// to the model, in _meta and in params.idempotencyKey, embedded and with
// --ledger: never run under a fresh key, which would turn deduplication
// off for every identical call.
func TestLedgerMCP_explicitKeyTooShort(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	for _, mode := range []struct {
		desc string
		args []string
	}{
		{"embedded", []string{"--db", filepath.Join(t.TempDir(), "mcp.db")}},
		{"remote", []string{"--ledger", l.URL}},
	} {
		t.Run(mode.desc, func(t *testing.T) {
			sh := newShop(t)
			g := startGateway(t, append(mode.args, sh.command()...)...)
			for i, meta := range []mcp.Meta{
				{mcpgate.MetaIdempotencyKey: "short"},
				{mcpgate.MetaIdempotencyKey: ""},
				{paramsKeyMeta: "abc"},
				{paramsKeyMeta: ""},
				{mcpgate.MetaIdempotencyKey: "gen_0123456789abcdef"},
			} {
				for range 2 {
					res := g.call(t, "charge", map[string]any{"order": "K1"}, meta)
					require.True(t, res.IsError, "case %d: %s", i, text(t, res))
					assert.Equal(t, "invalid_key", status(res), "case %d", i)
				}
			}
			assert.Equal(t, 0, sh.runs("charge", "K1"))
			ok := g.call(t, "charge", map[string]any{"order": "K1"}, mcp.Meta{mcpgate.MetaIdempotencyKey: "order-K1-charge"})
			require.False(t, ok.IsError, text(t, ok))
			assert.Equal(t, 1, sh.runs("charge", "K1"))
		})
	}
}

// TestLedgerMCP_escapedParamsKey: params.idempotencyKey whose name is
// written with a JSON escape is the same member, and is the call's key.
func TestLedgerMCP_escapedParamsKey(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	g := startGateway(t, append([]string{"--db", filepath.Join(t.TempDir(), "mcp.db")}, sh.command()...)...)
	first := g.call(t, "charge", map[string]any{"order": "E1"}, mcp.Meta{paramsKeyEscapedMeta: "escaped-key-0001"})
	require.False(t, first.IsError, text(t, first))
	other := g.call(t, "charge", map[string]any{"order": "E2"}, mcp.Meta{paramsKeyEscapedMeta: "escaped-key-0001"})
	assert.Equal(t, "fingerprint_mismatch", status(other), "the escaped key is the key: another call under it is a reuse")
	assert.Equal(t, "escaped-key-0001", other.Meta[mcpgate.MetaKey])
	assert.Equal(t, 0, sh.runs("charge", "E2"))
}

// TestLedgerMCP_hostileHTTPUpstream: only an answer the upstream sent is
// an outcome. A connection dropped after the tool ran, or an HTTP 500,
// leaves the outcome unknown (nothing committed: the next identical call
// of a non-idempotent tool waits for a person, it is not refused as a
// failure); a JSON-RPC error answer is recorded and reaches the client
// as the server sent it; a success that is not I-JSON, or that the SDK
// cannot decode, is recorded as a success.
func TestLedgerMCP_hostileHTTPUpstream(t *testing.T) {
	t.Parallel()
	sh := newHostile(t)
	url := startHTTPShop(t, sh)
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startGateway(t, "--db", db, "--lease", "300ms", "--wait", "2s", "--upstream", url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for _, tool := range []string{"drop", "http500"} {
		res := g.call(t, tool, map[string]any{"id": "x1"}, nil)
		require.True(t, res.IsError, text(t, res))
		assert.Equal(t, "outcome_unknown", status(res), "%s: %s", tool, text(t, res))
		again := g.call(t, tool, map[string]any{"id": "x1"}, nil)
		assert.Equal(t, "unsafe_resume", status(again), "%s: a dropped answer is not a failure: %s", tool, text(t, again))
		assert.Equal(t, 1, sh.runs(tool, "x1"), tool)
	}

	_, err := g.CallTool(ctx, &mcp.CallToolParams{Name: "rpcerror", Arguments: map[string]any{"id": "r1"}})
	var wire *jsonrpc.Error
	require.True(t, errors.As(err, &wire), "%v", err)
	assert.Equal(t, int64(-32042), wire.Code)
	assert.Equal(t, "boom", wire.Message, "the server's own message, not the SDK's wrapping")
	assert.JSONEq(t, `{"why":"the shop said no"}`, string(wire.Data))
	// Recorded (not_applied by default, SPEC §4.1), so the same call runs
	// again; had it been taken for no answer, it would wait for a person.
	_, err = g.CallTool(ctx, &mcp.CallToolParams{Name: "rpcerror", Arguments: map[string]any{"id": "r1"}})
	require.True(t, errors.As(err, &wire), "%v", err)
	assert.Equal(t, "boom", wire.Message)
	assert.Equal(t, 2, sh.runs("rpcerror", "r1"))

	res := g.call(t, "surrogate", map[string]any{"id": "s1"}, nil)
	require.False(t, res.IsError, text(t, res))
	replay := g.call(t, "surrogate", map[string]any{"id": "s1"}, nil)
	assert.Equal(t, true, replay.Meta[mcpgate.MetaReplayed], text(t, replay))
	assert.Equal(t, "done \uFFFD here", resultTexts(replay)[1], "recorded with the lone surrogate replaced")
	assert.Equal(t, 1, sh.runs("surrogate", "s1"))

	// The client cannot decode these answers either (a number beyond a
	// double, an unknown content type); the gateway recorded each as the
	// success it was, and replays it.
	var keys []string
	for _, tool := range []string{"bignum", "hologram"} {
		_, err = g.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"id": "g1"}})
		require.Error(t, err, tool)
		_, _ = g.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"id": "g1"}})
		assert.Equal(t, 1, sh.runs(tool, "g1"), tool)
		key, err := mcpgate.DeriveKey("hostile."+tool, json.RawMessage(`{"id":"g1"}`), "")
		require.NoError(t, err)
		keys = append(keys, key)
	}
	assert.NotContains(t, g.logs.String(), "did not answer")
	g.stop(t)
	for _, key := range keys {
		assert.Equal(t, "succeeded", keyState(t, db, key))
	}
	verified(t, db)
}

// TestLedgerMCP_hostileNames: a "*" policy rule covers a tool name with
// "/" that claims to be read-only, and a 128-byte tool name is recorded
// (mapped to the ledger's 128-byte limit), not refused on every call.
func TestLedgerMCP_hostileNames(t *testing.T) {
	t.Parallel()
	sh := newHostile(t)
	policy := filepath.Join(t.TempDir(), "policy.json")
	require.NoError(t, os.WriteFile(policy, []byte(`[{"tool": "*", "effect": "destructive"}]`), 0o600))
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startGateway(t, append([]string{"--db", db, "--policy", policy}, sh.command()...)...)
	long := "long_" + strings.Repeat("x", 123)
	for _, tool := range []string{"admin/delete", long} {
		res := g.call(t, tool, map[string]any{"id": "n1"}, nil)
		require.False(t, res.IsError, "%s: %s", tool, text(t, res))
		replay := g.call(t, tool, map[string]any{"id": "n1"}, nil)
		assert.Equal(t, true, replay.Meta[mcpgate.MetaReplayed], "%s: %s", tool, text(t, replay))
		assert.Equal(t, 1, sh.runs(tool, "n1"), tool)
	}
	g.stop(t)
	out, errOut, code := ledgerctl(t, "receipts", "--db", db, "--json")
	require.Equal(t, 0, code, out+errOut)
	assert.Contains(t, out, mcpgate.LedgerToolName("hostile", long))
	assert.Len(t, mcpgate.LedgerToolName("hostile", long), 128)
}

// TestLedgerMCP_cursorLoop: an upstream whose tools/list repeats its
// nextCursor makes a call fail at once, not hang at full CPU.
func TestLedgerMCP_cursorLoop(t *testing.T) {
	t.Parallel()
	sh := newHostile(t)
	g := startGateway(t, "--db", filepath.Join(t.TempDir(), "mcp.db"), "--", sh.bin, "--dir", sh.dir, "--loop-cursor")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := g.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"id": "c1"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cursor")
	assert.NoError(t, ctx.Err(), "answered before the deadline")
	assert.Equal(t, 0, sh.runs("charge", "c1"))
}

// TestLedgerMCP_clientCancels: a call the client cancels after it was
// forwarded runs to its answer, which is recorded: the next identical
// call gets the recorded result, the tool ran once.
func TestLedgerMCP_clientCancels(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	g := startGateway(t, append([]string{"--db", filepath.Join(t.TempDir(), "mcp.db")}, sh.command()...)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := g.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"id": "cx1"}})
		done <- err
	}()
	require.Eventually(t, func() bool { return sh.runs("slow", "cx1") == 1 }, 30*time.Second, 5*time.Millisecond)
	cancel()
	require.Error(t, <-done)
	sh.release("cx1")
	res := pollStatus(t, g, "slow", map[string]any{"id": "cx1"}, "in_progress")
	require.False(t, res.IsError, text(t, res))
	assert.Equal(t, true, res.Meta[mcpgate.MetaReplayed], text(t, res))
	assert.Equal(t, "slow cx1 done, run 1", resultTexts(res)[1])
	assert.Equal(t, 1, sh.runs("slow", "cx1"))
	assert.NotContains(t, g.logs.String(), "outcome unknown")
}

// TestLedgerMCP_ledgerHangs: with --ledger, a ledgerd that stops
// answering makes a call ledger_unavailable within --ledger-timeout, and
// the effect never runs, not even once the ledgerd answers again.
func TestLedgerMCP_ledgerHangs(t *testing.T) {
	t.Parallel()
	var stoppedAt time.Time
	sh := newShop(t)
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	g := startGateway(t, append([]string{"--ledger", l.URL, "--ledger-timeout", "500ms", "--wait", "0s"}, sh.command()...)...)
	warm := g.call(t, "charge", map[string]any{"order": "H0"}, nil)
	require.False(t, warm.IsError, text(t, warm))
	// Seen once in CI (not reproduced since): H1 ran, as if the ledgerd
	// had answered its reserve while stopped. Keep both sides' logs.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("SIGSTOP sent at %s\nledgerd logs:\n%s\nledger-mcp logs:\n%s",
				stoppedAt.Format(time.RFC3339Nano), l.Logs(), g.logs.String())
		}
	})

	stoppedAt = time.Now()
	require.NoError(t, l.cmd.Process.Signal(syscall.SIGSTOP))
	stopped := true
	defer func() {
		if stopped {
			_ = l.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	start := time.Now()
	res := g.call(t, "charge", map[string]any{"order": "H1"}, nil)
	assert.Equal(t, "ledger_unavailable", status(res), text(t, res))
	assert.Less(t, time.Since(start), 20*time.Second)
	require.NoError(t, l.cmd.Process.Signal(syscall.SIGCONT))
	stopped = false
	// Whatever the ledgerd does with the queued reserve now, the gateway
	// does not run the call it refused.
	ping := g.call(t, "charge", map[string]any{"order": "H2"}, nil)
	require.False(t, ping.IsError, text(t, ping))
	assert.Equal(t, 0, sh.runs("charge", "H1"))
}

// TestLedgerMCP_httpSessions: --listen closes idle sessions after
// --session-timeout and refuses a session beyond --max-sessions.
func TestLedgerMCP_httpSessions(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	url, logs := startHTTPGateway(t, append([]string{"--db", filepath.Join(t.TempDir(), "mcp.db"),
		"--session-timeout", "1s", "--max-sessions", "2"}, sh.command()...)...)
	// Sessions are of revisions before 2026-07-28 (a 2026-07-28 client
	// opens none: TestLedgerMCP_revisionsHTTP).
	a := connectHTTPRev(t, url, logs, rev1125, nil)
	connectHTTPRev(t, url, logs, rev1125, nil)
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "1"}, nil)
	legacy := &mcp.ClientSessionOptions{ProtocolVersion: rev1125}
	_, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url}, legacy)
	require.Error(t, err, "a third session is refused")
	// The refusal is logged as it is answered: the line may follow the answer.
	assert.Eventually(t, func() bool { return strings.Contains(logs.String(), "too many open") },
		10*time.Second, 10*time.Millisecond, "the refusal is logged: %s", logs.String())
	// Idle past the timeout, both are closed and a new one is taken.
	require.Eventually(t, func() bool {
		s, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url}, legacy)
		if err != nil {
			return false
		}
		_ = s.Close()
		return true
	}, 30*time.Second, 200*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = a.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Arguments: map[string]any{"order": "S1"}})
	assert.Error(t, err, "the idle session was closed")
}

// TestLedgerMCP_cancelledGetsNoResponse: on stdio, a request the client
// cancelled gets no response (MCP), though the call it forwarded runs to
// its answer and is recorded; a later request is answered.
func TestLedgerMCP_cancelledGetsNoResponse(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	cmd := exec.Command(filepath.Join(binDir, "ledger-mcp"), append([]string{"--db", filepath.Join(t.TempDir(), "mcp.db")}, sh.command()...)...)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	outPipe, err := cmd.StdoutPipe()
	require.NoError(t, err)
	logs := &testkit.Buffer{}
	cmd.Stderr = logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = in.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(outPipe)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	send := func(msg string) {
		_, err := io.WriteString(in, msg+"\n")
		require.NoError(t, err)
	}
	next := func() map[string]any {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "ledger-mcp ended:\n%s", logs.String())
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(l), &m), l)
			return m
		case <-time.After(30 * time.Second):
			t.Fatalf("no message in 30s:\n%s", logs.String())
			return nil
		}
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	require.EqualValues(t, 1, next()["id"])
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"slow","arguments":{"id":"nr1"}}}`)
	require.Eventually(t, func() bool { return sh.runs("slow", "nr1") == 1 }, 30*time.Second, 5*time.Millisecond)
	send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2,"reason":"the user changed their mind"}}`)
	// The gateway reads its input in order: once the ping after the
	// cancellation is answered, the cancellation has been read.
	send(`{"jsonrpc":"2.0","id":99,"method":"ping"}`)
	for m := next(); m["id"] == nil || m["id"] != float64(99); m = next() {
		require.NotEqual(t, float64(2), m["id"], "the cancelled request 2 got a response: %v", m)
	}
	sh.release("nr1")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "call executed") }, 30*time.Second, 5*time.Millisecond)
	send(`{"jsonrpc":"2.0","id":3,"method":"ping"}`)
	for {
		m := next()
		if m["id"] == nil {
			continue // a notification
		}
		require.EqualValues(t, 3, m["id"], "the cancelled request 2 got a response: %v", m)
		break
	}
}
