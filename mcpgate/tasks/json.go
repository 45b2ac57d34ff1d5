package tasks

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// Of reads the task of an answer: a 2025-11-25 CreateTaskResult
// ({"task": {taskId, status, …}}) or a 2026-07-28 one (resultType
// "task", the task's members at the top).
func Of(raw json.RawMessage) (id string, obj json.RawMessage, ok bool) {
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
	return wire.EditObject(raw, func(m map[string]json.RawMessage) bool {
		_, ok := m["_meta"]
		delete(m, "_meta")
		return ok
	})
}

// withoutRelatedTask drops _meta[metaRelatedTask] from a result, so the
// task id stays off the chain.
func withoutRelatedTask(raw json.RawMessage) json.RawMessage {
	if !bytes.Contains(raw, []byte(metaRelatedTask)) {
		return raw
	}
	return wire.EditMeta(raw, func(m, meta map[string]json.RawMessage) bool {
		_, ok := m["_meta"]
		delete(meta, metaRelatedTask)
		return ok
	})
}

// Lease is the lease of a call: a task-augmented call's is its task's
// ttl, at most maxTaskLease; a task without ttl, or a plain call, has the
// gateway's.
func Lease(meta mcp.Meta, def time.Duration) time.Duration {
	t, ok := meta[MetaParamsTask].(map[string]any)
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

// Params are the params of a tasks/* request, kept as they came.
type Params struct {
	mcp.ParamsBase
	raw json.RawMessage
}

func (p *Params) UnmarshalJSON(b []byte) error {
	p.raw = bytes.Clone(b)
	var m struct {
		Meta mcp.Meta `json:"_meta"`
	}
	_ = json.Unmarshal(b, &m)
	p.Meta = m.Meta
	return nil
}

func (p *Params) MarshalJSON() ([]byte, error) {
	if len(p.raw) == 0 {
		return []byte(`{}`), nil
	}
	return p.raw, nil
}

func (p *Params) taskID() string {
	var m struct {
		TaskID string `json:"taskId"`
	}
	_ = json.Unmarshal(p.raw, &m)
	return m.TaskID
}

func taskRequest(id string) *Params {
	b, _ := json.Marshal(map[string]string{"taskId": id})
	return &Params{raw: b}
}

// Result is the answer of a tasks/* request, kept as it came.
type Result struct {
	mcp.ResultBase
	raw json.RawMessage
}

func (r *Result) UnmarshalJSON(b []byte) error {
	r.raw = bytes.Clone(b)
	return nil
}

func (r *Result) MarshalJSON() ([]byte, error) {
	if len(r.raw) == 0 {
		return []byte(`{}`), nil
	}
	return r.raw, nil
}

// WithoutParamsTask is meta without a 2025-11-25 client's params.task.
func WithoutParamsTask(meta mcp.Meta) mcp.Meta {
	if _, ok := meta[MetaParamsTask]; !ok {
		return meta
	}
	out := make(mcp.Meta, len(meta))
	for k, v := range meta {
		if k != MetaParamsTask {
			out[k] = v
		}
	}
	return out
}
