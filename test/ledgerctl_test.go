package test

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// ledgerctl runs the binary and returns stdout, stderr and the exit code.
func ledgerctl(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	return ledgerctlEnv(t, nil, args...)
}

// runCmd runs cmd and returns stdout, stderr and the exit code; an error
// other than a non-zero exit fails t.
func runCmd(t *testing.T, cmd *exec.Cmd) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return out.String(), errb.String(), code
}

// startPopulated starts ledgerd (with args) on a new file and a clock an
// hour in the past, and populates it.
func startPopulated(t *testing.T, args ...string) *Ledgerd {
	t.Helper()
	clock := newPastClock(t)
	l := clock.start(t, filepath.Join(t.TempDir(), "ledger.db"), args...)
	populate(t, l, clock)
	return l
}

// populate drives a ledger through every kind of receipt; l runs on clock,
// which populate moves past the lease of the reservation it leaves
// interrupted.
func populate(t *testing.T, l *Ledgerd, clock *testClock) {
	t.Helper()
	tok := l.Reserve(t, reserve("mail-0001-abc", "exec-1", 1, true))
	l.Commit(t, "mail-0001-abc", `{"reservation":"`+tok+`","outcome":"failed","error":{"code":"TIMEOUT","retryable":true}}`)
	r := l.Do("POST", "/v1/effects/reserve", reserve("mail-0001-abc", "exec-1", 2, true))
	require.Equal(t, 201, r.Status, r.Raw)
	l.Commit(t, "mail-0001-abc", `{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded","external_ref":"msg_1"}`)
	r = l.Do("POST", "/v1/effects/reserve", reserve("mail-0001-abc", "exec-2", 1, true))
	require.Equal(t, 200, r.Status, r.Raw)
	r = l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"charge-0003","execution_id":"exec-4","tool":"payments.charge","effect":"write","lease_ms":10}`)
	require.Equal(t, 201, r.Status, r.Raw)
	clock.advance(20 * time.Millisecond) // charge-0003's lease ends: interrupted
}

func TestLedgerctl(t *testing.T) {
	t.Parallel()
	l := startPopulated(t)
	srv := []string{"--server", l.URL}
	db := []string{"--db", l.DB}

	t.Run("verify OK against the file and the server", func(t *testing.T) {
		for _, src := range [][]string{db, srv} {
			out, stderr, code := ledgerctl(t, append([]string{"verify", "--json"}, src...)...)
			require.Equal(t, 0, code, stderr)
			var rep struct {
				OK       bool   `json:"ok"`
				Receipts uint64 `json:"receipts"`
				Head     struct {
					Seq  uint64 `json:"seq"`
					Hash string `json:"hash"`
				} `json:"head"`
				Violations []any                        `json:"violations"`
				Audit      map[string][]json.RawMessage `json:"audit"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
			assert.True(t, rep.OK)
			assert.Equal(t, uint64(6), rep.Receipts)
			assert.Empty(t, rep.Violations)
			for _, m := range []string{"runtime_retries", "re_invocations", "duplicate_effects", "repeated_failures", "interrupted", "failed", "resolutions"} {
				assert.Contains(t, rep.Audit, m)
			}
			assert.Len(t, rep.Audit["runtime_retries"], 1)
			assert.Len(t, rep.Audit["re_invocations"], 1)
			assert.Len(t, rep.Audit["interrupted"], 1)
		}
		out, _, code := ledgerctl(t, append([]string{"verify"}, db...)...)
		assert.Equal(t, 0, code)
		assert.Contains(t, out, "OK: 6 receipts")
	})
	t.Run("head, receipts, show, export", func(t *testing.T) {
		head, _, code := ledgerctl(t, append([]string{"head"}, srv...)...)
		require.Equal(t, 0, code)
		fileHead, _, _ := ledgerctl(t, append([]string{"head"}, db...)...)
		assert.Equal(t, head, fileHead)
		assert.True(t, strings.HasPrefix(head, "6:"), head)

		out, _, code := ledgerctl(t, append([]string{"receipts", "--json", "--kind", "commit"}, db...)...)
		require.Equal(t, 0, code)
		var page struct {
			Receipts  []map[string]any `json:"receipts"`
			NextAfter *uint64          `json:"next_after"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &page))
		assert.Len(t, page.Receipts, 2)
		out, _, _ = ledgerctl(t, append([]string{"receipts", "--limit", "2"}, srv...)...)
		assert.Contains(t, out, "--after 2")

		out, _, code = ledgerctl(t, append([]string{"show", "mail-0001-abc"}, db...)...)
		require.Equal(t, 0, code)
		assert.Contains(t, out, "succeeded")
		assert.Contains(t, out, "TIMEOUT")
		_, _, code = ledgerctl(t, append([]string{"show", "no-such-key-1"}, srv...)...)
		assert.Equal(t, 2, code)

		out, _, code = ledgerctl(t, append([]string{"export"}, srv...)...)
		require.Equal(t, 0, code)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		assert.Len(t, lines, 6)
		fileOut, _, _ := ledgerctl(t, append([]string{"export"}, db...)...)
		assert.Equal(t, out, fileOut, "the file and the server export the same bytes")
	})
	t.Run("resolve", func(t *testing.T) {
		_, stderr, code := ledgerctl(t, append([]string{"resolve", "charge-0003", "--outcome", "failed", "--error-code", "NOT_CHARGED"}, srv...)...)
		assert.Equal(t, 2, code, "--note is required")
		assert.Contains(t, stderr, "--note")
		_, _, code = ledgerctl(t, append([]string{"resolve", "charge-0003", "--outcome", "failed", "--note", "x"}, db...)...)
		assert.Equal(t, 2, code, "server only")
		out, stderr, code := ledgerctl(t, append([]string{"resolve", "charge-0003", "--outcome", "failed", "--error-code", "NOT_CHARGED", "--note", "no charge at the PSP"}, srv...)...)
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, out, "now failed")
		out, _, _ = ledgerctl(t, append([]string{"audit", "--json"}, db...)...)
		assert.Contains(t, out, `"note":"no charge at the PSP"`)
	})
	t.Run("usage errors exit 2", func(t *testing.T) {
		for _, args := range [][]string{{}, {"bogus"}, {"verify"}, {"verify", "--db", "/no/such/file.db"}, {"verify", "--db", l.DB, "--incremental"},
			{"verify", "--db", l.DB, "--expect-head", "nope"}} {
			_, _, code := ledgerctl(t, args...)
			assert.Equal(t, 2, code, "%q", args)
		}
		_, _, code := ledgerctl(t, "verify", "--help")
		assert.Equal(t, 0, code)
	})
}

// TestLedgerctl_tampered verifies a tampered copy of a real ledger: exit 1
// and the rule named; a state file pins the head across runs.
func TestLedgerctl_tampered(t *testing.T) {
	t.Parallel()
	l := startPopulated(t)
	require.NoError(t, l.Stop())
	dir := t.TempDir()
	state := filepath.Join(dir, "state.json")

	_, stderr, code := ledgerctl(t, "verify", "--db", l.DB, "--state", state, "--incremental")
	require.Equal(t, 0, code, stderr)
	b, err := os.ReadFile(state)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"seq":6`)

	l = StartLedgerd(t, l.DB) // the chain grows; the next incremental run checks only the new receipt
	r := l.Do("POST", "/v1/effects/reserve", reserve("mail-0009-abc", "exec-9", 1, false))
	require.Equal(t, 201, r.Status)
	out, stderr, code := ledgerctl(t, "verify", "--db", l.DB, "--state", state, "--incremental", "--json")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, `"checked":1`)
	require.NoError(t, l.Stop())

	tampered := copyLedger(t, l.DB, `UPDATE receipts SET external_ref = 'msg_forged' WHERE seq = 4`)

	out, _, code = ledgerctl(t, "verify", "--db", tampered)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "hash_mismatch")
	out, _, code = ledgerctl(t, "verify", "--db", tampered, "--json")
	assert.Equal(t, 1, code)
	assert.Contains(t, out, `"rule":"hash_mismatch"`)

	// Truncation is invisible to a self-consistent chain, but not to a pin.
	editLedger(t, tampered, `DELETE FROM receipts WHERE seq >= 4`)
	out, _, code = ledgerctl(t, "verify", "--db", tampered)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "derived_state", "the recorded head still names the deleted receipts")

	// ledgerd refuses to serve it: the recorded head is gone from the chain.
	_, err = ledgertest.TryOpen(t, ledgertest.WithPath(tampered))
	require.ErrorIs(t, err, ledger.ErrDerivedState)

	// A careful forger rebuilds the derived state too (rebuild-index): the
	// chain is then self-consistent, and only the pinned head reveals the
	// truncation.
	_, _, code = ledgerctl(t, "rebuild-index", "--db", tampered)
	require.Equal(t, 0, code)
	_, _, code = ledgerctl(t, "verify", "--db", tampered)
	assert.Equal(t, 0, code, "a truncated chain with rebuilt keys is self-consistent")
	before, err := os.ReadFile(state)
	require.NoError(t, err)
	out, _, code = ledgerctl(t, "verify", "--db", tampered, "--state", state)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "head_mismatch")
	after, err := os.ReadFile(state)
	require.NoError(t, err)
	assert.Equal(t, before, after, "a failed run leaves the state file alone")
}

