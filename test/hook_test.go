package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests drive `ledgerctl hook` (SPEC §17) through the real binaries
// with the hook objects Claude Code and Codex CLI send: every field each
// agent sends for the event, on standard input.

// hookRun is one run of the hook command: its standard output, standard
// error and exit code.
type hookRun struct {
	out, err string
	code     int
}

// reason is the permissionDecisionReason of a deny, failing t unless the
// run printed exactly one deny in the agents' format.
func (r hookRun) reason(t *testing.T) string {
	t.Helper()
	require.Equal(t, 0, r.code, r.err)
	dec := json.NewDecoder(strings.NewReader(r.out))
	dec.DisallowUnknownFields()
	var a struct {
		HookSpecificOutput struct {
			HookEventName            string `json:"hookEventName"`
			PermissionDecision       string `json:"permissionDecision"`
			PermissionDecisionReason string `json:"permissionDecisionReason"`
		} `json:"hookSpecificOutput"`
	}
	require.NoError(t, dec.Decode(&a), "stdout: %q", r.out)
	assert.Equal(t, "PreToolUse", a.HookSpecificOutput.HookEventName)
	assert.Equal(t, "deny", a.HookSpecificOutput.PermissionDecision)
	require.NotEmpty(t, a.HookSpecificOutput.PermissionDecisionReason)
	return a.HookSpecificOutput.PermissionDecisionReason
}

// allowed fails t unless the run let the agent go on: exit 0, nothing on
// stdout.
func (r hookRun) allowed(t *testing.T) {
	t.Helper()
	require.Equal(t, 0, r.code, r.err)
	require.Empty(t, r.out, "a hook that lets the call go on prints nothing (never allow)")
}

// hookEnv is an agent's environment for the hook: its own state
// directory and the ledger's URL.
type hookEnv struct {
	state string // XDG_STATE_HOME
	url   string
	args  []string // flags every run gets
}

func newHookEnv(t *testing.T, url string, args ...string) *hookEnv {
	return &hookEnv{state: t.TempDir(), url: url, args: args}
}

// run pipes the hook object obj to `ledgerctl hook` with args.
func (e *hookEnv) run(t *testing.T, obj string, args ...string) hookRun {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "ledgerctl"), append(append([]string{"hook"}, e.args...), args...)...)
	cmd.Env = append(os.Environ(), "XDG_STATE_HOME="+e.state, "LEDGER_SERVER="+e.url)
	cmd.Stdin = strings.NewReader(obj)
	out, errOut, code := runCmd(t, cmd)
	return hookRun{out, errOut, code}
}

// kept lists the files the hook keeps in its state directory.
func (e *hookEnv) kept(t *testing.T, prefix string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(e.state, "effect-ledger", "hooks", prefix+"*"))
	require.NoError(t, err)
	return m
}

// claudeCall is a Claude Code tool call's hook objects.
type claudeCall struct {
	session, tool, id string
	input             string
}

func (c claudeCall) common(event string) string {
	return fmt.Sprintf(`"session_id":%q,"transcript_path":"/home/dev/.claude/projects/-work-app/%s.jsonl","cwd":"/work/app","permission_mode":"default","hook_event_name":%q,"tool_name":%q,"tool_input":%s,"tool_use_id":%q`,
		c.session, c.session, event, c.tool, c.input, c.id)
}

func (c claudeCall) pre() string { return "{" + c.common("PreToolUse") + "}" }

func (c claudeCall) post(response string) string {
	return "{" + c.common("PostToolUse") + `,"tool_response":` + response + "}"
}

func (c claudeCall) failure(msg string) string {
	return fmt.Sprintf(`{%s,"error":%q,"is_interrupt":false}`, c.common("PostToolUseFailure"), msg)
}

func bash(session, id, command string) claudeCall {
	return claudeCall{session, "Bash", id, fmt.Sprintf(`{"command":%q,"description":"Run it","timeout":120000}`, command)}
}

const bashOK = `{"stdout":"Everything up-to-date","stderr":"","interrupted":false,"isImage":false}`

// keyView reads key from l.
func keyView(t *testing.T, l *Ledgerd, key string) map[string]any {
	t.Helper()
	r := l.Do("GET", "/v1/effects/"+key, "")
	require.Equal(t, 200, r.Status, r.Raw)
	return r.Body
}

// lastReceipt is the last receipt of a key view.
func lastReceipt(v map[string]any) map[string]any {
	rs := v["receipts"].([]any)
	return rs[len(rs)-1].(map[string]any)
}

