package hook_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/cmd/ledgerctl/hook"
)

func TestRules_Match(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.json")
	require.NoError(t, os.WriteFile(path, []byte(`[
		{"tool": "claude-code.Bash", "command": "git push*", "effect": "external", "dedupe": true},
		{"tool": "claude-code.Bash", "command": "git *", "effect": "read"},
		{"tool": "*.mcp__*", "effect": "read"},
		{"tool": "codex.apply_patch", "effect": "write", "idempotent": true}
	]`), 0o600))
	rules, err := hook.LoadRules(path)
	require.NoError(t, err)
	for _, tc := range []struct {
		desc, agent, tool, input string
		effect                   string
		dedupe, idempotent       bool
	}{
		{desc: "first match wins", agent: "claude-code", tool: "Bash", input: `{"command":"git push origin main"}`, effect: "external", dedupe: true},
		{desc: "a later rule", agent: "claude-code", tool: "Bash", input: `{"command":"git status"}`, effect: "read"},
		{desc: "no rule: a write", agent: "claude-code", tool: "Bash", input: `{"command":"make"}`, effect: "write"},
		{desc: "no string command: command rules skip", agent: "claude-code", tool: "Bash", input: `{"command":["git","push"]}`, effect: "write"},
		{desc: "a read tool of the agent", agent: "claude-code", tool: "Grep", input: `{"pattern":"x"}`, effect: "read"},
		{desc: "an edit", agent: "claude-code", tool: "Edit", input: `{}`, effect: "write"},
		{desc: "glob over the ledger tool name", agent: "codex", tool: "mcp__memory__create", input: `{}`, effect: "read"},
		{desc: "codex reads nothing by default", agent: "codex", tool: "Read", input: `{}`, effect: "write"},
		{desc: "idempotent", agent: "codex", tool: "apply_patch", input: `{"command":"*** Begin Patch"}`, effect: "write", idempotent: true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			r := rules.Match(tc.agent, tc.tool, tc.agent+"."+tc.tool, json.RawMessage(tc.input))
			assert.Equal(t, tc.effect, r.Effect)
			assert.Equal(t, tc.dedupe, r.Dedupe)
			assert.Equal(t, tc.idempotent, r.Idempotent)
		})
	}
}

func TestLoadRules_errors(t *testing.T) {
	for _, tc := range []struct{ desc, text, wantErr string }{
		{"ErrUnknownMember", `[{"tool":"x","effect":"write","approve":true}]`, "unknown field"},
		{"ErrEffect", `[{"tool":"x","effect":"maybe"}]`, "effect must be"},
		{"ErrGlob", `[{"tool":"x[","effect":"write"}]`, "rule 0"},
		{"ErrNotAList", `{"rules":[]}`, "hook policy"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rules.json")
			require.NoError(t, os.WriteFile(path, []byte(tc.text), 0o600))
			_, err := hook.LoadRules(path)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

// TestInstall_again: a second install with the same command writes the
// same bytes, and one with another command replaces the first.
func TestInstall_again(t *testing.T) {
	s, err := hook.SettingsFor("claude-code", t.TempDir(), "", false)
	require.NoError(t, err)
	first, err := hook.Install(s, "/usr/local/bin/ledgerctl hook --agent claude-code")
	require.NoError(t, err)
	again, err := hook.Install(s, "/usr/local/bin/ledgerctl hook --agent claude-code")
	require.NoError(t, err)
	assert.Equal(t, string(first), string(again))
	other, err := hook.Install(s, "ledgerctl hook --agent claude-code --server http://10.0.0.2:8080")
	require.NoError(t, err)
	var got struct {
		Hooks map[string][]struct {
			Matcher string
			Hooks   []struct{ Type, Command string }
		}
	}
	require.NoError(t, json.Unmarshal(other, &got))
	require.Len(t, got.Hooks, 3)
	for ev, list := range got.Hooks {
		require.Len(t, list, 1, ev)
		assert.Equal(t, "*", list[0].Matcher)
		assert.Equal(t, "ledgerctl hook --agent claude-code --server http://10.0.0.2:8080", list[0].Hooks[0].Command)
	}
	_, err = hook.SettingsFor("cursor", "", "", false)
	assert.Error(t, err)
}
