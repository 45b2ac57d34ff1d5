package tasks

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTaskLease(t *testing.T) {
	lease := func(ttl any) time.Duration {
		return Lease(mcp.Meta{MetaParamsTask: map[string]any{"ttl": ttl}}, 5*time.Minute)
	}
	assert.Equal(t, 24*time.Hour, lease(float64(7*24*3600*1000)), "at most the ledger's largest lease")
	assert.Equal(t, 5*time.Minute, lease(nil), "no ttl: the gateway's lease")
	assert.Equal(t, 5*time.Minute, Lease(mcp.Meta{}, 5*time.Minute), "no task")
	assert.Equal(t, 90*time.Second, lease(float64(90000)))
}

func TestStashTasks(t *testing.T) {
	init := json.RawMessage(`{"protocolVersion":"2025-11-25","capabilities":{"tools":{},"tasks":{"requests":{"tools":{"call":{}}}}},"serverInfo":{"name":"s","version":"1"}}`)
	var r mcp.InitializeResult
	require.NoError(t, json.Unmarshal(Stash(init), &r))
	caps := *r.Capabilities
	got := takeTasks(&caps)
	assert.Equal(t, map[string]any{"requests": map[string]any{"tools": map[string]any{"call": map[string]any{}}}}, got)
	assert.Empty(t, caps.Experimental, "not shown to the client as experimental")
	none := json.RawMessage(`{"protocolVersion":"2025-11-25","capabilities":{"tools":{}}}`)
	assert.Equal(t, none, Stash(none))
	nullExp := json.RawMessage(`{"capabilities":{"tasks":{"list":{}},"experimental":null}}`)
	assert.JSONEq(t, `{"capabilities":{"experimental":{"`+expTasks+`":{"list":{}}}}}`, string(Stash(nullExp)),
		"a null experimental is none")
}

func TestTaskOf(t *testing.T) {
	id, obj, ok := Of(json.RawMessage(`{"task":{"taskId":"a1","status":"working","ttl":1000},"_meta":{"x":1}}`))
	require.True(t, ok)
	assert.Equal(t, "a1", id)
	assert.JSONEq(t, `{"taskId":"a1","status":"working","ttl":1000}`, string(obj))
	id, _, ok = Of(json.RawMessage(`{"resultType":"task","taskId":"b2","status":"working","ttlMs":1000}`))
	require.True(t, ok, "2026-07-28")
	assert.Equal(t, "b2", id)
	for _, raw := range []string{`{"content":[{"type":"text","text":"task"}]}`, `{"task":"done"}`, `{"task":{}}`, `[]`} {
		_, _, ok = Of(json.RawMessage(raw))
		assert.False(t, ok, raw)
	}
}

func TestWithoutRelatedTask(t *testing.T) {
	assert.JSONEq(t, `{"content":[]}`, string(withoutRelatedTask(json.RawMessage(
		`{"content":[],"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"a1"}}}`))))
	assert.JSONEq(t, `{"content":[],"_meta":{"k":1}}`, string(withoutRelatedTask(json.RawMessage(
		`{"content":[],"_meta":{"k":1,"io.modelcontextprotocol/related-task":{"taskId":"a1"}}}`))))
}
