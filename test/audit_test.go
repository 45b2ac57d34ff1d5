package test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit"
)

// declined is a failed commit's error.
const declined = `,"error":{"code":"DECLINED"}`

type repeatedFailure struct {
	Tool       string   `json:"tool"`
	InputHash  string   `json:"input_hash"`
	ErrorCode  string   `json:"error_code"`
	Keys       []string `json:"keys"`
	Executions []string `json:"executions"`
	Seqs       []uint64 `json:"seqs"`
}

// TestLedgerctl_repeatedFailures: a refund fails, and the model calls it
// again, unchanged, under two new keys. The file and the server report it
// alike in `ledgerctl audit` (table and JSON, with the filters) and in
// `verify --json`, and ledgerd's periodic verification exports it.
func TestLedgerctl_repeatedFailures(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"), "--verify-every", "100ms")
	tok := l.Reserve(t, refundBody("refund-a-0001", "exec-1", 1234, ""))      // seq 1
	l.Commit(t, "refund-a-0001", testkit.CommitBody(tok, "failed", declined)) // seq 2
	tok = l.Reserve(t, refundBody("refund-b-0002", "exec-2", 1234, ""))       // seq 3: the same call again
	l.Commit(t, "refund-b-0002", testkit.CommitBody(tok, "succeeded", ""))    // seq 4
	tok = l.Reserve(t, refundBody("refund-x-0001", "exec-3", 99, ""))         // seq 5: another input
	l.Commit(t, "refund-x-0001", testkit.CommitBody(tok, "failed", declined)) // seq 6
	l.Reserve(t, refundBody("refund-c-0003", "exec-4", 1234, ""))             // seq 7: and again

	srv := []string{"--server", l.URL}
	db := []string{"--db", l.DB}
	audit := func(src []string, args ...string) []repeatedFailure {
		t.Helper()
		out, stderr, code := ledgerctl(t, append(append([]string{"audit", "--json"}, src...), args...)...)
		require.Equal(t, 0, code, stderr)
		var a struct {
			RepeatedFailures []repeatedFailure `json:"repeated_failures"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &a), out)
		require.NotNil(t, a.RepeatedFailures, "an empty list is [], not null or absent: %s", out)
		return a.RepeatedFailures
	}

	t.Run("audit --json, file and server", func(t *testing.T) {
		for _, src := range [][]string{db, srv} {
			got := audit(src)
			require.Len(t, got, 1, "%v", src)
			r := got[0]
			assert.Equal(t, "payments.refund", r.Tool)
			assert.True(t, strings.HasPrefix(r.InputHash, "hk1:"), "keyed in a committed namespace (SPEC §14): %s", r.InputHash)
			assert.Equal(t, "DECLINED", r.ErrorCode)
			assert.Equal(t, []string{"refund-a-0001", "refund-b-0002", "refund-c-0003"}, r.Keys)
			assert.Equal(t, []string{"exec-1", "exec-2", "exec-4"}, r.Executions)
			assert.Equal(t, []uint64{2, 3, 7}, r.Seqs)
		}
	})
	t.Run("audit table, beside duplicate effects", func(t *testing.T) {
		for _, src := range [][]string{db, srv} {
			out, stderr, code := ledgerctl(t, append([]string{"audit"}, src...)...)
			require.Equal(t, 0, code, stderr)
			dup := strings.Index(out, "Duplicate effects")
			rep := strings.Index(out, "Repeated failures: a failed call run again unchanged under new keys (1)")
			intr := strings.Index(out, "Interrupted")
			require.True(t, dup >= 0 && rep > dup && intr > rep, "sections out of order:\n%s", out)
			section := out[rep:intr]
			assert.Contains(t, section, "DECLINED")
			assert.Contains(t, section, "refund-a-0001 → refund-b-0002, refund-c-0003")
			assert.Contains(t, section, "exec-1, exec-2, exec-4")
		}
	})
	t.Run("filters", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want int
		}{
			{[]string{"--tool", "payments.refund"}, 1},
			{[]string{"--tool", "email.send"}, 0},
			{[]string{"--since", "7"}, 1},  // the latest repeat is seq 7
			{[]string{"--since", "8"}, 0},  // nothing after it
			{[]string{"--since", "0"}, 1},  // a seq: everything
			{[]string{"--since", "1h"}, 1}, // a duration ago
			{[]string{"--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}, 0},
			{[]string{"--since", "2000-01-01T00:00:00Z", "--tool", "payments.refund"}, 1},
		} {
			for _, src := range [][]string{db, srv} {
				assert.Len(t, audit(src, tc.args...), tc.want, "%v %v", tc.args, src[0])
			}
		}
		for _, bad := range []string{"yesterday", "-5m", "99999999999999999999999"} {
			_, stderr, code := ledgerctl(t, "audit", "--db", l.DB, "--since", bad)
			assert.Equal(t, 2, code, bad)
			assert.Contains(t, stderr, "--since", bad)
		}
	})
	t.Run("verify --json audit and summary", func(t *testing.T) {
		for _, src := range [][]string{db, srv} {
			out, stderr, code := ledgerctl(t, append([]string{"verify", "--json"}, src...)...)
			require.Equal(t, 0, code, stderr)
			var rep struct {
				Audit struct {
					RepeatedFailures []repeatedFailure `json:"repeated_failures"`
				} `json:"audit"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
			require.Len(t, rep.Audit.RepeatedFailures, 1)
			assert.Equal(t, []string{"refund-a-0001", "refund-b-0002", "refund-c-0003"}, rep.Audit.RepeatedFailures[0].Keys)
			out, _, _ = ledgerctl(t, append([]string{"verify"}, src...)...)
			assert.Contains(t, out, ", 1 repeated failure, ", "counted in words, singular for one")
		}
	})
	t.Run("help documents the filters", func(t *testing.T) {
		_, stderr, code := ledgerctl(t, "audit", "--help")
		assert.Equal(t, 0, code)
		assert.Contains(t, stderr, "repeated failures")
		assert.Contains(t, stderr, "receipt seq")
		assert.Contains(t, stderr, "RFC 3339")
	})
	t.Run("periodic verification exports it", func(t *testing.T) {
		require.Eventually(t, func() bool {
			m := l.Do("GET", "/metrics", "").Raw
			return strings.Contains(m, "ledger_audit_repeated_failures{namespace=\"default\"} 1\n") &&
				strings.Contains(m, "ledger_audit_repeated_failure_keys{namespace=\"default\"} 2\n")
		}, 60*time.Second, 50*time.Millisecond)
		l.Reserve(t, refundBody("refund-d-0004", "exec-5", 1234, "")) // the loop goes on
		require.Eventually(t, func() bool {
			m := l.Do("GET", "/metrics", "").Raw
			return strings.Contains(m, "ledger_audit_repeated_failures{namespace=\"default\"} 1\n") &&
				strings.Contains(m, "ledger_audit_repeated_failure_keys{namespace=\"default\"} 3\n")
		}, 60*time.Second, 50*time.Millisecond, "an incremental run adds the new repeat")
		assert.Contains(t, l.Logs(), "failed calls run again unchanged under new keys")
	})
}

