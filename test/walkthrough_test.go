package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requireTools fails the test when a command it runs is missing: in CI
// (CI set; .ci/run installs them) always, elsewhere it skips with the reason.
func requireTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing; CI must install it (see .ci/run)", tool)
			}
			t.Skipf("needs %s (apt-get install %s)", tool, tool)
		}
	}
}

// runBash runs bash with args and extra environment and returns stdout,
// stderr and the exit code.
func runBash(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	bash, err := exec.LookPath("bash")
	require.NoError(t, err)
	cmd := exec.Command(bash, args...)
	cmd.Env = append(os.Environ(), env...)
	return runCmd(t, cmd)
}

// headSeq returns the ledger's head seq over the API, with an optional token.
func headSeq(t *testing.T, l *Ledgerd, token string) float64 {
	t.Helper()
	var hdr []string
	if token != "" {
		hdr = []string{"Authorization", "Bearer " + token}
	}
	r := l.Do("GET", "/v1/head", "", hdr...)
	require.Equal(t, 200, r.Status, r.Raw)
	return r.Body["seq"].(float64)
}

// startWithToken starts ledgerd with an admin token and waits until
// anonymous requests are refused.
func startWithToken(t *testing.T) (*Ledgerd, string) {
	t.Helper()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	tok, stderr, code := ledgerctl(t, "token", "create", "--db", l.DB, "--role", "admin", "--name", "walkthrough-admin")
	require.Equal(t, 0, code, stderr)
	tok = strings.TrimSpace(tok)
	require.Eventually(t, func() bool { return l.Do("GET", "/v1/head", "").Status == 401 }, 60*time.Second, 50*time.Millisecond)
	return l, tok
}

const walkthroughScript = "../scripts/walkthrough.sh"

// receiptsPerRun is what one walk-through appends: reserve, commit and
// replay of the refund; reserve, failed commit, retry and commit of the mail.
const receiptsPerRun = 7

// TestWalkthroughScript runs scripts/walkthrough.sh against the real
// ledgerd: twice on one ledger (fresh keys), with a token, and failing
// loudly when a step fails.
func TestWalkthroughScript(t *testing.T) {
	t.Parallel()
	requireTools(t, "bash", "curl", "jq")
	t.Run("OK twice on one ledger", func(t *testing.T) {
		l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
		for run := 1; run <= 2; run++ {
			out, stderr, code := runBash(t, nil, walkthroughScript, l.URL)
			require.Equal(t, 0, code, "run %d:\n%s\n%s", run, out, stderr)
			assert.Contains(t, out, "walk-through OK")
			assert.Contains(t, out, `"status":"replayed"`)
			assert.Equal(t, float64(run*receiptsPerRun), headSeq(t, l, ""), "run %d appended every step", run)
		}
		out, stderr, code := ledgerctl(t, "verify", "--db", l.DB)
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, out, "OK: 14 receipts")
		assert.Contains(t, out, "2 runtime retries", "one per run: the mail's attempt 2")
	})
	t.Run("OK with LEDGER_TOKEN", func(t *testing.T) {
		l, tok := startWithToken(t)
		out, stderr, code := runBash(t, []string{"LEDGER_TOKEN=" + tok}, walkthroughScript, strings.TrimPrefix(l.URL, "http://"))
		require.Equal(t, 0, code, "%s\n%s", out, stderr)
		assert.Equal(t, float64(receiptsPerRun), headSeq(t, l, tok))
		r := l.Do("GET", "/v1/receipts/1", "", "Authorization", "Bearer "+tok)
		assert.Equal(t, "walkthrough-admin", r.Body["actor"], "the token's name is the actor")
	})
	t.Run("ErrUnauthorized exits 1 and prints the body", func(t *testing.T) {
		l, tok := startWithToken(t)
		for _, env := range [][]string{{"LEDGER_TOKEN="}, {"LEDGER_TOKEN=elt_wrong"}} {
			out, stderr, code := runBash(t, env, walkthroughScript, l.URL)
			assert.Equal(t, 1, code, "%q:\n%s\n%s", env, out, stderr)
			assert.Contains(t, stderr, "FAILED: 1. reserve: POST /v1/effects/reserve answered HTTP 401, want 201", "%q", env)
			assert.Contains(t, stderr, `"code":"unauthorized"`, "%q", env)
			assert.NotContains(t, out, "walk-through OK")
		}
		assert.Equal(t, float64(0), headSeq(t, l, tok), "nothing was appended")
	})
	t.Run("ErrUnreachable exits 1", func(t *testing.T) {
		l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
		url := l.URL
		require.NoError(t, l.Stop())
		_, stderr, code := runBash(t, nil, walkthroughScript, url)
		assert.Equal(t, 1, code)
		assert.Contains(t, stderr, "cannot reach ledgerd at "+url)
	})
	t.Run("ErrNoJQ names jq", func(t *testing.T) {
		curl, err := exec.LookPath("curl")
		require.NoError(t, err)
		dir := t.TempDir()
		require.NoError(t, os.Symlink(curl, filepath.Join(dir, "curl")))
		bash, err := exec.LookPath("bash")
		require.NoError(t, err)
		cmd := exec.Command(bash, walkthroughScript, "http://127.0.0.1:9")
		cmd.Env = []string{"PATH=" + dir}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%s", out)
		assert.Equal(t, 2, ee.ExitCode())
		assert.Contains(t, string(out), "walkthrough.sh needs jq")
	})
}

