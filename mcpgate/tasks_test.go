package mcpgate

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// params.task rides in _meta from the client's transport to the
// upstream's and comes out as it went in.
func TestTaskParamsRoundTrip(t *testing.T) {
	in := json.RawMessage(`{"name":"job","arguments":{"id":"t1"},"task":{"ttl":60000},"_meta":{"progressToken":7}}`)
	lifted := liftParamsKey(in)
	var p struct {
		Task json.RawMessage `json:"task"`
		Meta mcp.Meta        `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(lifted, &p))
	assert.Nil(t, p.Task, "lifted out of params")
	assert.Equal(t, map[string]any{"ttl": float64(60000)}, p.Meta[metaParamsTask])
	assert.Equal(t, time.Minute, taskLease(p.Meta, 5*time.Minute))

	out := unliftTask(lifted)
	assert.JSONEq(t, string(in), string(out))
	plain := json.RawMessage(`{"name":"job","arguments":{}}`)
	assert.Equal(t, plain, unliftTask(plain))
}

func TestTaskLease(t *testing.T) {
	lease := func(ttl any) time.Duration {
		return taskLease(mcp.Meta{metaParamsTask: map[string]any{"ttl": ttl}}, 5*time.Minute)
	}
	assert.Equal(t, 24*time.Hour, lease(float64(7*24*3600*1000)), "at most the ledger's largest lease")
	assert.Equal(t, 5*time.Minute, lease(nil), "no ttl: the gateway's lease")
	assert.Equal(t, 5*time.Minute, taskLease(mcp.Meta{}, 5*time.Minute), "no task")
	assert.Equal(t, 90*time.Second, lease(float64(90000)))
}

func TestStashTasks(t *testing.T) {
	init := json.RawMessage(`{"protocolVersion":"2025-11-25","capabilities":{"tools":{},"tasks":{"requests":{"tools":{"call":{}}}}},"serverInfo":{"name":"s","version":"1"}}`)
	var r mcp.InitializeResult
	require.NoError(t, json.Unmarshal(stashTasks(init), &r))
	caps := *r.Capabilities
	got := takeTasks(&caps)
	assert.Equal(t, map[string]any{"requests": map[string]any{"tools": map[string]any{"call": map[string]any{}}}}, got)
	assert.Empty(t, caps.Experimental, "not shown to the client as experimental")
	none := json.RawMessage(`{"protocolVersion":"2025-11-25","capabilities":{"tools":{}}}`)
	assert.Equal(t, none, stashTasks(none))
}

func TestTaskOf(t *testing.T) {
	id, obj, ok := taskOf(json.RawMessage(`{"task":{"taskId":"a1","status":"working","ttl":1000},"_meta":{"x":1}}`))
	require.True(t, ok)
	assert.Equal(t, "a1", id)
	assert.JSONEq(t, `{"taskId":"a1","status":"working","ttl":1000}`, string(obj))
	id, _, ok = taskOf(json.RawMessage(`{"resultType":"task","taskId":"b2","status":"working","ttlMs":1000}`))
	require.True(t, ok, "2026-07-28")
	assert.Equal(t, "b2", id)
	for _, raw := range []string{`{"content":[{"type":"text","text":"task"}]}`, `{"task":"done"}`, `{"task":{}}`, `[]`} {
		_, _, ok = taskOf(json.RawMessage(raw))
		assert.False(t, ok, raw)
	}
}

func TestWithoutRelatedTask(t *testing.T) {
	assert.JSONEq(t, `{"content":[]}`, string(withoutRelatedTask(json.RawMessage(
		`{"content":[],"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"a1"}}}`))))
	assert.JSONEq(t, `{"content":[],"_meta":{"k":1}}`, string(withoutRelatedTask(json.RawMessage(
		`{"content":[],"_meta":{"k":1,"io.modelcontextprotocol/related-task":{"taskId":"a1"}}}`))))
}
