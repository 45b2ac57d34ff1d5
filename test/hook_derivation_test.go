package test

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
)

// derivationKey reads GET {prefix}/derivation-key of l.
func derivationKey(t *testing.T, l *Ledgerd, prefix string) *client.DerivationKey {
	t.Helper()
	r := l.Do("GET", prefix+"/derivation-key", "")
	require.Equal(t, 200, r.Status, r.Raw)
	key, err := hex.DecodeString(r.Body["key"].(string))
	require.NoError(t, err)
	return &client.DerivationKey{Payloads: r.Body["payloads"].(string), Key: key}
}

// reservedKeys lists the keys of l's reserve receipts of tool in the
// namespace whose routes start with prefix.
func reservedKeys(t *testing.T, l *Ledgerd, prefix, tool string) []string {
	t.Helper()
	r := l.Do("GET", prefix+"/receipts?kind=reserve&tool="+tool, "")
	require.Equal(t, 200, r.Status, r.Raw)
	var keys []string
	for _, rc := range r.Body["receipts"].([]any) {
		keys = append(keys, rc.(map[string]any)["idempotency_key"].(string))
	}
	return keys
}

// TestHook_derivedKeys (SPEC §14): in a committed namespace the hook
// derives a deduped call's key as dk2_ with the namespace's derivation
// key, which it keeps 0600 in its state directory (per server and
// namespace) and reads from there on later runs; the deduped repeat is
// still a replay. In an inline namespace it derives dk_ and keeps nothing.
func TestHook_derivedKeys(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"), "--default-payloads", "committed")
	r := l.Do("POST", "/v1/namespaces", `{"name":"plain","payloads":"inline"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	policy := filepath.Join(t.TempDir(), "hooks.json")
	require.NoError(t, os.WriteFile(policy, []byte(`[
		{"tool": "claude-code.Bash", "command": "git push*", "effect": "external", "dedupe": true},
		{"tool": "codex.Bash", "command": "npm publish*", "effect": "external", "dedupe": true}
	]`), 0o600))
	dk := derivationKey(t, l, "/v1")
	require.Equal(t, client.PayloadsCommitted, dk.Payloads)

	e := newHookEnv(t, l.URL, "--policy", policy)
	push := bash("s1", "toolu_01Push", "git push origin main")
	e.run(t, push.pre()).allowed(t)
	want, err := client.DeriveKeyWith(dk.Key, "claude-code.Bash",
		map[string]any{"tool_input": json.RawMessage(push.input), "scope": "s1"})
	require.NoError(t, err)
	assert.Equal(t, []string{want}, reservedKeys(t, l, "/v1", "claude-code.Bash"))
	e.run(t, push.post(bashOK)).allowed(t)
	kept := e.kept(t, "dk-")
	require.Len(t, kept, 1, "the derivation key is kept")
	st, err := os.Stat(kept[0])
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	data, err := os.ReadFile(kept[0])
	require.NoError(t, err)
	assert.Contains(t, string(data), hex.EncodeToString(dk.Key))

	why := e.run(t, bash("s1", "toolu_02Push", "git push origin main").pre()).reason(t)
	assert.Contains(t, why, "already ran")
	assert.Contains(t, why, want[:12])

	// Later runs read the kept key: one put in its place derives the keys.
	other := make([]byte, 32)
	other[0] = 7
	require.NoError(t, os.WriteFile(kept[0], []byte(`{"payloads":"committed","key":"`+hex.EncodeToString(other)+`"}`), 0o600))
	tags := bash("s1", "toolu_03Push", "git push origin --tags")
	e.run(t, tags.pre()).allowed(t)
	fromKept, err := client.DeriveKeyWith(other, "claude-code.Bash",
		map[string]any{"tool_input": json.RawMessage(tags.input), "scope": "s1"})
	require.NoError(t, err)
	assert.Contains(t, reservedKeys(t, l, "/v1", "claude-code.Bash"), fromKept)

	// An inline namespace: dk_, nothing kept. Codex CLI's objects.
	c := newHookEnv(t, l.URL, "--agent", "codex", "--policy", policy, "-n", "plain")
	pre := `{"session_id":"0199a0c2-7e3b","transcript_path":null,"cwd":"/work/app","hook_event_name":"PreToolUse","model":"gpt-5-codex","permission_mode":"default","tool_name":"Bash","tool_input":{"command":"npm publish"},"tool_use_id":"call_q1w2e3"}`
	post := `{"session_id":"0199a0c2-7e3b","transcript_path":null,"cwd":"/work/app","hook_event_name":"PostToolUse","model":"gpt-5-codex","permission_mode":"default","turn_id":"turn-7","tool_name":"Bash","tool_input":{"command":"npm publish"},"tool_response":"+ my-pkg@1.2.3","tool_use_id":"call_q1w2e3"}`
	c.run(t, pre).allowed(t)
	c.run(t, post).allowed(t)
	inline, err := client.DeriveKey("codex.Bash",
		map[string]any{"tool_input": json.RawMessage(`{"command":"npm publish"}`), "scope": "0199a0c2-7e3b"})
	require.NoError(t, err)
	assert.Equal(t, []string{inline}, reservedKeys(t, l, "/v1/ns/plain", "codex.Bash"))
	assert.Empty(t, c.kept(t, "dk-"), "an inline namespace's answer is not kept")
	assert.Contains(t, c.run(t, strings.Replace(pre, "call_q1w2e3", "call_r2", 1)).reason(t), "already ran")
}
