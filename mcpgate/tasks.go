package mcpgate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// Tasks (SPEC §11.1, MCP 2025-11-25 "tasks"): a task-augmented tools/call
// answers a task handle at once and runs on; the client polls it with
// tasks/get and fetches its result with tasks/result. The SDK knows none
// of it: it drops capabilities.tasks and params.task when it decodes
// them, and answers tasks/* -32601. So the upstream connection moves the
// upstream's capabilities.tasks where the SDK keeps it
// (capabilities.experimental[expTasks]) and the gateway gives it back to
// the client; the client's params.task rides in _meta[metaParamsTask]
// from the client's transport to the upstream's (key.go, raw.go); and
// tasks/* are custom methods forwarded to the upstream that owns the
// task. The call stays reserved while its task runs; the first terminal
// status the gateway sees is committed, once.
//
// MCP 2026-07-28 moved tasks into an extension (io.modelcontextprotocol/
// tasks, SEP-2663): the client declares it in its request's capabilities
// (describeClient forwards them), the server decides to answer a task
// (resultType "task", the task's members at the top), tasks/get carries
// the terminal result or error inline, tasks/update delivers the answers
// to a task's inputRequests, tasks/cancel is an empty acknowledgement and
// there is no tasks/result. Such a task is ext.
//
// The client sees a task by its handle (taskhandle.go), which seals the
// upstream's task id with the call's reservation: the gateway keeps the
// tasks it started in memory, and a handle it does not know (after a
// restart, or from another replica) is opened and the task taken up
// again. A handle never goes on the chain, and only the client that made
// the call (taskOwner) may use it.

const (
	// metaParamsTask carries a call's params.task from the client's
	// transport to the upstream's.
	metaParamsTask = "io.effect-ledger/params.task"
	// expTasks is where the upstream connection keeps the upstream's
	// capabilities.tasks, which the SDK's types do not have.
	expTasks = "io.effect-ledger/tasks"
	// metaRelatedTask names a task in a result's _meta (MCP 2025-11-25).
	metaRelatedTask = "io.modelcontextprotocol/related-task"
	// CodeCancelled is the not_applied code of a task cancelled before it
	// acted (SPEC §11.1).
	CodeCancelled = "CANCELLED"
	// maxTaskLease bounds a task-augmented call's lease: the ledger's
	// largest lease_ms.
	maxTaskLease = ledger.MaxLeaseMS * time.Millisecond
)

// taskMethods are the methods of the tasks utility forwarded upstream
// (tasks/list is answered from the caller's own tasks).
var taskMethods = []string{"tasks/get", "tasks/result", "tasks/cancel", "tasks/update"}

// runningTask is a task the gateway handed out.
type runningTask struct {
	mu     sync.Mutex
	id     string // the upstream's task id
	handle string // the client's taskId (taskhandle.go)
	key    string // the call's idempotency key; "" for a read
	rsv    *Reservation
	c      *call
	owner  string             // taskOwner of the call
	up     *mcp.ClientSession // the upstream session that owns the task
	last   json.RawMessage    // the task as last seen: {taskId, status, …}
	done   bool               // its terminal status is committed
	ext    bool               // a task of the 2026-07-28 extension
	// takenUp: made from a handle (taskhandle.go), not yet seen running;
	// watching: a goroutine polls it after a cancel. Under mu.
	takenUp, watching bool
	settledAt         atomic.Int64 // unix ms when done, for prune
}

// taskTable holds the tasks of this process.
type taskTable struct {
	mu    sync.Mutex
	byID  map[string]*runningTask
	byKey map[string]*runningTask
}

func newTaskTable() *taskTable {
	return &taskTable{byID: map[string]*runningTask{}, byKey: map[string]*runningTask{}}
}

func (t *taskTable) add(r *runningTask) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old := t.byID[r.handle]; old != nil {
		return // taken up twice at once: the first stays
	}
	t.byID[r.handle] = r
	if r.key != "" {
		t.byKey[r.key] = r
	}
}

// addHandle keeps a task by its handle only (takeUp): it answers the
// repeats of its call once track says it runs.
func (t *taskTable) addHandle(r *runningTask) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byID[r.handle] == nil {
		t.byID[r.handle] = r
	}
}

