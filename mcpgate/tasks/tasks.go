// Package tasks is the MCP gateway's extension for tasks (SPEC §11.1,
// MCP 2025-11-25 "tasks"): a task-augmented tools/call answers a task
// handle at once and runs on; the client
// polls it with tasks/get and fetches its result with tasks/result. The
// SDK knows none of it: it drops capabilities.tasks and params.task
// when it decodes them, and answers tasks/* -32601. So the upstream
// connection moves the upstream's capabilities.tasks where the SDK
// keeps it (capabilities.experimental[expTasks], lift.go) and the
// gateway gives it back to the client; the client's params.task rides
// in _meta[MetaParamsTask] from the client's transport to the
// upstream's (the core's lift pass, UnliftParams); and tasks/* are custom
// methods forwarded to the upstream that owns the task (run.go; their
// JSON, json.go). The call stays reserved while its task runs; the first
// terminal status the gateway sees is committed, once.
//
// MCP 2026-07-28 moved tasks into an extension (io.modelcontextprotocol/
// tasks, SEP-2663): the client declares it in its request's capabilities
// (serverreq.Peers.DescribeClient forwards them), the server decides to answer a task
// (resultType "task", the task's members at the top), tasks/get carries
// the terminal result or error inline, tasks/update delivers the answers
// to a task's inputRequests, tasks/cancel is an empty acknowledgement and
// there is no tasks/result. Such a task is ext.
//
// The client sees a task by its handle (handle.go), which seals the
// upstream's task id with the call's reservation: the gateway keeps the
// tasks it started in memory, and a handle it does not know (after a
// restart, or from another replica) is opened and the task taken up
// again. A handle never goes on the chain, and only the client that made
// the call (owner) may use it.
//
// The extension keeps its own state (Tasks: the tasks this process
// handed out or took up, and the upstream's tasks capability) and
// reaches the core's path through Core, three methods.
package tasks

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
)

const (
	// MetaParamsTask carries a call's params.task from the client's
	// transport to the upstream's.
	MetaParamsTask = "io.effect-ledger/params.task"
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

// Methods are the methods of the tasks utility forwarded upstream
// (tasks/list is answered from the caller's own tasks).
var Methods = []string{"tasks/get", "tasks/result", "tasks/cancel", "tasks/update"}

// Call is what the extension knows of a call that answered a task.
type Call struct {
	Name       string // the upstream's tool name
	LedgerTool string // <server-name>.<tool>
	// Failed: the tool's errors are recorded failed (its class's
	// on_error), not not_applied.
	Failed bool
	Up     *mcp.ClientSession // the upstream session that owns the task
	// Rsv is the call's reservation, committed when the task ends; nil
	// for a read.
	Rsv *ledgerport.Reservation
}

// Core is the gateway's path as the extension needs it.
type Core interface {
	// Session is the gateway's shared upstream session, where a task
	// taken up from its handle is polled.
	Session(ctx context.Context) (*mcp.ClientSession, error)
	// Outcome is what the upstream's final answer to a call came to: its
	// result, or (failure != "") the error it failed with.
	Outcome(result json.RawMessage, failure string) ledgerport.Outcome
	// Commit records a call's outcome, however the request that saw it
	// ends.
	Commit(ctx context.Context, rsv *ledgerport.Reservation, o ledgerport.Outcome) error
}

// Tasks is the extension's state: the tasks this process handed out or
// took up, and the upstream's tasks capability.
type Tasks struct {
	core       Core
	stateKey   func() ([]byte, error)
	ledgerTool func(tool string) string
	logger     *slog.Logger
	table      *taskTable
	upTasks    any // the upstream's capabilities.tasks, which the SDK drops
}

// New returns the extension over core; stateKey is the key that seals
// task handles, ledgerTool names a tool as the ledger records it.
func New(core Core, stateKey func() ([]byte, error), ledgerTool func(string) string, logger *slog.Logger) *Tasks {
	return &Tasks{core: core, stateKey: stateKey, ledgerTool: ledgerTool, logger: logger, table: newTaskTable()}
}

// runningTask is a task the gateway handed out.
type runningTask struct {
	mu     sync.Mutex
	id     string // the upstream's task id
	handle string // the client's taskId (handle.go)
	key    string // the call's idempotency key; "" for a read
	c      Call
	owner  string          // owner of the call
	last   json.RawMessage // the task as last seen: {taskId, status, …}
	done   bool            // its terminal status is committed
	ext    bool            // a task of the 2026-07-28 extension
	// takenUp: made from a handle (handle.go), not yet seen running;
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
// know (handle.go).
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

// WithOwner returns a context that names who made req (owner).
func WithOwner(ctx context.Context, req mcp.Request) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner(req))
}

// OwnerOf is who made the request of ctx (WithOwner).
func OwnerOf(ctx context.Context) string {
	o, _ := ctx.Value(ownerKey{}).(string)
	return o
}

// owner is who may use the tasks of req's calls: its session; for a
// stateless request (MCP 2026-07-28 over HTTP), the client's identity,
// its token's user or a hash of its Authorization header (so stateless
// clients without credentials share their tasks); on stdio, the one
// client, whichever process of the gateway serves it (a handle outlives
// a restart).
func owner(req mcp.Request) string {
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
