package tasks

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// Start keeps the task id (as it came: obj) that call c answered, and
// returns the handle the client sees it by (Rename puts it in the
// answer). Nothing is committed until the task ends.
func (t *Tasks) Start(ctx context.Context, c Call, id string, obj json.RawMessage) (handle string) {
	// Only the extension's task handle has a resultType among its
	// members (2025-11-25's is {"task": {…}}).
	r := &runningTask{id: id, handle: id, c: c, owner: OwnerOf(ctx), ext: wire.HasMember(obj, "resultType")}
	h := taskHandle{ID: id, Tool: c.Name, Failed: c.Failed, Ext: r.ext, Owner: r.owner,
		Exp: time.Now().Add(maxHandleAge).UnixMilli()}
	if c.Rsv != nil {
		r.key, h.Key, h.Token = c.Rsv.Key, c.Rsv.Key, c.Rsv.Token
		t.logger.InfoContext(ctx, "call running as a task", "tool", c.LedgerTool, "key", c.Rsv.Key)
	}
	if key, err := t.stateKey(); err != nil {
		t.logger.WarnContext(ctx, "task handle not sealed: the task is known to this process only", "err", err)
	} else if r.handle, err = sealHandle(key, h); err != nil {
		t.logger.WarnContext(ctx, "task handle not sealed: the task is known to this process only", "err", err)
		r.handle = id
	}
	r.last = Rename(obj, id, r.handle)
	t.table.prune(time.Now())
	t.table.add(r)
	return r.handle
}

// takeUp is the task of a handle this process did not hand out (it
// restarted, or another replica did): opened, and kept from now on.
func (t *Tasks) takeUp(ctx context.Context, handle string) (*runningTask, error) {
	key, err := t.stateKey()
	if err != nil {
		return nil, err
	}
	h, err := openHandle(key, handle, OwnerOf(ctx), time.Now())
	if err != nil {
		return nil, err
	}
	s, err := t.core.Session(ctx)
	if err != nil {
		return nil, err
	}
	c := Call{Name: h.Tool, LedgerTool: t.ledgerTool(h.Tool), Failed: h.Failed, Up: s}
	if h.Key != "" {
		c.Rsv = &ledgerport.Reservation{Reservation: client.Reservation{Status: ledger.StatusReserved, Key: h.Key, Token: h.Token}}
	}
	r := &runningTask{id: h.ID, handle: handle, c: c, owner: h.Owner, ext: h.Ext, key: h.Key, takenUp: true}
	t.table.addHandle(r)
	t.logger.InfoContext(ctx, "task taken up", "tool", c.LedgerTool, "key", h.Key)
	return t.table.get(handle), nil
}

// Repeat is what a repeat of a call answers while the call's task runs
// (running): to the client that made the call, the task again with meta
// (again); to another, nothing (the core answers in_progress).
func (t *Tasks) Repeat(ctx context.Context, key string, meta map[string]any) (again json.RawMessage, running bool) {
	r := t.table.running(key)
	if r == nil {
		return nil, false
	}
	if r.owner == OwnerOf(ctx) {
		if b, err := r.createResult(meta); err == nil {
			return b, true
		}
	}
	return nil, true
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
	return wire.WithMembers(last, map[string]any{"resultType": "task", "_meta": meta,
		"result": nil, "error": nil, "inputRequests": nil})
}

// settle commits a task's terminal status, once: completed → succeeded
// with the task's result (fetched with tasks/result unless given),
// failed → failed, cancelled → not_applied CANCELLED.
func (t *Tasks) settle(ctx context.Context, s *mcp.ClientSession, r *runningTask, status, message string, result json.RawMessage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done || r.c.Rsv == nil {
		if !r.done {
			r.done = true
			r.settledAt.Store(time.Now().UnixMilli())
		}
		return
	}
	var o ledgerport.Outcome
	switch status {
	case "completed":
		if result == nil && r.ext {
			return // the extension's tasks/get carries it: the next poll
		}
		if result == nil {
			res, err := mcp.CallCustomMethod[*Params, *Result](ctx, s, "tasks/result", taskRequest(r.id))
			if err != nil {
				t.logger.WarnContext(ctx, "task result not read: its outcome is recorded later", "key", r.key, "err", err)
				return
			}
			result = res.raw
		}
		o = t.core.Outcome(withoutRelatedTask(result), "")
	case "failed":
		o = t.core.Outcome(nil, cmp.Or(message, "the task failed"))
	case "cancelled":
		o = ledgerport.Outcome{NotApplied: true, ErrorCode: CodeCancelled, ErrorMessage: "the task was cancelled"}
	default:
		return
	}
	if !o.Succeeded && !o.NotApplied {
		o.NotApplied = !r.c.Failed
	}
	err := t.core.Commit(ctx, r.c.Rsv, o)
	var refusal *ledgerport.Refusal
	if err != nil && !errors.As(err, &refusal) {
		// The ledger could not be reached: the next poll tries again.
		t.logger.ErrorContext(ctx, "task outcome not recorded", "tool", r.c.LedgerTool, "key", r.key, "err", err)
		return
	}
	r.done = true
	r.settledAt.Store(time.Now().UnixMilli())
	t.table.settled(r)
	if err != nil {
		t.logger.ErrorContext(ctx, "task outcome refused by the ledger", "tool", r.c.LedgerTool, "key", r.key, "err", err)
		return
	}
	t.logger.InfoContext(ctx, "task executed", "tool", r.c.LedgerTool, "key", r.key, "outcome", o.Name())
}

