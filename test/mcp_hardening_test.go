package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate"
	"github.com/effect-ledger/effect-ledger/testkit"
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

// hostileCallKey is the key ledger-mcp on the ledger database db derives
// for a call of the hostile server's tool with arguments {"id": id}.
func hostileCallKey(t *testing.T, db, tool, id string) string {
	t.Helper()
	args, err := json.Marshal(map[string]string{"id": id})
	require.NoError(t, err)
	key, err := mcpgate.DeriveKey(fileDerivationKey(t, db), "hostile."+tool, args, "")
	require.NoError(t, err)
	return key
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
		keys = append(keys, hostileCallKey(t, db, tool, "g1"))
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
	// Seen twice in CI: H1 ran because the ledgerd answered its reserve
	// after kill(SIGSTOP) returned but before its threads had stopped (the
	// stop is taken when a thread is next scheduled, which on a loaded
	// machine can be many milliseconds later). freeze waits for the stop.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("SIGSTOP sent at %s\nledgerd logs:\n%s\nledger-mcp logs:\n%s",
				stoppedAt.Format(time.RFC3339Nano), l.Logs(), g.logs.String())
		}
	})

	stoppedAt = time.Now()
	freeze(t, l.cmd.Process.Pid)
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

// freeze sends SIGSTOP to pid and waits until every one of its threads
// is stopped: kill returns once the signal is queued, and a thread
// already running goes on serving until the stop reaches it.
func freeze(t *testing.T, pid int) {
	t.Helper()
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	require.Eventually(t, func() bool {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil || len(tasks) == 0 {
			return false
		}
		for _, task := range tasks {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
			if err != nil {
				return false
			}
			// The state follows the parenthesised command name.
			i := bytes.LastIndexByte(stat, ')')
			if i < 0 || i+2 >= len(stat) || stat[i+2] != 'T' {
				return false
			}
		}
		return true
	}, 30*time.Second, time.Millisecond, "ledgerd %d did not stop", pid)
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

// TestLedgerMCP_upstreamRestartedOnce (issue 44, item 9): over stdio, a
// stdio upstream of an older revision (a 2026-07-28 one always had one
// session) that dies is started again once, for the next call: the
// client's one session is the shared one, at every revision.
func TestLedgerMCP_upstreamRestartedOnce(t *testing.T) {
	t.Parallel()
	for _, rev := range []string{mcpgate.Version20260728, "2025-11-25"} {
		t.Run(rev, func(t *testing.T) {
			t.Parallel()
			sh := newShop(t)
			starts := filepath.Join(sh.dir, "starts")
			script := filepath.Join(t.TempDir(), "upstream.sh")
			require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho started >> '"+starts+"'\nexec '"+sh.bin+"' --dir '"+sh.dir+"' --revision 2025-11-25\n"), 0o700))
			g := startGatewayRev(t, rev, nil, "--db", filepath.Join(t.TempDir(), "mcp.db"), "--", script)
			count := func() int {
				b, err := os.ReadFile(starts)
				require.NoError(t, err)
				return strings.Count(string(b), "started\n")
			}
			res := g.call(t, "charge", map[string]any{"order": "before"}, nil)
			require.False(t, res.IsError, text(t, res))
			assert.Equal(t, 1, count(), "one upstream for the client")

			res = g.call(t, "crash", map[string]any{"id": "C1"}, nil)
			require.Equal(t, "outcome_unknown", status(res), text(t, res))
			res = g.call(t, "charge", map[string]any{"order": "after"}, nil)
			require.False(t, res.IsError, text(t, res))
			assert.Equal(t, 1, sh.runs("charge", "after"))
			assert.Equal(t, 2, count(), "started again once, after it died")
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

// TestLedgerMCP_nullMetaParamsKey: a tools/call whose params carry an
// idempotencyKey beside a null _meta is lifted like any other (the key is
// the call's key), not a crash of the gateway's stdio reader.
func TestLedgerMCP_nullMetaParamsKey(t *testing.T) {
	t.Parallel()
	sh := newHostile(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startRawGateway(t, append([]string{"--db", db}, sh.command()...)...)
	g.initialize("2025-11-25")
	params := map[string]any{"name": "job", "arguments": map[string]any{"id": "nm1"},
		"idempotencyKey": "null-meta-key-0001", "_meta": nil}
	res, e := g.request("tools/call", params)
	require.Nil(t, e, "%v\n%s", e, g.logs.String())
	assert.NotEqual(t, true, res["isError"], res)
	again, e := g.request("tools/call", params)
	require.Nil(t, e)
	assert.Equal(t, true, again["_meta"].(map[string]any)[mcpgate.MetaReplayed], again)
	assert.Equal(t, 1, sh.runs("job", "nm1"))
	g.stop()
	assert.Equal(t, "succeeded", keyState(t, db, "null-meta-key-0001"))
}
