package mcpgate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
)

// Tasks (SPEC §11.1, MCP 2025-11-25 "tasks"): a task-augmented
// tools/call answers a task handle at once and runs on; the client
// polls it with tasks/get and fetches its result with tasks/result. The
// SDK knows none of it: it drops capabilities.tasks and params.task
// when it decodes them, and answers tasks/* -32601. So the upstream
// connection moves the upstream's capabilities.tasks where the SDK
// keeps it (capabilities.experimental[expTasks], tasklift.go) and the
// gateway gives it back to the client; the client's params.task rides
// in _meta[metaParamsTask] from the client's transport to the
// upstream's (key.go, raw.go); and tasks/* are custom methods forwarded
// to the upstream that owns the task (taskrun.go; their JSON,
// taskjson.go). The call stays reserved while its task runs; the first
// terminal status the gateway sees is committed, once.
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
	rsv    *ledgerport.Reservation
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