// AddMethods makes the downstream server s answer tasks/*, and the
// upstream client c send them.
func (t *Tasks) AddMethods(s *mcp.Server, c *mcp.Client) {
	for _, m := range Methods {
		_ = mcp.AddReceivingCustomMethod(s, m, t.method(m))
		_ = mcp.AddSendingCustomMethod[*Params, *Result](c, m)
	}
	_ = mcp.AddReceivingCustomMethod(s, "tasks/list", func(ctx context.Context, _ *mcp.ServerSession, _ *Params) (*Result, error) {
		tasks := t.table.ownedBy(OwnerOf(ctx))
		if tasks == nil {
			tasks = []json.RawMessage{}
		}
		b, err := json.Marshal(map[string]any{"tasks": tasks})
		if err != nil {
			return nil, err
		}
		return &Result{raw: b}, nil
	})
}

// method forwards a tasks/* request of the session that made the task
// to the upstream, and commits the first terminal status it sees.
func (t *Tasks) method(method string) func(context.Context, *mcp.ServerSession, *Params) (*Result, error) {
	return func(ctx context.Context, _ *mcp.ServerSession, p *Params) (*Result, error) {
		if p == nil {
			p = &Params{}
		}
		r := t.table.get(p.taskID())
		if r == nil && strings.HasPrefix(p.taskID(), handlePrefix) {
			var err error
			if r, err = t.takeUp(ctx, p.taskID()); err != nil {
				if errors.Is(err, errHandle) {
					return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
				}
				return nil, err
			}
		}
		if r == nil || r.owner != OwnerOf(ctx) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: errHandle.Error()}
		}
		s := r.c.Up // the upstream that owns the task
		res, err := mcp.CallCustomMethod[*Params, *Result](ctx, s, method, &Params{raw: withTaskID(p.raw, r.id)})
		r.mu.Lock()
		takenUp := r.takenUp
		r.takenUp = takenUp && err != nil
		r.mu.Unlock()
		if err != nil {
			if takenUp {
				t.table.forget(r) // the upstream knows it no more, or not here
			}
			return nil, err
		}
		if takenUp {
			t.table.track(r)
		}
		res.raw = Rename(res.raw, r.id, r.handle)
		switch method {
		case "tasks/result":
			t.settle(ctx, s, r, "completed", "", res.raw)
		case "tasks/get", "tasks/cancel", "tasks/update":
			t.saw(ctx, s, r, res.raw)
			if method == "tasks/cancel" && r.ext && r.watch() {
				// An acknowledgement only, and the client need not poll
				// again: the gateway polls for the task's end itself.
				go t.watchCancelled(context.WithoutCancel(ctx), s, r)
			}
		}
		return res, nil
	}
}

// saw keeps a task's status from an answer about it (a tasks/get, or
// a 2025-11-25 tasks/cancel), and commits it when it is terminal.
func (t *Tasks) saw(ctx context.Context, s *mcp.ClientSession, r *runningTask, raw json.RawMessage) {
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
	t.settle(ctx, s, r, status, message, inline.Result)
}

// watchCancelled polls a cancelled task of the extension until its end
// (cancelled, or the one it reached first) is committed, for at most
// cancelWatch.
func (t *Tasks) watchCancelled(ctx context.Context, s *mcp.ClientSession, r *runningTask) {
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
			t.logger.WarnContext(ctx, "cancelled task did not end: its outcome is recorded at the next poll", "key", r.key)
			return
		case <-time.After(wait):
		}
		res, err := mcp.CallCustomMethod[*Params, *Result](ctx, s, "tasks/get", taskRequest(r.id))
		if err == nil {
			t.saw(ctx, s, r, res.raw)
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