func (t *taskTable) get(id string) *runningTask {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byID[id]
}

// running is the task of a key that is not terminal yet, if any.
func (t *taskTable) running(key string) *runningTask {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byKey[key]
}

// settled forgets a key's task once its outcome is committed: the next
// identical call gets the recorded result from the ledger.
func (t *taskTable) settled(r *runningTask) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byKey[r.key] == r {
		delete(t.byKey, r.key)
	}
}

func (t *taskTable) ownedBy(owner string) []json.RawMessage {
	t.mu.Lock()
	var mine []*runningTask
	for _, r := range t.byID {
		if r.owner == owner {
			mine = append(mine, r)
		}
	}
	t.mu.Unlock()
	// Each task's lock is taken without the table's: settle holds a
	// task's while it reaches the table.
	out := make([]json.RawMessage, 0, len(mine))
	for _, r := range mine {
		r.mu.Lock()
		if r.last != nil {
			out = append(out, r.last)
		}
		r.mu.Unlock()
	}
	return out
}

// forget removes a task the gateway took up but its upstream does not
// know (taskhandle.go).
func (t *taskTable) forget(r *runningTask) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byID[r.handle] == r {
		delete(t.byID, r.handle)
	}
	if t.byKey[r.key] == r {
		delete(t.byKey, r.key)
	}
}

// track makes a task taken up answer the repeats of its call, once its
// upstream has shown it still runs.
func (t *taskTable) track(r *runningTask) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.key != "" && t.byKey[r.key] == nil && t.byID[r.handle] == r {
		t.byKey[r.key] = r
	}
}

// prune forgets tasks settled more than settledKeep ago.
func (t *taskTable) prune(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, r := range t.byID {
		if s := r.settledAt.Load(); s != 0 && now.Sub(time.UnixMilli(s)) > settledKeep {
			delete(t.byID, id)
		}
	}
}

// settledKeep is how long a settled task stays listed (tasks/list) and
// pollable through the gateway's memory.
const settledKeep = time.Hour

// taskOf reads the task of an answer: a 2025-11-25 CreateTaskResult
// ({"task": {taskId, status, …}}) or a 2026-07-28 one (resultType
// "task", the task's members at the top).
func taskOf(raw json.RawMessage) (id string, obj json.RawMessage, ok bool) {
	if len(raw) == 0 || !bytes.Contains(raw, []byte(`task`)) {
		return "", nil, false
	}
	var m struct {
		Task       json.RawMessage `json:"task"`
		ResultType string          `json:"resultType"`
		TaskID     string          `json:"taskId"`
	}
	if json.Unmarshal(raw, &m) != nil {
		return "", nil, false
	}
	if m.ResultType == "task" && m.TaskID != "" {
		return m.TaskID, withoutMeta(raw), true
	}
	var t struct {
		TaskID string `json:"taskId"`
	}
	if len(m.Task) == 0 || json.Unmarshal(m.Task, &t) != nil || t.TaskID == "" {
		return "", nil, false
	}
	return t.TaskID, m.Task, true
}

// taskStatus reads a task's status from a tasks/get or tasks/cancel
// answer (the task's members at the top).
func taskStatus(raw json.RawMessage) (status, message string) {
	var t struct {
		Status        string `json:"status"`
		StatusMessage string `json:"statusMessage"`
	}
	_ = json.Unmarshal(raw, &t)
	return t.Status, t.StatusMessage
}

func terminal(status string) bool {
	return status == "completed" || status == "failed" || status == "cancelled"
}

// withoutMeta is a JSON object without its _meta member.
func withoutMeta(raw json.RawMessage) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return raw
	}
	if _, ok := m["_meta"]; !ok {
		return raw
	}
	delete(m, "_meta")
	b, err := json.Marshal(m)
	if err != nil {
		return raw
	}
	return b
}

