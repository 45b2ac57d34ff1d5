package hook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/effect-ledger/effect-ledger/client"
)

// maxResult is the largest result a commit carries (compacted JSON).
const maxResult = 64 << 10

// ToolErrorCode is the error code of a tool that reported a failure.
const ToolErrorCode = "TOOL_ERROR"

// Post answers a PostToolUse (or PostToolUseFailure) call: it commits the
// reservation its PreToolUse kept — succeeded with the tool's response as
// the result, or failed when the tool reported an error — and forgets
// it. A call with no kept reservation (a read, a denied call) does
// nothing. When the ledger cannot take the commit, the reservation stays
// kept and the error is returned.
func (h *Hook) Post(ctx context.Context, in *Input) error {
	file := h.State.reservation(in.SessionID, in.ToolUseID)
	var k kept
	ok, err := h.State.read(file, &k)
	if err != nil || !ok {
		return err
	}
	cm := commitOf(in)
	_, err = h.Client.Commit(ctx, k.Key, k.Reservation, cm)
	var e *client.Error
	switch {
	case err == nil:
	case errors.As(err, &e) && (e.Code == "stale_reservation" || e.Code == "already_finalized" || e.Code == "unknown_key"):
		// Another reservation took the key over, or a person resolved it:
		// this token commits nothing any more.
		h.Logger.WarnContext(ctx, "hook: the kept reservation no longer commits", "key", k.Key, "code", e.Code)
	default:
		return fmt.Errorf("commit %s: %w", k.Key, err)
	}
	return h.State.remove(file)
}

// commitOf is the outcome a PostToolUse reports.
func commitOf(in *Input) client.Commit {
	result := in.ToolResponse
	if in.Event == PostToolUseFailure {
		msg := "the tool failed"
		if in.IsInterrupt {
			msg = "the user interrupted the tool"
		}
		var text string
		if json.Unmarshal(in.Error, &text) == nil && text != "" {
			msg = text
		}
		return client.Commit{Outcome: "failed", Result: capResult(in.Error),
			Failure: &client.Failure{Code: ToolErrorCode, Message: truncate(msg, 1024)}}
	}
	if msg, failed := reportsError(result); failed {
		return client.Commit{Outcome: "failed", Result: capResult(result),
			Failure: &client.Failure{Code: ToolErrorCode, Message: truncate(msg, 1024)}}
	}
	return client.Commit{Outcome: "succeeded", Result: capResult(result)}
}

// reportsError reports whether a tool response says the tool failed — an
// error flag or message, a non-zero exit code, success false — and
// what it says.
func reportsError(resp json.RawMessage) (string, bool) {
	var r map[string]json.RawMessage
	if json.Unmarshal(resp, &r) != nil {
		return "", false
	}
	for _, name := range []string{"is_error", "isError"} {
		var b bool
		if json.Unmarshal(r[name], &b) == nil && b {
			return "the tool reported an error", true
		}
	}
	var success *bool
	if json.Unmarshal(r["success"], &success) == nil && success != nil && !*success {
		return "the tool reported no success", true
	}
	for _, name := range []string{"exit_code", "exitCode", "returncode"} {
		var code int64
		if json.Unmarshal(r[name], &code) == nil && code != 0 {
			return fmt.Sprintf("the command exited with status %d", code), true
		}
	}
	var text string
	if json.Unmarshal(r["error"], &text) == nil && text != "" {
		return text, true
	}
	var obj map[string]any
	if json.Unmarshal(r["error"], &obj) == nil && obj != nil {
		return "the tool reported an error", true
	}
	return "", false
}

// capResult is resp compacted, or when that is over the ledger's 64 KiB a
// JSON object that says so and keeps the start of its text.
func capResult(resp json.RawMessage) json.RawMessage {
	if len(resp) == 0 || string(resp) == "null" {
		return nil
	}
	var buf bytes.Buffer
	if json.Compact(&buf, resp) != nil {
		return nil
	}
	if buf.Len() <= maxResult {
		return buf.Bytes()
	}
	text := buf.String()
	n := maxResult - 1024
	for {
		head := text[:n]
		for !utf8.ValidString(head) {
			head = head[:len(head)-1]
		}
		out, _ := json.Marshal(map[string]any{
			"truncated": true,
			"note":      fmt.Sprintf("tool_response was %d bytes of JSON, over the ledger's %d-byte limit: head holds its first %d bytes as text", len(text), maxResult, len(head)),
			"head":      head,
		})
		if len(out) <= maxResult {
			return out
		}
		n -= len(out) - maxResult + 16
	}
}