// TestLedgerd_verifyEvery runs the periodic verifier inside ledgerd.
func TestLedgerd_verifyEvery(t *testing.T) {
	t.Parallel()
	l := startPopulated(t, "--verify-every", "100ms")
	require.Eventually(t, func() bool {
		res := l.Do("GET", "/metrics", "")
		return strings.Contains(res.Raw, `ledger_verify_violations{namespace="default"} 0`) &&
			strings.Contains(res.Raw, `ledger_verify_runs_total{namespace="default",result="ok"}`) &&
			!strings.Contains(res.Raw, "ledger_verify_last_success_timestamp_seconds{namespace=\"default\"} 0\n")
	}, 60*time.Second, 50*time.Millisecond)
	assert.Contains(t, l.Logs(), "ledger verified")
}

// TestLedgerctl_backupCopy verifies a VACUUM INTO backup (a rollback-journal
// copy) on a read-only file, pinned to the head read before the backup.
func TestLedgerctl_backupCopy(t *testing.T) {
	t.Parallel()
	l := startPopulated(t)
	head, _, code := ledgerctl(t, "head", "--db", l.DB)
	require.Equal(t, 0, code)
	backup := filepath.Join(t.TempDir(), "backup.db")
	db, err := sql.Open("sqlite3", "file:"+l.DB+"?mode=ro")
	require.NoError(t, err)
	_, err = db.Exec(`VACUUM INTO ?`, backup)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	require.NoError(t, os.Chmod(backup, 0o444))
	out, stderr, code := ledgerctl(t, "verify", "--db", backup, "--expect-head", strings.TrimSpace(head))
	assert.Equal(t, 0, code, "%s%s", out, stderr)
}