// TestHook_claudeCode: reads are not recorded; an edit or a shell command
// is reserved before it runs (its token kept 0600) and committed after —
// succeeded with the response, failed (TOOL_ERROR) from PostToolUseFailure
// or a response that reports an error, a response over 64 KiB truncated
// with a note; the same tool_use_id again is a replay the model is told
// about; a git push the policy dedupes runs once in a session, again in
// another.
func TestHook_claudeCode(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		l := StartLedgerd(t, db)
		policy := filepath.Join(t.TempDir(), "hooks.json")
		require.NoError(t, os.WriteFile(policy, []byte(`[
			{"tool": "claude-code.Bash", "command": "git push*", "effect": "external", "dedupe": true},
			{"tool": "claude-code.Bash", "command": "ls*", "effect": "read"}
		]`), 0o600))
		e := newHookEnv(t, l.URL, "--policy", policy)

		read := claudeCall{"s1", "Read", "toolu_01Read", `{"file_path":"/work/app/main.go"}`}
		e.run(t, read.pre()).allowed(t)
		e.run(t, read.post(`{"type":"text","file":{"filePath":"/work/app/main.go","content":"package main"}}`)).allowed(t)
		e.run(t, bash("s1", "toolu_01Ls", "ls -la").pre()).allowed(t)
		assert.Equal(t, float64(0), l.Do("GET", "/v1/head", "").Body["seq"], "reads are not recorded")

		// An edit: reserved, its token kept 0600, committed succeeded.
		edit := claudeCall{"s1", "Edit", "toolu_01Edit", `{"file_path":"/work/app/main.go","old_string":"a","new_string":"b","replace_all":false}`}
		e.run(t, edit.pre()).allowed(t)
		files := e.kept(t, "rsv-")
		require.Len(t, files, 1)
		st, err := os.Stat(files[0])
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
		dir, err := os.Stat(filepath.Dir(files[0]))
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o700), dir.Mode().Perm())
		v := keyView(t, l, "tu_toolu_01Edit")
		assert.Equal(t, "reserved", v["state"])
		assert.Equal(t, "claude-code.Edit", v["tool"])
		assert.Equal(t, "write", v["effect"])
		e.run(t, edit.post(`{"filePath":"/work/app/main.go","oldString":"a","newString":"b","structuredPatch":[]}`)).allowed(t)
		assert.Empty(t, e.kept(t, "rsv-"), "the token is removed after the commit")
		v = keyView(t, l, "tu_toolu_01Edit")
		assert.Equal(t, "succeeded", v["state"])
		assert.Contains(t, lastReceipt(v)["result"], "structuredPatch", "the response is the result")

		// The same tool_use_id again is recorded once, never run twice.
		why := e.run(t, edit.pre()).reason(t)
		for _, want := range []string{"already ran at ", "receipt ", "tu_toolu_01Edit", "succeeded", "not run again"} {
			assert.Contains(t, why, want)
		}
		e.run(t, edit.post(`{}`)).allowed(t) // no kept reservation: nothing

		// A failure, from PostToolUseFailure and from a response.
		mk := bash("s1", "toolu_01Make", "make test")
		e.run(t, mk.pre()).allowed(t)
		e.run(t, mk.failure("Exit code 2\nFAIL")).allowed(t)
		v = keyView(t, l, "tu_toolu_01Make")
		assert.Equal(t, "failed", v["state"])
		assert.Equal(t, "TOOL_ERROR", lastReceipt(v)["error_code"])
		assert.Equal(t, false, lastReceipt(v)["retryable"])
		fetch := claudeCall{"s1", "WebFetch", "toolu_01Fetch", `{"url":"https://example.com/hook","prompt":"post it"}`}
		e.run(t, fetch.pre()).allowed(t)
		e.run(t, fetch.post(`{"code":500,"is_error":true,"result":"server error"}`)).allowed(t)
		assert.Equal(t, "failed", keyView(t, l, "tu_toolu_01Fetch")["state"])

		// A response over 64 KiB is truncated, with a note saying so.
		big := claudeCall{"s1", "Write", "toolu_01Big", `{"file_path":"/work/app/big.txt","content":"x"}`}
		e.run(t, big.pre()).allowed(t)
		e.run(t, big.post(fmt.Sprintf(`{"type":"create","content":%q}`, strings.Repeat("é", 70<<10)))).allowed(t)
		v = keyView(t, l, "tu_toolu_01Big")
		assert.Equal(t, "succeeded", v["state"])
		res := lastReceipt(v)["result"].(map[string]any)
		assert.Equal(t, true, res["truncated"])
		assert.Contains(t, res["note"], "over the ledger's 65536-byte limit")

		// git push, deduped by the policy: once per session.
		push := bash("s1", "toolu_01Push", "git push origin main")
		e.run(t, push.pre()).allowed(t)
		e.run(t, push.post(bashOK)).allowed(t)
		again := bash("s1", "toolu_02Push", "git push origin main")
		why = e.run(t, again.pre()).reason(t)
		assert.Contains(t, why, "already ran")
		assert.Contains(t, why, "Everything up-to-date", "the model reads the recorded outcome")
		e.run(t, again.post(bashOK)).allowed(t)
		e.run(t, bash("s2", "toolu_03Push", "git push origin main").pre()).allowed(t)
		out, stderr, code := ledgerctl(t, "receipts", "--server", l.URL, "--tool", "claude-code.Bash", "--kind", "reserve", "--json")
		require.Equal(t, 0, code, stderr)
		assert.Equal(t, 3, strings.Count(out, `"kind":"reserve"`), "make test, the push of s1 and the push of s2: %s", out)
		verified(t, db)
	})
}

