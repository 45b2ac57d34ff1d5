package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// tasksCapability is the server's capabilities.tasks (MCP 2025-11-25).
const tasksCapability = `"tasks":{"list":{},"cancel":{},"requests":{"tools":{"call":{}}}}`

// tasksExtension names the tasks extension of MCP 2026-07-28.
const tasksExtension = "io.modelcontextprotocol/tasks"

// discoverResult is the answer to server/discover with --revision
// 2026-07-28.
const discoverResult = `{"resultType":"complete","supportedVersions":["2026-07-28"],` +
	`"capabilities":{"tools":{},"extensions":{"` + tasksExtension + `":{}}},` +
	`"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"hostile","version":"1"}}}`

// A task of "job" completes once finish-<arg> exists. With the tasks
// extension, a job whose arg starts with "ask" first needs input (an
// elicitation, answered with tasks/update), and one whose arg starts
// with "fail" fails with a JSON-RPC error instead of completing.
type task struct {
	id, tool, arg string
	ttl           int64
	ext           bool   // a task of the 2026-07-28 extension
	answer        string // the action of the answer to its elicitation
	cancelled     bool
}

var (
	tasksMu sync.Mutex
	tasks   = map[string]*task{}
)

// startTask answers a task-augmented call of "job" with a new task: one
// with params.task (MCP 2025-11-25), or, with --revision 2026-07-28, one
// whose client declared the tasks extension in its request's _meta.
func startTask(tool, arg string, params json.RawMessage) (reply, bool) {
	var p struct {
		Task *struct {
			TTL int64 `json:"ttl"`
		} `json:"task"`
		Meta struct {
			Caps struct {
				Extensions map[string]json.RawMessage `json:"extensions"`
			} `json:"io.modelcontextprotocol/clientCapabilities"`
		} `json:"_meta"`
	}
	if tool != "job" || json.Unmarshal(params, &p) != nil {
		return reply{}, false
	}
	ext := modern && p.Meta.Caps.Extensions[tasksExtension] != nil
	if p.Task == nil && !ext {
		return reply{}, false
	}
	tasksMu.Lock()
	t := &task{id: fmt.Sprintf("hostile-task-%d", len(tasks)+1), tool: tool, arg: arg, ext: ext, ttl: 60000}
	if p.Task != nil {
		t.ttl = p.Task.TTL
	}
	tasks[t.id] = t
	tasksMu.Unlock()
	if ext {
		return reply{result: `{"resultType":"task",` + t.json()[1:]}, true
	}
	return reply{result: `{"task":` + t.json() + `}`}, true
}

func (t *task) status() string {
	switch {
	case t.cancelled:
		return "cancelled"
	case t.ext && strings.HasPrefix(t.arg, "ask") && t.answer == "":
		return "input_required"
	}
	if _, err := os.Stat(filepath.Join(dir, "finish-"+t.arg)); err != nil {
		return "working"
	}
	if t.ext && strings.HasPrefix(t.arg, "fail") {
		return "failed"
	}
	return "completed"
}

// json is the task's object; with the extension, its status's members
// (inputRequests, result or error) too.
func (t *task) json() string {
	status := t.status()
	if !t.ext {
		return fmt.Sprintf(`{"taskId":%q,"status":%q,"ttl":%d,"pollInterval":50,"createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z"}`,
			t.id, status, t.ttl)
	}
	more := ""
	switch status {
	case "input_required":
		more = `,"inputRequests":{"confirm":{"method":"elicitation/create","params":{"mode":"form","message":"Run the job?",` +
			`"requestedSchema":{"type":"object","properties":{"ok":{"type":"boolean"}}}}}}`
	case "completed":
		more = `,"result":` + t.result()
	case "failed":
		more = `,"error":{"code":-32603,"message":"the job failed upstream"}`
	}
	return fmt.Sprintf(`{"taskId":%q,"status":%q,"ttlMs":%d,"pollIntervalMs":50,"createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z"%s}`,
		t.id, status, t.ttl, more)
}

// result is the task's tool result.
func (t *task) result() string {
	text := jsonText(t.tool) + " " + jsonText(t.arg) + " done"
	if t.answer != "" {
		text += " (" + jsonText(t.answer) + ")"
	}
	return fmt.Sprintf(`{"content":[{"type":"text","text":"%s"}],"_meta":{"io.modelcontextprotocol/related-task":{"taskId":%q}}}`, text, t.id)
}

// taskRequest answers tasks/get, tasks/result, tasks/cancel and
// tasks/update.
func taskRequest(method string, params json.RawMessage) reply {
	var p struct {
		TaskID         string `json:"taskId"`
		InputResponses map[string]struct {
			Action string `json:"action"`
		} `json:"inputResponses"`
	}
	_ = json.Unmarshal(params, &p)
	tasksMu.Lock()
	defer tasksMu.Unlock()
	t := tasks[p.TaskID]
	if t == nil {
		return reply{err: `{"code":-32602,"message":"unknown task"}`}
	}
	if t.ext {
		return extRequest(t, method, p.InputResponses["confirm"].Action)
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
		return reply{result: t.result()}
	case "tasks/update":
		return reply{err: `{"code":-32601,"message":"method not found: tasks/update"}`}
	}
	return reply{result: t.json()}
}

// extRequest answers the methods of the tasks extension (MCP
// 2026-07-28): tasks/get the task with its status's members, tasks/update
// and tasks/cancel an empty acknowledgement.
func extRequest(t *task, method, action string) reply {
	switch method {
	case "tasks/get":
		return reply{result: `{"resultType":"complete",` + t.json()[1:]}
	case "tasks/update":
		if t.status() == "input_required" && action != "" {
			t.answer = action
		}
	case "tasks/cancel":
		if s := t.status(); s == "working" || s == "input_required" {
			t.cancelled = true
		}
	default:
		return reply{err: fmt.Sprintf(`{"code":-32601,"message":"method not found: %s"}`, method)}
	}
	return reply{result: `{"resultType":"complete"}`}
}