// withoutRelatedTask drops _meta[metaRelatedTask] from a result, so the
// task id stays off the chain.
func withoutRelatedTask(raw json.RawMessage) json.RawMessage {
	if !bytes.Contains(raw, []byte(metaRelatedTask)) {
		return raw
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return raw
	}
	var meta map[string]json.RawMessage
	if json.Unmarshal(m["_meta"], &meta) != nil {
		return raw
	}
	delete(meta, metaRelatedTask)
	if len(meta) == 0 {
		delete(m, "_meta")
	} else if b, err := json.Marshal(meta); err == nil {
		m["_meta"] = b
	}
	b, err := json.Marshal(m)
	if err != nil {
		return raw
	}
	return b
}

// taskLease is the lease of a call: a task-augmented call's is its task's
// ttl, at most maxTaskLease; a task without ttl, or a plain call, has the
// gateway's.
func taskLease(meta mcp.Meta, def time.Duration) time.Duration {
	t, ok := meta[metaParamsTask].(map[string]any)
	if !ok {
		return def
	}
	ttl, ok := t["ttl"].(float64)
	if !ok || ttl <= 0 {
		return def
	}
	d := time.Duration(ttl) * time.Millisecond
	switch {
	case d > maxTaskLease:
		return maxTaskLease
	case d < time.Duration(ledger.MinLeaseMS)*time.Millisecond:
		return time.Duration(ledger.MinLeaseMS) * time.Millisecond
	}
	return d
}

// startTask keeps the task a reserved call answered: nothing is
// committed until the task ends.
func (g *Gateway) startTask(ctx context.Context, c *call, rsv *Reservation, id string, obj json.RawMessage, reply mcp.Result) mcp.Result {
	callsTotal.WithLabelValues(c.toolLabel, DecisionExecuted).Inc()
	// Only the extension's task handle has a resultType among its
	// members (2025-11-25's is {"task": {…}}).
	r := &runningTask{id: id, handle: id, c: c, owner: ownerOf(ctx), up: c.up, rsv: rsv, ext: hasMember(obj, "resultType")}
	h := taskHandle{ID: id, Tool: c.name, Failed: !c.class.errorsApplyNothing(), Ext: r.ext, Owner: r.owner,
		Exp: time.Now().Add(maxHandleAge).UnixMilli()}
	if rsv != nil {
		r.key, h.Key, h.Token = rsv.Key, rsv.Key, rsv.Token
		g.logger.InfoContext(ctx, "call running as a task", "tool", c.ledgerTool, "key", rsv.Key)
	}
	if key, err := g.stateKey(); err != nil {
		g.logger.WarnContext(ctx, "task handle not sealed: the task is known to this process only", "err", err)
	} else if r.handle, err = sealHandle(key, h); err != nil {
		g.logger.WarnContext(ctx, "task handle not sealed: the task is known to this process only", "err", err)
		r.handle = id
	}
	r.last = renameTask(obj, id, r.handle)
	g.tasks.prune(time.Now())
	g.tasks.add(r)
	if rr, ok := reply.(rawResult); ok {
		reply = rr.withRaw(renameTask(rr.rawJSON(), id, r.handle))
	}
	return reply
}

// takeUp is the task of a handle this process did not hand out (it
// restarted, or another replica did): opened, and kept from now on.
func (g *Gateway) takeUp(ctx context.Context, handle string) (*runningTask, error) {
	key, err := g.stateKey()
	if err != nil {
		return nil, err
	}
	h, err := openHandle(key, handle, ownerOf(ctx), time.Now())
	if err != nil {
		return nil, err
	}
	s, err := g.up.Session(ctx)
	if err != nil {
		return nil, err
	}
	c := &call{name: h.Tool, ledgerTool: LedgerToolName(g.cfg.ServerName, h.Tool), toolLabel: unlistedToolLabel}
	if h.Failed {
		c.class.OnError = OnErrorFailed
	}
	r := &runningTask{id: h.ID, handle: handle, c: c, owner: h.Owner, up: s, ext: h.Ext, key: h.Key, takenUp: true}
	if h.Key != "" {
		r.rsv = &Reservation{Status: ledger.StatusReserved, Key: h.Key, Token: h.Token}
	}
	g.tasks.addHandle(r)
	g.logger.InfoContext(ctx, "task taken up", "tool", c.ledgerTool, "key", h.Key)
	return g.tasks.get(handle), nil
}