// TestHook_racingDedupe: two hook processes racing on the same deduped
// command: exactly one lets it run, the other denies it.
func TestHook_racingDedupe(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		l := StartLedgerd(t, db)
		policy := filepath.Join(t.TempDir(), "hooks.json")
		require.NoError(t, os.WriteFile(policy, []byte(`[{"tool":"claude-code.Bash","command":"./deploy.sh *","effect":"external","dedupe":true}]`), 0o600))
		e := newHookEnv(t, l.URL, "--policy", policy)
		for round := range 3 {
			runs := make([]hookRun, 2)
			var wg sync.WaitGroup
			for i := range runs {
				wg.Go(func() {
					runs[i] = e.run(t, bash("s-race", fmt.Sprintf("toolu_%d_%d", round, i), fmt.Sprintf("./deploy.sh prod-%d", round)).pre())
				})
			}
			wg.Wait()
			ran := 0
			for _, r := range runs {
				require.Equal(t, 0, r.code, r.err)
				if r.out == "" {
					ran++
				} else {
					assert.Contains(t, r.reason(t), "in_progress")
				}
			}
			assert.Equal(t, 1, ran, "exactly one of two racing hooks lets the deploy run: %+v", runs)
		}
	})
}

// TestHook_approvalAndDenial: the namespace's policy sends the agent's
// shell to a person and denies its web fetches; the hook turns both into
// the agent's deny with a reason naming the ask and its page; the
// identical call in the session presents the same key, so a person's
// approval (ledgerctl approvals approve) runs it once.
func TestHook_approvalAndDenial(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		l := StartLedgerd(t, db)
		policy := filepath.Join(t.TempDir(), "policy.json")
		require.NoError(t, os.WriteFile(policy, []byte(`{"rules":[
			{"tool":"claude-code.Bash","approval":"required","expires_in_ms":600000},
			{"tool":"claude-code.WebFetch","deny":true}]}`), 0o600))
		_, stderr, code := ledgerctl(t, "policy", "set", "--server", l.URL, "default", policy)
		require.Equal(t, 0, code, stderr)
		e := newHookEnv(t, l.URL)

		why := e.run(t, claudeCall{"s1", "WebFetch", "toolu_01F", `{"url":"https://example.com","prompt":"x"}`}.pre()).reason(t)
		assert.Contains(t, why, "denied_by_policy")
		assert.Contains(t, why, "not run")

		call := func(id string) claudeCall { return bash("s1", id, "kubectl rollout restart deploy/api") }
		why = e.run(t, call("toolu_01A").pre()).reason(t)
		list := l.Do("GET", "/v1/approvals?state=pending", "")
		require.Equal(t, 200, list.Status, list.Raw)
		asks := list.Body["approvals"].([]any)
		require.Len(t, asks, 1)
		seq := int64(asks[0].(map[string]any)["seq"].(float64))
		for _, want := range []string{fmt.Sprintf("ask %d", seq), fmt.Sprintf("%s/ui/#approvals/%d", l.URL, seq),
			fmt.Sprintf("ledgerctl approvals approve %d --server %s", seq, l.URL), "identical call again", "not run"} {
			assert.Contains(t, why, want)
		}
		assert.Contains(t, asks[0].(map[string]any)["summary"], "kubectl rollout restart deploy/api")
		e.run(t, call("toolu_01A").post(bashOK)).allowed(t) // never reserved: nothing to commit

		// Asked again before the answer: the same ask, no second one.
		assert.Contains(t, e.run(t, call("toolu_02A").pre()).reason(t), fmt.Sprintf("ask %d", seq))
		assert.Len(t, l.Do("GET", "/v1/approvals?state=pending", "").Body["approvals"], 1)

		_, stderr, code = ledgerctl(t, "approvals", "approve", fmt.Sprint(seq), "--server", l.URL, "--note", "ok")
		require.Equal(t, 0, code, stderr)
		e.run(t, call("toolu_03A").pre()).allowed(t)
		e.run(t, call("toolu_03A").post(bashOK)).allowed(t)
		consumed := l.Do("GET", "/v1/approvals?state=consumed", "")
		assert.Len(t, consumed.Body["approvals"], 1, consumed.Raw)
		assert.Empty(t, e.kept(t, "ask-"), "the remembered key is forgotten once the approval is used")

		// The approval is consumed once: the next identical call asks anew.
		assert.Contains(t, e.run(t, call("toolu_04A").pre()).reason(t), "needs a person's approval")
		verified(t, db)
	})
}

