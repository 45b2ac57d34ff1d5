package mcpgate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
)

// startTask keeps the task a reserved call answered: nothing is
// committed until the task ends.
func (g *Gateway) startTask(ctx context.Context, c *call, rsv *ledgerport.Reservation, id string, obj json.RawMessage, reply mcp.Result) mcp.Result {
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
	var class Class
	if h.Failed {
		class.OnError = OnErrorFailed
	}
	c := &call{request: request{name: h.Tool, ledgerTool: LedgerToolName(g.cfg.ServerName, h.Tool),
		toolLabel: unlistedToolLabel, class: class}}
	r := &runningTask{id: h.ID, handle: handle, c: c, owner: h.Owner, up: s, ext: h.Ext, key: h.Key, takenUp: true}
	if h.Key != "" {
		r.rsv = &ledgerport.Reservation{Reservation: client.Reservation{Status: ledger.StatusReserved, Key: h.Key, Token: h.Token}}
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
		o = Outcome{ErrorCode: CodeMCPError, ErrorMessage: ledgerport.Truncate(message, ledgerport.MaxFailureMessage)}
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
	err := g.port.Commit(cmctx, r.rsv, o)
	var refusal *ledgerport.Refusal
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
	g.logger.InfoContext(ctx, "task executed", "tool", r.c.ledgerTool, "key", r.key, "outcome", o.Name())
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