// runningAnswer answers a repeat of a call whose task runs: to the
// session that made the call, the task again; to another, in_progress.
func (g *Gateway) runningAnswer(ctx context.Context, c *call, key string) mcp.Result {
	r := g.tasks.running(key)
	if r == nil {
		return nil
	}
	callsTotal.WithLabelValues(c.toolLabel, DecisionRefused).Inc()
	if r.owner == ownerOf(ctx) {
		if b, err := r.createResult(map[string]any{MetaStatus: ledger.ECodeInProgress, MetaKey: key}); err == nil {
			return rawCall{&mcp.CallToolResult{}, b}
		}
	}
	return answer(ledger.ECodeInProgress, key, fmt.Sprintf("The same call is still running as a task; it was not "+
		"started again (idempotency key %s). Call it again once it has finished to get its result.", key))
}

// createResult is the task's handle again, as a call's answer with meta: a
// 2025-11-25 CreateTaskResult, or the extension's (resultType "task" and
// the task's members, none of its status's).
func (r *runningTask) createResult(meta map[string]any) (json.RawMessage, error) {
	r.mu.Lock()
	last := r.last
	r.mu.Unlock()
	if !r.ext {
		return json.Marshal(map[string]any{"task": last, "_meta": meta})
	}
	return withMembers(last, map[string]any{"resultType": "task", "_meta": meta,
		"result": nil, "error": nil, "inputRequests": nil})
}

// settle commits a task's terminal status, once: completed → succeeded
// with the task's result (fetched with tasks/result unless given),
// failed → failed, cancelled → not_applied CANCELLED.
func (g *Gateway) settle(ctx context.Context, s *mcp.ClientSession, r *runningTask, status, message string, result json.RawMessage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done || r.rsv == nil {
		if !r.done {
			r.done = true
			r.settledAt.Store(time.Now().UnixMilli())
		}
		return
	}
	var o Outcome
	switch status {
	case "completed":
		if result == nil && r.ext {
			return // the extension's tasks/get carries it: the next poll
		}
		if result == nil {
			res, err := mcp.CallCustomMethod[*taskParams, *taskResult](ctx, s, "tasks/result", taskRequest(r.id))
			if err != nil {
				g.logger.WarnContext(ctx, "task result not read: its outcome is recorded later", "key", r.key, "err", err)
				return
			}
			result = res.raw
		}
		result = withoutRelatedTask(result)
		var res mcp.CallToolResult
		if err := json.Unmarshal(result, &res); err == nil && res.IsError {
			o = toolError(firstText(&res))
		} else {
			o = Outcome{Succeeded: true, Result: recordedResult(&res, result)}
		}
	case "failed":
		if message == "" {
			message = "the task failed"
		}
		o = Outcome{ErrorCode: CodeMCPError, ErrorMessage: truncate(message, maxFailureMessage)}
	case "cancelled":
		o = Outcome{NotApplied: true, ErrorCode: CodeCancelled, ErrorMessage: "the task was cancelled"}
	default:
		return
	}
	if !o.Succeeded && !o.NotApplied {
		o.NotApplied = r.c.class.errorsApplyNothing()
	}
	cmctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	err := g.commit(cmctx, r.rsv, o)
	var refusal *Refusal
	if err != nil && !errors.As(err, &refusal) {
		// The ledger could not be reached: the next poll tries again.
		g.logger.ErrorContext(ctx, "task outcome not recorded", "tool", r.c.ledgerTool, "key", r.key, "err", err)
		return
	}
	r.done = true
	r.settledAt.Store(time.Now().UnixMilli())
	g.tasks.settled(r)
	if err != nil {
		g.logger.ErrorContext(ctx, "task outcome refused by the ledger", "tool", r.c.ledgerTool, "key", r.key, "err", err)
		return
	}
	g.logger.InfoContext(ctx, "task executed", "tool", r.c.ledgerTool, "key", r.key, "outcome", o.outcomeName())
}

// taskParams are the params of a tasks/* request, kept as they came.
type taskParams struct {
	mcp.ParamsBase
	raw json.RawMessage
}

func (p *taskParams) UnmarshalJSON(b []byte) error {
	p.raw = bytes.Clone(b)
	var m struct {
		Meta mcp.Meta `json:"_meta"`
	}
	_ = json.Unmarshal(b, &m)
	p.Meta = m.Meta
	return nil
}