// auditRepeats runs ledgerctl audit --json with args and returns its
// repeated failures.
func auditRepeats(t *testing.T, args ...string) []repeatedFailure {
	t.Helper()
	out, stderr, code := ledgerctl(t, append([]string{"audit", "--json"}, args...)...)
	require.Equal(t, 0, code, stderr)
	var a struct {
		RepeatedFailures []repeatedFailure `json:"repeated_failures"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &a), out)
	return a.RepeatedFailures
}

// TestLedgerctl_repeatedFailureListsAKeyOnce: a call that applied nothing
// twice (not_applied, SPEC §4.1), then succeeded once fixed, all under one
// key by three executions, is one repeated failure (§4.1: a rerun of the
// same key by another execution is a repeat, whatever its outcome) whose
// keys name that key once, with every run in executions and seqs — from
// the file (the database's grouping) and from the server (the chain
// pass), as JSON and as the table; verify --json's audit agrees.
func TestLedgerctl_repeatedFailureListsAKeyOnce(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		l := StartLedgerd(t, db)
		const key = "observe-alice-0001"
		body := func(exec string) string {
			return `{"idempotency_key":"` + key + `","execution_id":"` + exec + `","tool":"memory.observe","effect":"write","input":{"id":"alice"}}`
		}
		for i, outcome := range []string{"not_applied", "not_applied", "succeeded"} {
			tok := l.Reserve(t, body(fmt.Sprintf("exec-%d", i+1)))
			c := `{"reservation":"` + tok + `","outcome":"succeeded"}`
			if outcome == "not_applied" {
				c = `{"reservation":"` + tok + `","outcome":"not_applied","error":{"code":"NOT_FOUND"}}`
			}
			require.Equal(t, 201, l.Do("POST", "/v1/effects/"+key+"/commit", c).Status)
		}
		for _, src := range [][]string{{"--db", db}, {"--server", l.URL}} {
			got := auditRepeats(t, src...)
			require.Len(t, got, 1, "%v", src)
			assert.Equal(t, []string{key}, got[0].Keys, "%v: the key once", src)
			assert.Equal(t, []string{"exec-1", "exec-2", "exec-3"}, got[0].Executions, "%v: every run", src)
			assert.Equal(t, []uint64{2, 3, 5}, got[0].Seqs, "%v: the failure, then each rerun's reserve", src)
			assert.Equal(t, "NOT_FOUND", got[0].ErrorCode)

			out, _, code := ledgerctl(t, append([]string{"audit"}, src...)...)
			require.Equal(t, 0, code)
			sec := out[strings.Index(out, "Repeated failures"):]
			sec = sec[:strings.Index(sec, "\n\n")]
			assert.Equal(t, 1, strings.Count(sec, key), "%v: %s", src, sec)
			assert.Contains(t, sec, "(the same key again)")
			assert.Contains(t, sec, "exec-1, exec-2, exec-3")

			out, _, code = ledgerctl(t, append([]string{"verify", "--json"}, src...)...)
			require.Equal(t, 0, code, out)
			var v struct {
				Audit struct {
					RepeatedFailures []repeatedFailure `json:"repeated_failures"`
				} `json:"audit"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &v))
			assert.Equal(t, got, v.Audit.RepeatedFailures, "%v", src)
		}
	})
}

// TestLedgerd_auditMetricsNeedVerification: without --verify-every no
// audit gauge is exported, not even as 0.
func TestLedgerd_auditMetricsNeedVerification(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	tok := l.Reserve(t, refundBody("refund-a-0001", "exec-1", 1, ""))
	l.Commit(t, "refund-a-0001", testkit.CommitBody(tok, "failed", declined))
	l.Reserve(t, refundBody("refund-b-0002", "exec-2", 1, ""))
	m := l.Do("GET", "/metrics", "")
	require.Equal(t, 200, m.Status)
	assert.Contains(t, m.Raw, "ledger_receipts_appended_total")
	assert.NotContains(t, m.Raw, "ledger_audit_")
}