// walkthroughDoc is the page whose curl steps TestWalkthroughDoc runs.
const walkthroughDoc = "../docs/walkthrough.md"

// docWalkthrough returns the curl block of docs/walkthrough.md's steps with
// L pointing at url.
func docWalkthrough(t *testing.T, url string) string {
	t.Helper()
	block := docBlock(t, "The steps")
	const def = "L=http://127.0.0.1:8080\n"
	require.Contains(t, block, def)
	return strings.Replace(block, def, "L="+url+"\n", 1)
}

// docBlock returns the first sh block of docs/walkthrough.md's section.
func docBlock(t *testing.T, section string) string {
	t.Helper()
	raw, err := os.ReadFile(walkthroughDoc)
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(raw), "\n## "+section+"\n")
	require.True(t, ok, "%s has a section %q", walkthroughDoc, section)
	_, block, ok := strings.Cut(rest, "```sh\n")
	require.True(t, ok)
	block, _, ok = strings.Cut(block, "\n```")
	require.True(t, ok)
	return block
}

// TestWalkthroughDoc pastes docs/walkthrough.md's curl steps into bash,
// twice on one ledger and once with a token: every step must append its
// receipt.
func TestWalkthroughDoc(t *testing.T) {
	t.Parallel()
	requireTools(t, "bash", "curl", "jq")
	t.Run("OK twice", func(t *testing.T) {
		l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
		block := docWalkthrough(t, l.URL)
		for run := 1; run <= 2; run++ {
			out, stderr, code := runBash(t, []string{"LEDGER_TOKEN="}, "-c", block)
			require.Equal(t, 0, code, "%s\n%s", out, stderr)
			assert.Contains(t, out, `"status":"replayed"`)
			assert.Contains(t, stderr, `"retry":true`, "reserve answers are shown (tee)")
			assert.NotContains(t, out+stderr, `"error"`, "run %d", run)
			assert.Equal(t, float64(run*receiptsPerRun), headSeq(t, l, ""), "run %d: every step appended", run)
		}
		out, stderr, code := ledgerctl(t, "audit", "--db", l.DB, "--json")
		require.Equal(t, 0, code, stderr)
		assert.NotContains(t, out, `"interrupted":[{`, "every reservation was committed")
	})
	t.Run("a person in the loop", func(t *testing.T) {
		l, tok := startWithToken(t)
		block := docWalkthrough(t, l.URL) + "\n" + docBlock(t, "A person in the loop")
		out, stderr, code := runBash(t, []string{"LEDGER_TOKEN=" + tok}, "-c", block)
		require.Equal(t, 0, code, "%s\n%s", out, stderr)
		assert.NotContains(t, out+stderr, `"error"`)
		assert.Contains(t, stderr, `"status":"approval_required"`)
		assert.Contains(t, out, `"state":"approved"`)
		assert.Contains(t, out, `"status":"committed"`)
		assert.Contains(t, stderr, `"ask_seq":`, "the consuming reserve names the ask")
		out, stderr, code = ledgerctl(t, "verify", "--db", l.DB, "--all-namespaces")
		require.Equal(t, 0, code, "%s\n%s", out, stderr)
	})
	t.Run("OK with LEDGER_TOKEN", func(t *testing.T) {
		l, tok := startWithToken(t)
		out, stderr, code := runBash(t, []string{"LEDGER_TOKEN=" + tok}, "-c", docWalkthrough(t, l.URL))
		require.Equal(t, 0, code, "%s\n%s", out, stderr)
		assert.NotContains(t, out+stderr, `"error"`)
		assert.Equal(t, float64(receiptsPerRun), headSeq(t, l, tok))
	})
}
