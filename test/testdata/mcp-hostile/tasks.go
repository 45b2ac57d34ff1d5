package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// tasksCapability is the server's capabilities.tasks (MCP 2025-11-25).
const tasksCapability = `"tasks":{"list":{},"cancel":{},"requests":{"tools":{"call":{}}}}`

type task struct {
	id, tool, arg string
	ttl           int64
	cancelled     bool
}

var (
	tasksMu sync.Mutex
	tasks   = map[string]*task{}
)

// startTask answers a task-augmented call of "job" with a new task.
func startTask(tool, arg string, params json.RawMessage) (reply, bool) {
	var p struct {
		Task *struct {
			TTL int64 `json:"ttl"`
		} `json:"task"`
	}
	if tool != "job" || json.Unmarshal(params, &p) != nil || p.Task == nil {
		return reply{}, false
	}
	tasksMu.Lock()
	t := &task{id: fmt.Sprintf("hostile-task-%d", len(tasks)+1), tool: tool, arg: arg, ttl: p.Task.TTL}
	tasks[t.id] = t
	tasksMu.Unlock()
	return reply{result: `{"task":` + t.json() + `}`}, true
}

func (t *task) status() string {
	if t.cancelled {
		return "cancelled"
	}
	if _, err := os.Stat(filepath.Join(dir, "finish-"+t.arg)); err == nil {
		return "completed"
	}
	return "working"
}

func (t *task) json() string {
	return fmt.Sprintf(`{"taskId":%q,"status":%q,"ttl":%d,"pollInterval":50,"createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z"}`,
		t.id, t.status(), t.ttl)
}

// taskRequest answers tasks/get, tasks/result and tasks/cancel.
func taskRequest(method string, params json.RawMessage) reply {
	var p struct {
		TaskID string `json:"taskId"`
	}
	_ = json.Unmarshal(params, &p)
	tasksMu.Lock()
	defer tasksMu.Unlock()
	t := tasks[p.TaskID]
	if t == nil {
		return reply{err: `{"code":-32602,"message":"unknown task"}`}
	}
	switch method {
	case "tasks/cancel":
		if t.status() != "working" {
			return reply{err: `{"code":-32602,"message":"the task is terminal"}`}
		}
		t.cancelled = true
		return reply{result: t.json()}
	case "tasks/result":
		if t.status() != "completed" {
			return reply{err: fmt.Sprintf(`{"code":-32602,"message":"the task is %s"}`, t.status())}
		}
		return reply{result: fmt.Sprintf(`{"content":[{"type":"text","text":"%s %s done"}],"_meta":{"io.modelcontextprotocol/related-task":{"taskId":%q}}}`,
			jsonText(t.tool), jsonText(t.arg), t.id)}
	}
	return reply{result: t.json()}
}