func (p *taskParams) MarshalJSON() ([]byte, error) {
	if len(p.raw) == 0 {
		return []byte(`{}`), nil
	}
	return p.raw, nil
}

func (p *taskParams) taskID() string {
	var m struct {
		TaskID string `json:"taskId"`
	}
	_ = json.Unmarshal(p.raw, &m)
	return m.TaskID
}

func taskRequest(id string) *taskParams {
	b, _ := json.Marshal(map[string]string{"taskId": id})
	return &taskParams{raw: b}
}

// taskResult is the answer of a tasks/* request, kept as it came.
type taskResult struct {
	mcp.ResultBase
	raw json.RawMessage
}

func (r *taskResult) UnmarshalJSON(b []byte) error {
	r.raw = bytes.Clone(b)
	return nil
}

func (r *taskResult) MarshalJSON() ([]byte, error) {
	if len(r.raw) == 0 {
		return []byte(`{}`), nil
	}
	return r.raw, nil
}

// addTaskMethods makes the downstream server answer tasks/*, and the
// upstream client send them.
func (g *Gateway) addTaskMethods(s *mcp.Server) {
	for _, m := range taskMethods {
		_ = mcp.AddReceivingCustomMethod(s, m, g.taskMethod(m))
		_ = mcp.AddSendingCustomMethod[*taskParams, *taskResult](g.up.client, m)
	}
	_ = mcp.AddReceivingCustomMethod(s, "tasks/list", func(ctx context.Context, _ *mcp.ServerSession, _ *taskParams) (*taskResult, error) {
		tasks := g.tasks.ownedBy(ownerOf(ctx))
		if tasks == nil {
			tasks = []json.RawMessage{}
		}
		b, err := json.Marshal(map[string]any{"tasks": tasks})
		if err != nil {
			return nil, err
		}
		return &taskResult{raw: b}, nil
	})
}

// taskMethod forwards a tasks/* request of the session that made the
// task to the upstream, and commits the first terminal status it sees.
func (g *Gateway) taskMethod(method string) func(context.Context, *mcp.ServerSession, *taskParams) (*taskResult, error) {
	return func(ctx context.Context, _ *mcp.ServerSession, p *taskParams) (*taskResult, error) {
		if p == nil {
			p = &taskParams{}
		}
		r := g.tasks.get(p.taskID())
		if r == nil && strings.HasPrefix(p.taskID(), handlePrefix) {
			var err error
			if r, err = g.takeUp(ctx, p.taskID()); err != nil {
				if errors.Is(err, errHandle) {
					return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
				}
				return nil, err
			}
		}
		if r == nil || r.owner != ownerOf(ctx) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: errHandle.Error()}
		}
		s := r.up // the upstream that owns the task
		res, err := mcp.CallCustomMethod[*taskParams, *taskResult](ctx, s, method, &taskParams{raw: withTaskID(p.raw, r.id)})
		r.mu.Lock()
		takenUp := r.takenUp
		r.takenUp = takenUp && err != nil
		r.mu.Unlock()
		if err != nil {
			if takenUp {
				g.tasks.forget(r) // the upstream knows it no more, or not here
			}
			return nil, err
		}
		if takenUp {
			g.tasks.track(r)
		}
		res.raw = renameTask(res.raw, r.id, r.handle)
		switch method {
		case "tasks/result":
			g.settle(ctx, s, r, "completed", "", res.raw)
		case "tasks/get", "tasks/cancel", "tasks/update":
			g.saw(ctx, s, r, res.raw)
			if method == "tasks/cancel" && r.ext && r.watch() {
				// An acknowledgement only, and the client need not poll
				// again: the gateway polls for the task's end itself.
				go g.watchCancelled(context.WithoutCancel(ctx), s, r)
			}
		}
		return res, nil
	}
}

