package hook

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/effect-ledger/effect-ledger/client"
)

// Hook answers one agent's hook calls against a ledger.
type Hook struct {
	Client *client.Client
	Agent  string // "claude-code", "codex", …: the ledger tool is <Agent>.<tool_name>
	Rules  Rules
	State  *State
	// Scope is what dedupe keys are derived within; empty: the session.
	Scope string
	// FailOpen lets a call run unrecorded when the ledger cannot be
	// reached or fails (unsafe: the default denies it).
	FailOpen bool
	// Lease is how long a reservation holds its key while the tool runs.
	Lease  time.Duration
	Logger *slog.Logger
}

// Pre answers a PreToolUse call: nil lets the agent go on (the effect is
// reserved, or the call only reads), a deny says why the call must not
// run.
func (h *Hook) Pre(ctx context.Context, in *Input) *Answer {
	tool := h.Agent + "." + in.ToolName
	rule := h.Rules.Match(h.Agent, in.ToolName, tool, in.ToolInput)
	if !rule.records() {
		return nil
	}
	fp, err := client.Fingerprint(in.ToolInput)
	if err != nil {
		return Deny(fmt.Sprintf("effect-ledger: the hook could not read this call's tool_input (%v), so it was not run.", err))
	}
	askFile := h.State.ask(in.SessionID, tool, fp)
	var prior asked
	remembered, err := h.State.read(askFile, &prior)
	if err != nil {
		return stateFailed(err)
	}
	key := prior.Key
	if !remembered {
		var dk *client.DerivationKey
		if rule.Dedupe {
			if dk, err = h.derivationKey(ctx); err != nil {
				return h.refused("", err)
			}
		}
		if key, err = h.key(in, tool, rule, dk); err != nil {
			return Deny(fmt.Sprintf("effect-ledger: the hook could not key this call (%v), so it was not run.", err))
		}
	}
	rsv, err := h.Client.Reserve(ctx, client.ReserveRequest{Key: key, ExecutionID: visible(in.ToolUseID, 128, "tu_"),
		Tool: tool, Class: client.Class(rule.Effect), Idempotent: rule.Idempotent, Input: in.ToolInput,
		ApprovalSummary: summary(h.Agent, in), Lease: h.Lease})
	var are *client.ApprovalRequiredError
	switch {
	case errors.As(err, &are):
		if err := h.State.write(askFile, asked{Key: key, Ask: are.Seq}); err != nil {
			return stateFailed(err)
		}
		return Deny(h.approvalReason(are))
	case err != nil:
		return h.refused(key, err)
	}
	if remembered {
		if err := h.State.remove(askFile); err != nil {
			h.Logger.WarnContext(ctx, "hook: remove the remembered ask", "err", err)
		}
	}
	switch rsv.Status {
	case "reserved":
		k := kept{Key: rsv.Key, Reservation: rsv.Token, Tool: tool}
		if err := h.State.write(h.State.reservation(in.SessionID, in.ToolUseID), k); err != nil {
			// Unkept, the token could never commit: the call stays unrun.
			return stateFailed(err)
		}
		return nil
	case "replayed":
		return Deny(h.replayReason(ctx, rsv))
	default: // not_recorded: the ledger says it is no effect
		return nil
	}
}

// key is the idempotency key of a call: tu_ + its tool_use_id (recorded
// once, never replayed), or with dedupe a key derived from what it does
// within the scope, with the namespace's derivation key dk (dk2_ in a
// namespace that commits its payloads, SPEC §14).
func (h *Hook) key(in *Input, tool string, rule Rule, dk *client.DerivationKey) (string, error) {
	if !rule.Dedupe {
		return visible(in.ToolUseID, client.MaxKeyLen, "tu_"), nil
	}
	scope := h.Scope
	if scope == "" {
		scope = in.SessionID
	}
	return dk.DeriveKey(tool, map[string]any{"tool_input": in.ToolInput, "scope": scope})
}

// visible is prefix + id when that is at most max bytes of visible ASCII
// (what keys and execution ids may hold), else prefix + id's SHA-256.
func visible(id string, max int, prefix string) string {
	s := prefix + id
	ok := len(s) <= max
	for i := 0; ok && i < len(s); i++ {
		ok = s[i] >= 0x21 && s[i] <= 0x7e
	}
	if ok {
		return s
	}
	sum := sha256.Sum256([]byte(id))
	return prefix + hex.EncodeToString(sum[:])
}

// summary is what the approver reads as the agent's account of the call.
func summary(agent string, in *Input) string {
	var fields struct {
		Command  any    `json:"command"`
		FilePath string `json:"file_path"`
		URL      string `json:"url"`
	}
	_ = json.Unmarshal(in.ToolInput, &fields)
	s := agent + " wants to run " + in.ToolName
	if in.Cwd != "" {
		s += " in " + in.Cwd
	}
	switch c := fields.Command.(type) {
	case string:
		s += ": " + c
	case []any:
		parts := make([]string, 0, len(c))
		for _, p := range c {
			parts = append(parts, fmt.Sprint(p))
		}
		s += ": " + strings.Join(parts, " ")
	default:
		if fields.FilePath != "" {
			s += ": " + fields.FilePath
		} else if fields.URL != "" {
			s += ": " + fields.URL
		}
	}
	return truncate(s, 1024)
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
