// Package hook is the command a coding agent (Claude Code, Codex CLI, and
// others with the same hook protocol) runs before and after each of its
// built-in tools (SPEC §17): before, it reserves the call's effect in the
// ledger and answers the agent with its own deny when the call must not
// run; after, it commits what the tool reported. Reads are not recorded.
// ledgerctl hook is its command line; install.go writes the agent's
// settings.
package hook

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Hook events this package answers.
const (
	PreToolUse  = "PreToolUse"
	PostToolUse = "PostToolUse"
	// PostToolUseFailure is Claude Code's event after a tool failed (a
	// shell command's non-zero exit among them): PostToolUse does not
	// fire then, so the kept reservation is committed failed here.
	PostToolUseFailure = "PostToolUseFailure"
)

// maxInput is the largest hook object read from stdin.
const maxInput = 16 << 20

// Input is the object an agent pipes to a hook command: the fields every
// agent of the protocol sends; others (transcript_path, model,
// permission_mode, turn_id) are ignored.
type Input struct {
	Event        string          `json:"hook_event_name"`
	SessionID    string          `json:"session_id"`
	ToolName     string          `json:"tool_name"`
	ToolInput    json.RawMessage `json:"tool_input"`
	ToolUseID    string          `json:"tool_use_id"`
	Cwd          string          `json:"cwd"`
	ToolResponse json.RawMessage `json:"tool_response"` // PostToolUse
	Error        json.RawMessage `json:"error"`         // PostToolUseFailure: what failed
	IsInterrupt  bool            `json:"is_interrupt"`  // PostToolUseFailure: the user interrupted it
}

// ReadInput decodes one hook object from r.
func ReadInput(r io.Reader) (*Input, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxInput+1))
	if err != nil {
		return nil, fmt.Errorf("read hook input: %w", err)
	}
	if len(data) > maxInput {
		return nil, errors.New("hook input: over 16 MiB")
	}
	var in Input
	if err := json.Unmarshal(data, &in); err != nil {
		return nil, fmt.Errorf("hook input: %w", err)
	}
	switch {
	case in.Event == "":
		return nil, errors.New("hook input: no hook_event_name")
	case in.ToolName == "":
		return nil, errors.New("hook input: no tool_name")
	case in.ToolUseID == "":
		return nil, errors.New("hook input: no tool_use_id")
	}
	if len(in.ToolInput) == 0 {
		in.ToolInput = json.RawMessage("null")
	}
	return &in, nil
}

// Answer is what a PreToolUse hook prints: nothing (a nil *Answer), which
// lets the agent's own permission flow go on, or a deny with a reason the
// model reads. It holds exactly the members the agents define (Codex
// treats an unknown member as a failed hook).
type Answer struct {
	HookSpecificOutput struct {
		HookEventName            string `json:"hookEventName"`
		PermissionDecision       string `json:"permissionDecision"`
		PermissionDecisionReason string `json:"permissionDecisionReason"`
	} `json:"hookSpecificOutput"`
}

// Deny returns the answer that refuses the call, saying why.
func Deny(reason string) *Answer {
	a := new(Answer)
	a.HookSpecificOutput.HookEventName = PreToolUse
	a.HookSpecificOutput.PermissionDecision = "deny"
	a.HookSpecificOutput.PermissionDecisionReason = reason
	return a
}

// Reason is the deny's reason, "" for a nil answer.
func (a *Answer) Reason() string {
	if a == nil {
		return ""
	}
	return a.HookSpecificOutput.PermissionDecisionReason
}