// saw keeps a task's status from an answer about it (a tasks/get, or
// a 2025-11-25 tasks/cancel), and commits it when it is terminal.
func (g *Gateway) saw(ctx context.Context, s *mcp.ClientSession, r *runningTask, raw json.RawMessage) {
	status, message := taskStatus(raw)
	if status == "" {
		return // an acknowledgement
	}
	r.mu.Lock()
	r.last = withoutMeta(raw)
	r.mu.Unlock()
	if !terminal(status) {
		return
	}
	var inline struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &inline)
	if inline.Error != nil && message == "" {
		message = inline.Error.Message
	}
	g.settle(ctx, s, r, status, message, inline.Result)
}

// watchCancelled polls a cancelled task of the extension until its end
// (cancelled, or the one it reached first) is committed, for at most
// cancelWatch.
func (g *Gateway) watchCancelled(ctx context.Context, s *mcp.ClientSession, r *runningTask) {
	ctx, cancel := context.WithTimeout(ctx, cancelWatch)
	defer cancel()
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		r.mu.Lock()
		done := r.done
		r.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ctx.Done():
			g.logger.WarnContext(ctx, "cancelled task did not end: its outcome is recorded at the next poll", "key", r.key)
			return
		case <-time.After(wait):
		}
		res, err := mcp.CallCustomMethod[*taskParams, *taskResult](ctx, s, "tasks/get", taskRequest(r.id))
		if err == nil {
			g.saw(ctx, s, r, res.raw)
		}
	}
}

// watch reports whether no goroutine polls r yet, and makes the caller's
// the one.
func (r *runningTask) watch() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watching || r.done {
		return false
	}
	r.watching = true
	return true
}

// cancelWatch bounds how long the gateway polls a cancelled task.
const cancelWatch = time.Minute

// unliftTask puts a tools/call's params.task, carried in
// _meta[metaParamsTask], back where the upstream reads it.
func unliftTask(params json.RawMessage) json.RawMessage {
	if !bytes.Contains(params, []byte(metaParamsTask)) {
		return params
	}
	var p map[string]json.RawMessage
	if json.Unmarshal(params, &p) != nil {
		return params
	}
	var meta map[string]json.RawMessage
	if json.Unmarshal(p["_meta"], &meta) != nil || meta[metaParamsTask] == nil {
		return params
	}
	p["task"] = meta[metaParamsTask]
	delete(meta, metaParamsTask)
	if len(meta) == 0 {
		delete(p, "_meta")
	} else if b, err := json.Marshal(meta); err == nil {
		p["_meta"] = b
	}
	out, err := json.Marshal(p)
	if err != nil {
		return params
	}
	return out
}

// stashTasks moves the capabilities.tasks of an upstream's initialize
// result to capabilities.experimental[expTasks], where the SDK keeps it.
func stashTasks(result json.RawMessage) json.RawMessage {
	if !bytes.Contains(result, []byte(`"tasks"`)) {
		return result
	}
	var r map[string]json.RawMessage
	if json.Unmarshal(result, &r) != nil {
		return result
	}
	var caps map[string]json.RawMessage
	if json.Unmarshal(r["capabilities"], &caps) != nil || caps["tasks"] == nil {
		return result
	}
	exp := map[string]json.RawMessage{}
	if raw, ok := caps["experimental"]; ok && json.Unmarshal(raw, &exp) != nil {
		return result
	}
	exp[expTasks] = caps["tasks"]
	delete(caps, "tasks")
	var err error
	if caps["experimental"], err = json.Marshal(exp); err != nil {
		return result
	}
	if r["capabilities"], err = json.Marshal(caps); err != nil {
		return result
	}
	out, err := json.Marshal(r)
	if err != nil {
		return result
	}
	return out
}

// takeTasks removes the upstream's tasks capability from the
// capabilities the SDK decoded, and returns it.
func takeTasks(caps *mcp.ServerCapabilities) any {
	t, ok := caps.Experimental[expTasks]
	if !ok {
		return nil
	}
	exp := make(map[string]any, len(caps.Experimental))
	for k, v := range caps.Experimental {
		if k != expTasks {
			exp[k] = v
		}
	}
	caps.Experimental = exp
	if len(exp) == 0 {
		caps.Experimental = nil
	}
	return t
}

// rawInit is an initialize result with members the SDK's type lacks.
type rawInit struct {
	*mcp.InitializeResult
	raw json.RawMessage
}