// TestHook_ledgerUnavailable: with the ledger unreachable an effect is
// denied (fail closed), a read still runs, and --fail-open lets the call
// run unrecorded.
func TestHook_ledgerUnavailable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())
	e := newHookEnv(t, url)
	why := e.run(t, bash("s1", "toolu_01", "rm -rf build").pre()).reason(t)
	assert.Contains(t, why, "ledger_unavailable")
	assert.Contains(t, why, "not run")
	e.run(t, claudeCall{"s1", "Grep", "toolu_02", `{"pattern":"TODO","path":"/work/app"}`}.pre()).allowed(t)
	open := e.run(t, bash("s1", "toolu_03", "rm -rf build").pre(), "--fail-open")
	open.allowed(t)
	assert.Contains(t, open.err, "unrecorded")
	r := e.run(t, bash("s1", "toolu_04", "rm -rf build").post(bashOK))
	assert.Equal(t, 0, r.code, "no kept reservation: nothing to commit")

	// Not configured at all, or fed a broken object: the call is refused.
	cmd := exec.Command(filepath.Join(binDir, "ledgerctl"), "hook")
	cmd.Env = append(os.Environ(), "XDG_STATE_HOME="+t.TempDir(), "LEDGER_SERVER=", "LEDGERCTL_SERVER=")
	cmd.Stdin = strings.NewReader(bash("s1", "toolu_05", "rm -rf build").pre())
	out, errOut, code := runCmd(t, cmd)
	assert.Contains(t, hookRun{out, errOut, code}.reason(t), "not configured")
	broken := e.run(t, `{"hook_event_name":"PreToolUse","tool_name":"Bash"`)
	assert.Equal(t, 2, broken.code, "exit 2 blocks the call in both agents")
	assert.Contains(t, broken.err, "not run")
}

// TestHook_codex: Codex CLI's hook objects (its own fields: model,
// turn_id, a null transcript_path) with --agent codex.
func TestHook_codex(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		l := StartLedgerd(t, db)
		e := newHookEnv(t, l.URL, "--agent", "codex")
		pre := `{"session_id":"0199a0c2-7e3b","transcript_path":null,"cwd":"/work/app","hook_event_name":"PreToolUse","model":"gpt-5-codex","permission_mode":"default","tool_name":"Bash","tool_input":{"command":"npm publish"},"tool_use_id":"call_q1w2e3"}`
		post := `{"session_id":"0199a0c2-7e3b","transcript_path":null,"cwd":"/work/app","hook_event_name":"PostToolUse","model":"gpt-5-codex","permission_mode":"default","turn_id":"turn-7","tool_name":"Bash","tool_input":{"command":"npm publish"},"tool_response":"+ my-pkg@1.2.3","tool_use_id":"call_q1w2e3"}`
		e.run(t, pre).allowed(t)
		e.run(t, post).allowed(t)
		v := keyView(t, l, "tu_call_q1w2e3")
		assert.Equal(t, "succeeded", v["state"])
		assert.Equal(t, "codex.Bash", v["tool"])
		assert.Equal(t, "+ my-pkg@1.2.3", lastReceipt(v)["result"])
		assert.Contains(t, e.run(t, pre).reason(t), "already ran")
	})
}