// TestLedgerctl_tokens creates, uses and revokes tokens on the file of a
// running ledgerd: no restart needed.
func TestLedgerctl_tokens(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	assert.Contains(t, l.Logs(), "auth disabled")
	tok, stderr, code := ledgerctl(t, "token", "create", "--db", l.DB, "--role", "admin", "--name", "ops-alice")
	require.Equal(t, 0, code, stderr)
	tok = strings.TrimSpace(tok)
	assert.True(t, strings.HasPrefix(tok, "elt_"))
	_, _, code = ledgerctl(t, "token", "create", "--db", l.DB, "--role", "root", "--name", "x")
	assert.Equal(t, 2, code)

	require.Eventually(t, func() bool { return l.Do("GET", "/v1/head", "").Status == 401 }, 60*time.Second, 50*time.Millisecond)
	r := l.Do("GET", "/v1/head", "", "Authorization", "Bearer "+tok)
	assert.Equal(t, 200, r.Status)
	out, _, code := ledgerctl(t, "head", "--server", l.URL, "--token", tok)
	assert.Equal(t, 0, code)
	assert.True(t, strings.HasPrefix(out, "0:"))
	_, _, code = ledgerctl(t, "head", "--server", l.URL)
	assert.Equal(t, 2, code, "401 without the token")

	out, _, code = ledgerctl(t, "token", "list", "--db", l.DB)
	require.Equal(t, 0, code)
	assert.Contains(t, out, "ops-alice")
	assert.NotContains(t, out, tok, "tokens are never shown again")
	_, _, code = ledgerctl(t, "token", "revoke", "--db", l.DB, "ops-alice")
	require.Equal(t, 0, code)
	assert.Equal(t, 401, l.Do("GET", "/v1/head", "", "Authorization", "Bearer "+tok).Status)
}

func TestLedgerd_nonLoopbackNeedsAuth(t *testing.T) {
	t.Parallel()
	out, code := runLedgerd(t, "--db", filepath.Join(t.TempDir(), "l.db"), "--listen", "0.0.0.0:0")
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "without auth")
}

// TestLedgerctl_verifyWhileWriting verifies the live file and runs the
// in-daemon verifier while clients write: no false violation may come
// from reading the chain, the keys table and the key order in different
// snapshots, and writes keep succeeding.
func TestLedgerctl_verifyWhileWriting(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"), "--verify-every", "20ms")
	w := startLoad(t, l, 8, "live", `"execution_id":"e","tool":"t","effect":"write","idempotent":true`, func(i int) string {
		if i%2 == 0 {
			return `"outcome":"succeeded"`
		}
		return `"outcome":"failed","error":{"code":"T","retryable":true}`
	})
	require.Eventually(t, func() bool { return w.written.Load() >= 50 }, 60*time.Second, time.Millisecond, "the clients write")
	for range 8 {
		out, stderr, code := ledgerctl(t, "verify", "--db", l.DB, "--json")
		assert.Equal(t, 0, code, "%s%s", out, stderr)
	}
	w.Stop()
	assert.Zero(t, w.failures.Load(), "writes kept succeeding while verifying")
	m := l.Do("GET", "/metrics", "").Raw
	assert.Contains(t, m, `ledger_verify_violations{namespace="default"} 0`)
	assert.NotContains(t, m, `ledger_verify_runs_total{result="violations"}`)
	assert.NotContains(t, l.Logs(), "LEDGER INTEGRITY VIOLATIONS")
}
