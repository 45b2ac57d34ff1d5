package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/effect-ledger/effect-ledger/testkit"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate"
)

// rawMCP is a ledger-mcp child process driven with raw JSON-RPC lines
// over stdio: the Go SDK has no tasks client.
type rawMCP struct {
	t     *testing.T
	in    io.WriteCloser
	lines chan string
	logs  *testkit.Buffer
	cmd   *exec.Cmd
	id    int
	url   string // Streamable HTTP instead of stdio (postRaw)
}

func startRawGateway(t *testing.T, args ...string) *rawMCP {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "ledger-mcp"), args...)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	g := &rawMCP{t: t, in: in, lines: make(chan string, 64), logs: &testkit.Buffer{}, cmd: cmd}
	cmd.Stderr = g.logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = in.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			g.lines <- sc.Text()
		}
		close(g.lines)
	}()
	return g
}

// startRawHTTPGateway runs ledger-mcp on Streamable HTTP, for raw
// stateless (2026-07-28) requests.
func startRawHTTPGateway(t *testing.T, args ...string) *rawMCP {
	t.Helper()
	url, logs := startHTTPGateway(t, args...)
	return &rawMCP{t: t, url: url, logs: logs}
}

// postRaw POSTs one stateless request with the headers of MCP
// 2026-07-28 and reads its answer: JSON, or the message of an event
// stream that answers it.
func (g *rawMCP) postRaw(method string, params any, body []byte) (map[string]any, map[string]any) {
	g.t.Helper()
	req, err := http.NewRequest(http.MethodPost, g.url, bytes.NewReader(body))
	require.NoError(g.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", mcpgate.Version20260728)
	req.Header.Set("Mcp-Method", method)
	if p, ok := params.(map[string]any); ok && method == "tools/call" {
		req.Header.Set("Mcp-Name", fmt.Sprint(p["name"]))
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(g.t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(g.t, err)
	require.Equal(g.t, http.StatusOK, res.StatusCode, "%s\n%s", raw, g.logs.String())
	for _, l := range strings.Split(string(raw), "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(l, "data:"))
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil || m["id"] != float64(g.id) {
			continue
		}
		r, _ := m["result"].(map[string]any)
		e, _ := m["error"].(map[string]any)
		return r, e
	}
	g.t.Fatalf("no answer to %s: %s", method, raw)
	return nil, nil
}

// stop ends the gateway (its stdin closes) and waits for it.
func (g *rawMCP) stop() {
	if g.url != "" {
		return // the HTTP gateway ends with the test
	}
	_ = g.in.Close()
	done := make(chan error, 1)
	go func() { done <- g.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		g.t.Fatalf("ledger-mcp did not exit:\n%s", g.logs.String())
	}
}

// request sends method with params and returns the answer's result, or
// its error object.
func (g *rawMCP) request(method string, params any) (result map[string]any, rpcErr map[string]any) {
	g.t.Helper()
	g.id++
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": g.id, "method": method, "params": params})
	require.NoError(g.t, err)
	if g.url != "" {
		return g.postRaw(method, params, b)
	}
	_, err = g.in.Write(append(b, '\n'))
	require.NoError(g.t, err)
	for {
		select {
		case l, ok := <-g.lines:
			require.True(g.t, ok, "ledger-mcp ended:\n%s", g.logs.String())
			var m map[string]any
			require.NoError(g.t, json.Unmarshal([]byte(l), &m), l)
			if m["id"] != float64(g.id) {
				continue // a notification
			}
			r, _ := m["result"].(map[string]any)
			e, _ := m["error"].(map[string]any)
			return r, e
		case <-time.After(30 * time.Second):
			g.t.Fatalf("no answer to %s in 30s:\n%s", method, g.logs.String())
		}
	}
}

func (g *rawMCP) initialize(version string) map[string]any {
	g.t.Helper()
	res, e := g.request("initialize", map[string]any{"protocolVersion": version, "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "raw", "version": "1"}})
	require.Nil(g.t, e)
	_, err := io.WriteString(g.in, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
	require.NoError(g.t, err)
	return res
}

// taskOf is the task of a CreateTaskResult.
func taskOf(t *testing.T, res map[string]any) map[string]any {
	t.Helper()
	task, ok := res["task"].(map[string]any)
	require.True(t, ok, "not a task: %v", res)
	return task
}

// TestLedgerMCP_tasks: a task-augmented call (MCP 2025-11-25) through the
// gateway: capabilities.tasks and params.task reach the two ends, the
// call answers its task and stays reserved (with the task's ttl as its
// lease) while the task works, a repeat answers the same task, the
// client polls it with tasks/get to completion, the task's result is
// committed once (the task id never on the chain), and a repeat after
// that gets the recorded result. A cancelled task is recorded not_applied
// CANCELLED, so the same call may run again; a task that ends after its
// lease is committed late.
func TestLedgerMCP_tasks(t *testing.T) {
	t.Parallel()
	for _, upstream := range []string{"stdio", "http"} {
		t.Run(upstream, func(t *testing.T) {
			t.Parallel()
			sh := newHostile(t)
			db := filepath.Join(t.TempDir(), "mcp.db")
			args := append([]string{"--db", db}, sh.command()...)
			if upstream == "http" {
				args = []string{"--db", db, "--upstream", startHTTPShop(t, sh)}
			}
			testTasks(t, sh, db, startRawGateway(t, args...))
		})
	}
}

func testTasks(t *testing.T, sh *shop, db string, g *rawMCP) {
	init := g.initialize("2025-11-25")
	caps, _ := init["capabilities"].(map[string]any)
	require.Contains(t, caps, "tasks", "the upstream's capabilities.tasks: %v", init)
	assert.NotContains(t, fmt.Sprint(caps["experimental"]), "effect-ledger")

	job := func(id string) map[string]any {
		res, e := g.request("tools/call", map[string]any{"name": "job", "arguments": map[string]any{"id": id},
			"task": map[string]any{"ttl": 600000}})
		require.Nil(t, e)
		return res
	}
	first := taskOf(t, job("t1"))
	id, _ := first["taskId"].(string)
	require.NotEmpty(t, id)
	assert.Equal(t, "working", first["status"])
	assert.Equal(t, 1, sh.runs("job", "t1"))

	// A repeat while it works: the same task, nothing run again.
	again := job("t1")
	assert.Equal(t, id, taskOf(t, again)["taskId"])
	assert.Equal(t, "in_progress", again["_meta"].(map[string]any)[mcpgate.MetaStatus])
	assert.Equal(t, 1, sh.runs("job", "t1"))

	got, e := g.request("tasks/get", map[string]any{"taskId": id})
	require.Nil(t, e)
	assert.Equal(t, "working", got["status"])
	_, e = g.request("tasks/get", map[string]any{"taskId": "someone-elses"})
	require.NotNil(t, e)
	assert.EqualValues(t, -32602, e["code"])

	require.NoError(t, os.WriteFile(filepath.Join(sh.dir, "finish-t1"), nil, 0o600))
	for range 2 { // polled twice, committed once
		got, e = g.request("tasks/get", map[string]any{"taskId": id})
		require.Nil(t, e)
		assert.Equal(t, "completed", got["status"])
	}
	res, e := g.request("tasks/result", map[string]any{"taskId": id})
	require.Nil(t, e)
	assert.Contains(t, fmt.Sprint(res["content"]), "job t1 done")

	// After it ended: the recorded result, not run again.
	replay := job("t1")
	assert.NotContains(t, replay, "task")
	assert.Equal(t, true, replay["_meta"].(map[string]any)[mcpgate.MetaReplayed], replay)
	assert.Contains(t, fmt.Sprint(replay["content"]), "job t1 done")
	assert.Equal(t, 1, sh.runs("job", "t1"))
	assert.Equal(t, 1, strings.Count(g.logs.String(), "task executed"), g.logs.String())

	// Cancelled: recorded not_applied, so the same call runs again.
	id2, _ := taskOf(t, job("t2"))["taskId"].(string)
	cancelled, e := g.request("tasks/cancel", map[string]any{"taskId": id2})
	require.Nil(t, e)
	assert.Equal(t, "cancelled", cancelled["status"])
	got, e = g.request("tasks/get", map[string]any{"taskId": id2})
	require.Nil(t, e)
	assert.Equal(t, "cancelled", got["status"])
	assert.Equal(t, "working", taskOf(t, job("t2"))["status"], "a cancelled call runs again")
	assert.Equal(t, 2, sh.runs("job", "t2"))
	assert.Equal(t, 2, strings.Count(g.logs.String(), "task executed"), g.logs.String())

	// A task that ends after its lease (its ttl) is committed late.
	res, e = g.request("tools/call", map[string]any{"name": "job", "arguments": map[string]any{"id": "late"},
		"task": map[string]any{"ttl": 200}})
	require.Nil(t, e)
	idLate, _ := taskOf(t, res)["taskId"].(string)
	time.Sleep(400 * time.Millisecond)
	require.NoError(t, os.WriteFile(filepath.Join(sh.dir, "finish-late"), nil, 0o600))
	got, e = g.request("tasks/get", map[string]any{"taskId": idLate})
	require.Nil(t, e)
	assert.Equal(t, "completed", got["status"])

	g.stop()
	keyLate := hostileCallKey(t, db, "job", "late")
	assert.Equal(t, "succeeded", keyState(t, db, keyLate), "committed after the lease")
	key1 := hostileCallKey(t, db, "job", "t1")
	assert.Equal(t, "succeeded", keyState(t, db, key1))
	out, errOut, code := ledgerctl(t, "show", key1, "--db", db, "--json")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "job t1 done")
	var shown struct {
		Receipts []struct {
			Kind           string `json:"kind"`
			LeaseExpiresAt int64  `json:"lease_expires_at"`
			RecordedAt     int64  `json:"recorded_at"`
		} `json:"receipts"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &shown), out)
	require.NotEmpty(t, shown.Receipts)
	assert.Equal(t, "reserve", shown.Receipts[0].Kind)
	assert.EqualValues(t, 600000, shown.Receipts[0].LeaseExpiresAt-shown.Receipts[0].RecordedAt, "the task's ttl is the lease")
	assert.NotContains(t, out, "hostile-task-", "the task id stays off the chain")
	key2 := hostileCallKey(t, db, "job", "t2")
	out, _, _ = ledgerctl(t, "show", key2, "--db", db, "--json")
	assert.Contains(t, out, `"error_code":"CANCELLED"`)
	verified(t, db)
}

type taskIDParams struct {
	mcp.ParamsBase
	TaskID string `json:"taskId"`
}

type taskStatusResult struct {
	mcp.ResultBase
	TaskID string `json:"taskId"`
	Status string `json:"status"`
}

type taskListResult struct {
	mcp.ResultBase
	Tasks []taskStatusResult `json:"tasks"`
}

// TestLedgerMCP_tasksOtherSession: over Streamable HTTP (2025-11-25
// sessions), a task's handle serves only the session that made the call: another session's
// tasks/get is invalid params, and its repeat of the call is
// in_progress without the task.
func TestLedgerMCP_tasksOtherSession(t *testing.T) {
	t.Parallel()
	sh := newHostile(t)
	url, logs := startHTTPGateway(t, append([]string{"--db", filepath.Join(t.TempDir(), "mcp.db")}, sh.command()...)...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	connect := func() *mcp.ClientSession {
		c := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "1"}, nil)
		require.NoError(t, mcp.AddSendingCustomMethod[*taskIDParams, *taskStatusResult](c, "tasks/get"))
		require.NoError(t, mcp.AddSendingCustomMethod[*taskIDParams, *taskListResult](c, "tasks/list"))
		s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := connect(), connect()
	// The Go SDK's client cannot send params.task; the gateway carries it
	// in this _meta member between its transports, so the test sends it
	// there.
	call := func(s *mcp.ClientSession) *mcp.CallToolResult {
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "job", Arguments: map[string]any{"id": "o1"},
			Meta: mcp.Meta{"io.effect-ledger/params.task": map[string]any{"ttl": 60000}}})
		require.NoError(t, err)
		return res
	}
	require.False(t, call(a).IsError)
	// The client knows its task by the gateway's handle, which tasks/list
	// names; the upstream's own id is no handle.
	list := func(s *mcp.ClientSession) []taskStatusResult {
		res, err := mcp.CallCustomMethod[*taskIDParams, *taskListResult](ctx, s, "tasks/list", &taskIDParams{})
		require.NoError(t, err, logs.String())
		return res.Tasks
	}
	mine := list(a)
	require.Len(t, mine, 1)
	id := mine[0].TaskID
	assert.NotContains(t, id, "hostile-task-")
	assert.Empty(t, list(b), "another session's tasks are not listed")
	got, err := mcp.CallCustomMethod[*taskIDParams, *taskStatusResult](ctx, a, "tasks/get", &taskIDParams{TaskID: id})
	require.NoError(t, err, logs.String())
	assert.Equal(t, "working", got.Status)
	assert.Equal(t, id, got.TaskID)
	for s, taskID := range map[*mcp.ClientSession]string{b: id, a: "hostile-task-1"} {
		_, err = mcp.CallCustomMethod[*taskIDParams, *taskStatusResult](ctx, s, "tasks/get", &taskIDParams{TaskID: taskID})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "unknown task")
	}
	other := call(b)
	assert.True(t, other.IsError)
	assert.Equal(t, "in_progress", other.Meta[mcpgate.MetaStatus])
	again := call(a)
	assert.False(t, again.IsError, "the session that made it gets its task again")
	assert.Equal(t, "in_progress", again.Meta[mcpgate.MetaStatus])
	assert.Equal(t, 1, sh.runs("job", "o1"))
}

// request2026 sends a stateless MCP 2026-07-28 request: its _meta names
// the revision, the client and its capabilities, here the tasks
// extension unless plain.
func (g *rawMCP) request2026(method string, params map[string]any, plain bool) (map[string]any, map[string]any) {
	caps := map[string]any{"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}}
	if plain {
		caps = map[string]any{}
	}
	params["_meta"] = map[string]any{mcp.MetaKeyProtocolVersion: mcpgate.Version20260728,
		mcp.MetaKeyClientInfo: map[string]any{"name": "raw", "version": "1"}, mcp.MetaKeyClientCapabilities: caps}
	return g.request(method, params)
}

// TestLedgerMCP_tasksExtension: the tasks extension of MCP 2026-07-28
// (SEP-2663) through the gateway, with an upstream of that revision on
// stdio and on Streamable HTTP: the extension is advertised and the
// client's declaration reaches the upstream; a call the upstream answers
// with a task stays reserved while it works (a repeat answers the same
// task, nothing runs again); tasks/get carries the terminal result,
// committed once; input_required passes through and tasks/update reaches
// the upstream; a failed task is recorded as any error answer
// (not_applied MCP_ERROR, the gateway's default for a tool's errors), a
// cancelled one not_applied CANCELLED even though the client never polls
// again; a
// client without the extension gets a plain call; verify stays clean and
// no task id reaches the chain.
func TestLedgerMCP_tasksExtension(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ client, upstream string }{{"stdio", "stdio"}, {"stdio", "http"}, {"http", "stdio"}} {
		t.Run(c.client+"-"+c.upstream, func(t *testing.T) {
			t.Parallel()
			sh := newHostile(t)
			db := filepath.Join(t.TempDir(), "mcp.db")
			args := []string{"--db", db, "--", sh.bin, "--dir", sh.dir, "--revision", "2026-07-28"}
			if c.upstream == "http" {
				args = []string{"--db", db, "--upstream", startHTTPShop(t, sh, "--revision", "2026-07-28")}
			}
			if c.client == "http" {
				g := startRawHTTPGateway(t, args...)
				testTasksExtension(t, sh, db, g)
				return
			}
			testTasksExtension(t, sh, db, startRawGateway(t, args...))
		})
	}
}

func testTasksExtension(t *testing.T, sh *shop, db string, g *rawMCP) {
	disc, e := g.request2026("server/discover", map[string]any{}, false)
	require.Nil(t, e)
	assert.Contains(t, fmt.Sprint(disc["capabilities"]), "io.modelcontextprotocol/tasks", disc)
	call := func(id string, plain bool) map[string]any {
		res, e := g.request2026("tools/call", map[string]any{"name": "job", "arguments": map[string]any{"id": id}}, plain)
		require.Nil(t, e)
		return res
	}
	get := func(id string) map[string]any {
		res, e := g.request2026("tasks/get", map[string]any{"taskId": id}, false)
		require.Nil(t, e, "tasks/get %s", id)
		assert.Equal(t, "complete", res["resultType"])
		return res
	}
	finish := func(arg string) { require.NoError(t, os.WriteFile(filepath.Join(sh.dir, "finish-"+arg), nil, 0o600)) }
	executed := func(n int) {
		require.Eventually(t, func() bool { return strings.Count(g.logs.String(), "task executed") == n },
			10*time.Second, 20*time.Millisecond, g.logs.String())
	}

	first := call("e1", false)
	require.Equal(t, "task", first["resultType"], first)
	id, _ := first["taskId"].(string)
	require.NotEmpty(t, id)
	assert.Equal(t, "working", first["status"])
	again := call("e1", false)
	assert.Equal(t, "task", again["resultType"], again)
	assert.Equal(t, id, again["taskId"])
	assert.Equal(t, "in_progress", again["_meta"].(map[string]any)[mcpgate.MetaStatus])
	assert.Equal(t, 1, sh.runs("job", "e1"))
	assert.Equal(t, "working", get(id)["status"])
	finish("e1")
	for range 2 { // polled twice, committed once
		done := get(id)
		assert.Equal(t, "completed", done["status"])
		assert.Contains(t, fmt.Sprint(done["result"]), "job e1 done")
	}
	executed(1)
	replay := call("e1", false)
	assert.Equal(t, "complete", replay["resultType"], replay)
	assert.Equal(t, true, replay["_meta"].(map[string]any)[mcpgate.MetaReplayed], replay)
	assert.Contains(t, fmt.Sprint(replay["content"]), "job e1 done")
	assert.Equal(t, 1, sh.runs("job", "e1"))

	// Input during the task: passed through, answered with tasks/update.
	askID, _ := call("ask-1", false)["taskId"].(string)
	asked := get(askID)
	assert.Equal(t, "input_required", asked["status"])
	assert.Contains(t, fmt.Sprint(asked["inputRequests"]), "elicitation/create")
	ack, e := g.request2026("tasks/update", map[string]any{"taskId": askID,
		"inputResponses": map[string]any{"confirm": map[string]any{"action": "accept", "content": map[string]any{"ok": true}}}}, false)
	require.Nil(t, e)
	assert.Equal(t, "complete", ack["resultType"])
	finish("ask-1")
	assert.Contains(t, fmt.Sprint(get(askID)["result"]), "job ask-1 done (accept)")
	executed(2)

	// A JSON-RPC failure of the task, and a cancel nobody polls after.
	failID, _ := call("fail-1", false)["taskId"].(string)
	finish("fail-1")
	assert.Equal(t, "failed", get(failID)["status"])
	executed(3)
	cancelID, _ := call("c1", false)["taskId"].(string)
	ack, e = g.request2026("tasks/cancel", map[string]any{"taskId": cancelID}, false)
	require.Nil(t, e)
	assert.Equal(t, "complete", ack["resultType"])
	executed(4)

	// No extension declared: the upstream answers the call itself.
	plain := call("p1", true)
	assert.NotContains(t, plain, "taskId")
	assert.Contains(t, fmt.Sprint(plain["content"]), "job p1 done")

	g.stop()
	for arg, want := range map[string]string{"e1": "succeeded", "ask-1": "succeeded", "fail-1": "not_applied", "c1": "not_applied", "p1": "succeeded"} {
		key := hostileCallKey(t, db, "job", arg)
		out, errOut, code := ledgerctl(t, "show", key, "--db", db, "--json")
		require.Equal(t, 0, code, errOut)
		assert.Contains(t, out, `"outcome":"`+want+`"`, arg)
		assert.NotContains(t, out, "hostile-task-", "the task id stays off the chain")
		switch arg {
		case "c1":
			assert.Contains(t, out, `"error_code":"CANCELLED"`)
		case "fail-1":
			assert.Contains(t, out, `"error_message":"the job failed upstream"`)
		}
	}
	verified(t, db)
}

// TestLedgerMCP_taskAfterRestart: a task outlives the gateway that
// started it. The client's handle seals the task with its reservation,
// so after a restart (same ledger, an upstream on Streamable HTTP that
// kept the task) its tasks/get is forwarded and the task's result is
// committed once; a handle altered by one byte is invalid params.
func TestLedgerMCP_taskAfterRestart(t *testing.T) {
	t.Parallel()
	sh := newHostile(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	args := []string{"--db", db, "--upstream", startHTTPShop(t, sh, "--revision", "2026-07-28")}
	g := startRawGateway(t, args...)
	res, e := g.request2026("tools/call", map[string]any{"name": "job", "arguments": map[string]any{"id": "r1"}}, false)
	require.Nil(t, e)
	handle, _ := res["taskId"].(string)
	require.NotEmpty(t, handle, res)
	g.stop()

	g = startRawGateway(t, args...)
	get := func(id string) (map[string]any, map[string]any) {
		return g.request2026("tasks/get", map[string]any{"taskId": id}, false)
	}
	got, e := get(handle)
	require.Nil(t, e, g.logs.String())
	assert.Equal(t, "working", got["status"])
	assert.Equal(t, handle, got["taskId"])
	altered := []byte(handle)
	altered[len(altered)/2] ^= 1
	_, e = get(string(altered))
	require.NotNil(t, e)
	assert.EqualValues(t, -32602, e["code"])
	require.NoError(t, os.WriteFile(filepath.Join(sh.dir, "finish-r1"), nil, 0o600))
	got, e = get(handle)
	require.Nil(t, e)
	assert.Equal(t, "completed", got["status"])
	assert.Contains(t, fmt.Sprint(got["result"]), "job r1 done")
	replay, e := g.request2026("tools/call", map[string]any{"name": "job", "arguments": map[string]any{"id": "r1"}}, false)
	require.Nil(t, e)
	assert.Equal(t, true, replay["_meta"].(map[string]any)[mcpgate.MetaReplayed], replay)
	assert.Equal(t, 1, sh.runs("job", "r1"))
	g.stop()
	assert.Equal(t, 1, strings.Count(g.logs.String(), "task taken up"), g.logs.String())
	assert.Equal(t, 1, strings.Count(g.logs.String(), "task executed"), g.logs.String())

	key := hostileCallKey(t, db, "job", "r1")
	assert.Equal(t, "succeeded", keyState(t, db, key))
	verified(t, db)
}

// TestLedgerMCP_staleTaskHandle: after a restart that lost the upstream's
// task (a stdio upstream restarts with the gateway), the old handle's
// tasks/get is the upstream's error, and the call is still decided by
// the ledger: its recorded result is replayed, not an in_progress that
// never ends.
func TestLedgerMCP_staleTaskHandle(t *testing.T) {
	t.Parallel()
	sh := newHostile(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	args := []string{"--db", db, "--", sh.bin, "--dir", sh.dir, "--revision", "2026-07-28"}
	g := startRawGateway(t, args...)
	call := func() map[string]any {
		res, e := g.request2026("tools/call", map[string]any{"name": "job", "arguments": map[string]any{"id": "st1"}}, false)
		require.Nil(t, e)
		return res
	}
	handle, _ := call()["taskId"].(string)
	require.NotEmpty(t, handle)
	require.NoError(t, os.WriteFile(filepath.Join(sh.dir, "finish-st1"), nil, 0o600))
	got, e := g.request2026("tasks/get", map[string]any{"taskId": handle}, false)
	require.Nil(t, e)
	require.Equal(t, "completed", got["status"])
	g.stop()

	g = startRawGateway(t, args...)
	_, e = g.request2026("tasks/get", map[string]any{"taskId": handle}, false)
	require.NotNil(t, e, "the restarted upstream does not know the task")
	replay := call()
	assert.Equal(t, true, replay["_meta"].(map[string]any)[mcpgate.MetaReplayed], replay)
	assert.Equal(t, 1, sh.runs("job", "st1"))
}

// TestLedgerMCP_parkedCallNoTask: a 2026-07-28 client's call to an
// upstream of 2025-11-25 runs as a plain call even with params.task: the
// gateway, which speaks for that client on a session of its own, makes
// no task it could not poll.
func TestLedgerMCP_parkedCallNoTask(t *testing.T) {
	t.Parallel()
	sh := newHostile(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startRawGateway(t, append([]string{"--db", db}, sh.command()...)...)
	res, e := g.request2026("tools/call", map[string]any{"name": "job", "arguments": map[string]any{"id": "pt1"},
		"task": map[string]any{"ttl": 60000}}, false)
	require.Nil(t, e)
	assert.NotContains(t, res, "task")
	assert.NotContains(t, res, "taskId")
	assert.Contains(t, fmt.Sprint(res["content"]), "job pt1 done")
	g.stop()
	key := hostileCallKey(t, db, "job", "pt1")
	assert.Equal(t, "succeeded", keyState(t, db, key))
}
