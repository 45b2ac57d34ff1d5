package tasks_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
)

// core is a tasks.Core of function fields.
type core struct {
	session func(context.Context) (*mcp.ClientSession, error)
	outcome func(json.RawMessage, string) ledgerport.Outcome
	commit  func(context.Context, *ledgerport.Reservation, ledgerport.Outcome) error
}

var _ tasks.Core = core{}

func (c core) Session(ctx context.Context) (*mcp.ClientSession, error) { return c.session(ctx) }
func (c core) Outcome(r json.RawMessage, f string) ledgerport.Outcome  { return c.outcome(r, f) }
func (c core) Commit(ctx context.Context, rsv *ledgerport.Reservation, o ledgerport.Outcome) error {
	return c.commit(ctx, rsv, o)
}

// TestTasks_Start: a reserved call's task is handed out by a sealed
// handle; a repeat of the call while it runs gets the task again (its
// handle, with the meta given) for the client that made it, and only
// "running" for another.
func TestTasks_Start(t *testing.T) {
	key := make([]byte, 32)
	ts := tasks.New(core{}, func() ([]byte, error) { return key, nil }, func(tool string) string { return "shop." + tool },
		slog.New(slog.DiscardHandler))
	mine := tasks.WithOwner(context.Background(), &mcp.CallToolRequest{})
	rsv := &ledgerport.Reservation{Reservation: client.Reservation{Status: ledger.StatusReserved, Key: "dk_1", Token: "rsv_secret"}}
	obj := json.RawMessage(`{"taskId":"up-1","status":"working"}`)
	handle := ts.Start(mine, tasks.Call{Name: "charge", LedgerTool: "shop.charge", Rsv: rsv}, "up-1", obj)
	assert.True(t, strings.HasPrefix(handle, "ltk1."), handle)
	assert.NotContains(t, handle, "rsv_secret")

	again, running := ts.Repeat(mine, "dk_1", map[string]any{"k": "v"})
	require.True(t, running)
	var got struct {
		Task struct {
			TaskID string `json:"taskId"`
			Status string `json:"status"`
		} `json:"task"`
		Meta map[string]any `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(again, &got))
	assert.Equal(t, handle, got.Task.TaskID, "the client sees the handle, not the upstream's id")
	assert.Equal(t, "working", got.Task.Status)
	assert.Equal(t, "v", got.Meta["k"])

	again, running = ts.Repeat(context.Background(), "dk_1", nil) // a context of no client: another
	assert.True(t, running)
	assert.Nil(t, again, "another client gets no handle")
	_, running = ts.Repeat(mine, "dk_2", nil)
	assert.False(t, running, "another key")
}