func (r rawInit) MarshalJSON() ([]byte, error) { return r.raw, nil }

// withTasksCapability gives a 2025-11-25 client the upstream's
// capabilities.tasks in the answer to initialize.
func (g *Gateway) withTasksCapability(res mcp.Result) mcp.Result {
	ir, ok := res.(*mcp.InitializeResult)
	if !ok || g.upTasks == nil || ir.ProtocolVersion != "2025-11-25" {
		return res
	}
	b, err := json.Marshal(ir)
	if err != nil {
		return res
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return res
	}
	caps, _ := m["capabilities"].(map[string]any)
	if caps == nil {
		caps = map[string]any{}
	}
	caps["tasks"] = g.upTasks
	m["capabilities"] = caps
	if b, err = json.Marshal(m); err != nil {
		return res
	}
	return rawInit{ir, b}
}

// unliftRequest applies unliftTask to a tools/call POSTed to a
// Streamable HTTP upstream (on a copy of req), and reports whether the POST is an
// initialize request.
func unliftRequest(req *http.Request) (out *http.Request, init bool, err error) {
	if req.Method != http.MethodPost || req.Body == nil || req.Body == http.NoBody {
		return req, false, nil
	}
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, false, err
	}
	req = req.Clone(req.Context())
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) == nil {
		var method string
		_ = json.Unmarshal(m["method"], &method)
		switch method {
		case "initialize":
			init = true
		case "tools/call":
			if p := unliftTask(m["params"]); !bytes.Equal(p, m["params"]) {
				m["params"] = p
				if b, err := json.Marshal(m); err == nil {
					body = b
				}
			}
		}
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return req, init, nil
}

// stashTasksHTTP applies stashTasks to the answer to initialize in an
// HTTP response: one JSON-RPC message, or server-sent events.
func stashTasksHTTP(res *http.Response) {
	if res.StatusCode != http.StatusOK || res.Body == nil {
		return
	}
	body, err := io.ReadAll(io.LimitReader(res.Body, maxBody))
	_ = res.Body.Close()
	if err == nil && bytes.Contains(body, []byte(`"tasks"`)) {
		if strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
			lines := bytes.Split(body, []byte("\n"))
			for i, l := range lines {
				if d, ok := bytes.CutPrefix(l, []byte("data:")); ok {
					lines[i] = append([]byte("data: "), stashMessage(bytes.TrimSpace(d))...)
				}
			}
			body = bytes.Join(lines, []byte("\n"))
		} else {
			body = stashMessage(body)
		}
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	res.ContentLength = int64(len(body))
	res.Header.Del("Content-Length")
}

// stashMessage applies stashTasks to a JSON-RPC response's result.
func stashMessage(msg []byte) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(msg, &m) != nil || m["result"] == nil {
		return msg
	}
	m["result"] = stashTasks(m["result"])
	b, err := json.Marshal(m)
	if err != nil {
		return msg
	}
	return b
}

type ownerKey struct{}

// withOwner returns a context that names who made req (taskOwner).
func (g *Gateway) withOwner(ctx context.Context, req mcp.Request) context.Context {
	return context.WithValue(ctx, ownerKey{}, g.taskOwner(req))
}

func ownerOf(ctx context.Context) string {
	o, _ := ctx.Value(ownerKey{}).(string)
	return o
}

// taskOwner is who may use the tasks of req's calls: its session; for a
// stateless request (MCP 2026-07-28 over HTTP), the client's identity,
// its token's user or a hash of its Authorization header (so stateless
// clients without credentials share their tasks); on stdio, the one
// client, whichever process of the gateway serves it (a handle outlives
// a restart).
func (g *Gateway) taskOwner(req mcp.Request) string {
	if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss != nil && ss.ID() != "" {
		return "session:" + ss.ID()
	}
	if ex := req.GetExtra(); ex != nil && ex.Header != nil {
		if ex.TokenInfo != nil && ex.TokenInfo.UserID != "" {
			return "user:" + ex.TokenInfo.UserID
		}
		sum := sha256.Sum256([]byte(ex.Header.Get("Authorization")))
		return "client:" + hex.EncodeToString(sum[:])
	}
	return "stdio"
}