// TestHook_install: install merges the hook into the agent's settings,
// keeping every other member and entry in its order, replaces its own
// entry on a second install, never writes the token, and refuses a
// malformed settings file, leaving it byte for byte.
func TestHook_install(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	settings := filepath.Join(dir, ".claude", "settings.json")
	require.NoError(t, os.MkdirAll(filepath.Dir(settings), 0o755))
	before := `{
  "permissions": {"allow": ["Bash(npm test:*)"], "deny": ["Read(./.env)"]},
  "env": {"FOO": "1"},
  "hooks": {
    "PostToolUse": [{"matcher": "Edit|Write", "hooks": [{"type": "command", "command": "npx prettier --write"}]}],
    "Stop": [{"hooks": [{"type": "command", "command": "say done"}]}]
  },
  "model": "opus"
}`
	require.NoError(t, os.WriteFile(settings, []byte(before), 0o640))
	install := func(args ...string) (string, string, int) {
		return ledgerctlEnv(t, []string{"LEDGER_TOKEN=elt_never_written"}, append([]string{"hook", "install", "--project", dir}, args...)...)
	}
	out, stderr, code := install("--server", "http://127.0.0.1:8080", "--policy", "/etc/effect ledger/hooks.json")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, settings)
	data, err := os.ReadFile(settings)
	require.NoError(t, err)
	assert.NotContains(t, string(data), "elt_never_written")
	st, err := os.Stat(settings)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o640), st.Mode().Perm(), "the file keeps its mode")

	var got, want map[string]any
	require.NoError(t, json.Unmarshal(data, &got))
	require.NoError(t, json.Unmarshal([]byte(before), &want))
	for _, k := range []string{"permissions", "env", "model"} {
		assert.Equal(t, want[k], got[k], k)
	}
	for _, order := range [][]string{{`"permissions"`, `"env"`, `"hooks"`, `"model": "opus"`}, {`"PostToolUse"`, `"Stop"`, `"PreToolUse"`, `"PostToolUseFailure"`}} {
		for i := 1; i < len(order); i++ {
			assert.Less(t, strings.Index(string(data), order[i-1]), strings.Index(string(data), order[i]), "%s before %s", order[i-1], order[i])
		}
	}
	hooks := got["hooks"].(map[string]any)
	assert.Equal(t, want["hooks"].(map[string]any)["Stop"], hooks["Stop"])
	post := hooks["PostToolUse"].([]any)
	require.Len(t, post, 2)
	assert.Equal(t, want["hooks"].(map[string]any)["PostToolUse"].([]any)[0], post[0], "the user's own entry stays first")
	for _, ev := range []string{"PreToolUse", "PostToolUse", "PostToolUseFailure"} {
		list := hooks[ev].([]any)
		mine := list[len(list)-1].(map[string]any)
		assert.Equal(t, "*", mine["matcher"])
		h := mine["hooks"].([]any)[0].(map[string]any)
		assert.Equal(t, "command", h["type"])
		assert.Contains(t, h["command"], "ledgerctl hook --agent claude-code --policy '/etc/effect ledger/hooks.json' --server http://127.0.0.1:8080")
	}

	// Again with other flags: replaced, not added.
	_, stderr, code = install("--server", "http://10.0.0.2:8080")
	require.Equal(t, 0, code, stderr)
	data, err = os.ReadFile(settings)
	require.NoError(t, err)
	assert.Equal(t, 3, strings.Count(string(data), "ledgerctl hook"), "%s", data)
	assert.NotContains(t, string(data), "127.0.0.1")

	// A malformed file is refused and left byte for byte.
	for _, bad := range []string{`{"hooks": {"PreToolUse": [}`, `["not", "an", "object"]`, `{"hooks": []}`, `{"hooks": {"PreToolUse": {}}}`} {
		require.NoError(t, os.WriteFile(settings, []byte(bad), 0o644))
		_, stderr, code = install()
		assert.NotEqual(t, 0, code)
		assert.Contains(t, stderr, "left unchanged")
		after, err := os.ReadFile(settings)
		require.NoError(t, err)
		assert.Equal(t, bad, string(after))
	}

	// Codex: .codex/hooks.json, every tool (no matcher), created.
	_, stderr, code = install("--agent", "codex", "--server", "http://127.0.0.1:8080")
	require.Equal(t, 0, code, stderr)
	data, err = os.ReadFile(filepath.Join(dir, ".codex", "hooks.json"))
	require.NoError(t, err)
	var codex struct {
		Hooks map[string][]struct {
			Matcher *string `json:"matcher"`
			Hooks   []struct{ Type, Command string }
		} `json:"hooks"`
	}
	require.NoError(t, json.Unmarshal(data, &codex))
	assert.Len(t, codex.Hooks, 2)
	for _, ev := range []string{"PreToolUse", "PostToolUse"} {
		require.Len(t, codex.Hooks[ev], 1)
		assert.Nil(t, codex.Hooks[ev][0].Matcher)
		assert.Contains(t, codex.Hooks[ev][0].Hooks[0].Command, "hook --agent codex --server http://127.0.0.1:8080")
	}
	assert.True(t, bytes.HasSuffix(data, []byte("\n")))
}
