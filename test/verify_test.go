package test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/storage"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// verifyReport is the --json output of ledgerctl verify.
type verifyReport struct {
	OK       bool   `json:"ok"`
	Receipts uint64 `json:"receipts"`
	Checked  uint64 `json:"checked"`
	Head     struct {
		Seq  uint64 `json:"seq"`
		Hash string `json:"hash"`
	} `json:"head"`
	Violations []struct {
		Seq    uint64 `json:"seq"`
		Rule   string `json:"rule"`
		Detail string `json:"detail"`
	} `json:"violations"`
}

// verifyJSON runs ledgerctl verify --json and decodes the report.
func verifyJSON(t *testing.T, args ...string) (verifyReport, int) {
	t.Helper()
	out, stderr, code := ledgerctl(t, append([]string{"verify", "--json"}, args...)...)
	var rep verifyReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "stdout %q stderr %q", out, stderr)
	return rep, code
}

func (r verifyReport) rules() map[string]int {
	m := map[string]int{}
	for _, v := range r.Violations {
		m[v.Rule]++
	}
	return m
}

// copyLedger copies a stopped ledger's file and edits the copy
// (editLedger); it returns the copy's path.
func copyLedger(t *testing.T, src string, stmts ...string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "edited.db")
	testkit.CopyFile(t, src, dst)
	editLedger(t, dst, stmts...)
	return dst
}

// editLedger edits the stopped ledger's file at path with SQL (the
// append-only triggers dropped), as someone with sqlite3 would.
func editLedger(t *testing.T, path string, stmts ...string) {
	t.Helper()
	testkit.EditLedger(t, path, func(db *sql.DB) {
		for _, q := range stmts {
			_, err := db.Exec(strings.Replace(q, "DROP TRIGGER ns_", "DROP TRIGGER IF EXISTS ns_", 1))
			require.NoError(t, err, q)
		}
	})
}

// TestLedgerd_invalidValuesServed edits a copy of a real ledger so that
// it holds values no ledger writes (a result that is not JSON, text in an
// integer column), serves it with ledgerd and checks that every answer is
// valid JSON carrying the stored bytes, that a replay of the key does not
// fail, and that ledgerctl verify exits 1 naming invalid_field, from the
// file and from the server.
func TestLedgerd_invalidValuesServed(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"), "--default-payloads", "inline") // the result is edited in the chain
	tok := l.Reserve(t, `{"idempotency_key":"refund-0001","execution_id":"exec-1","tool":"payments.refund","effect":"write","input":{"order":7}}`)
	l.Commit(t, "refund-0001", `{"reservation":"`+tok+`","outcome":"succeeded","external_ref":"re_1","result":{"amount":1200}}`)
	r := l.Do("POST", "/v1/effects/reserve", reserve("mail-0002-abc", "exec-2", 1, false))
	require.Equal(t, 201, r.Status, r.Raw)
	r = l.Do("POST", "/v1/effects/reserve", reserve("mail-0003-abc", "exec-3", 1, false))
	require.Equal(t, 201, r.Status, r.Raw)
	require.NoError(t, l.Stop())

	const notJSON = `{"amount":1200, oops`
	edited := copyLedger(t, l.DB,
		`UPDATE receipts SET result = '`+notJSON+`' WHERE seq = 2`,
		`UPDATE receipts SET attempt = 'two' WHERE seq = 3`)

	for _, src := range [][]string{{"--db", edited}} {
		rep, code := verifyJSON(t, src...)
		assert.Equal(t, 1, code, "violations exit 1, not 2")
		assert.False(t, rep.OK)
		assert.Equal(t, uint64(4), rep.Receipts)
		assert.Equal(t, 2, rep.rules()["invalid_field"], "%+v", rep.Violations)
	}

	l = StartLedgerd(t, edited)
	rep, code := verifyJSON(t, "--server", l.URL)
	assert.Equal(t, 1, code, "violations exit 1, not 2")
	assert.Equal(t, uint64(4), rep.Receipts)
	assert.Equal(t, 2, rep.rules()["invalid_field"], "%+v", rep.Violations)
	assert.Equal(t, 1, rep.rules()["hash_mismatch"], "the result was edited after hashing: %+v", rep.Violations)
	fileRep, _ := verifyJSON(t, "--db", edited)
	assert.Equal(t, fileRep.Violations, rep.Violations, "the server's JSON carries the stored bytes: same findings")

	valid := func(r Resp) {
		t.Helper()
		assert.True(t, json.Valid([]byte(r.Raw)), "invalid JSON: %s", r.Raw)
	}
	r = l.Do("GET", "/v1/receipts/2", "")
	require.Equal(t, 200, r.Status, r.Raw)
	valid(r)
	assert.Equal(t, notJSON, r.Body["result"], "the stored text, as a JSON string")
	assert.Equal(t, "text", r.Body["result_encoding"])

	r = l.Do("GET", "/v1/receipts/3", "")
	require.Equal(t, 200, r.Status, r.Raw)
	valid(r)
	assert.Nil(t, r.Body["attempt"])
	assert.Equal(t, map[string]any{"attempt": "'two'"}, r.Body["malformed"])

	for _, path := range []string{"/v1/receipts", "/v1/receipts?key=refund-0001"} {
		r = l.Do("GET", path, "")
		require.Equal(t, 200, r.Status, "%s: %s", path, r.Raw)
		valid(r)
		assert.Contains(t, r.Raw, `"result_encoding":"text"`, path)
	}

	// The edited result no longer hashes to what the chain recorded: the
	// key's view and a replay refuse to serve it (issue 44), and the replay
	// appends nothing.
	r = l.Do("GET", "/v1/effects/refund-0001", "")
	require.Equal(t, 500, r.Status, r.Raw)
	valid(r)
	assert.Equal(t, "integrity_error", r.Code())
	assert.NotContains(t, r.Raw, "oops")
	r = l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"refund-0001","execution_id":"exec-9","tool":"payments.refund","effect":"write","input":{"order":7}}`)
	require.Equal(t, 500, r.Status, "a replay of the edited result: %s", r.Raw)
	valid(r)
	assert.Equal(t, "integrity_error", r.Code())
	assert.NotContains(t, r.Raw, "oops")
	r = l.Do("GET", "/v1/receipts", "")
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Len(t, r.Body["receipts"], 4, "no replay receipt appended")

	out, _, code := ledgerctl(t, "export", "--server", l.URL)
	require.Equal(t, 0, code)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		assert.True(t, json.Valid([]byte(line)), "export line %s", line)
	}
	for _, line := range strings.Split(l.Logs(), "\n") {
		if strings.Contains(line, `"level":"ERROR"`) {
			assert.Regexp(t, `does not match the chain|integrity_error`, line, "the only errors logged are the refusal of the edited value")
			assert.NotContains(t, line, "oops")
		}
	}
}

// TestLedgerctl_incrementalAfterTruncation pins a head with --state and
// then checks, through the binary, incremental runs on copies that lost
// their tail or had the pinned receipt edited in place.
func TestLedgerctl_incrementalAfterTruncation(t *testing.T) {
	t.Parallel()
	l := startPopulated(t)
	require.NoError(t, l.Stop())
	state := filepath.Join(t.TempDir(), "state.json")
	rep, code := verifyJSON(t, "--db", l.DB, "--state", state)
	require.Equal(t, 0, code)
	require.Equal(t, uint64(6), rep.Head.Seq)
	pinned, err := os.ReadFile(state)
	require.NoError(t, err)

	t.Run("truncated", func(t *testing.T) {
		edited := copyLedger(t, l.DB, `DELETE FROM receipts WHERE seq >= 5`)
		want, _ := verifyJSON(t, "--db", edited) // a full run without the pin
		rep, code := verifyJSON(t, "--db", edited, "--state", state, "--incremental")
		assert.Equal(t, 1, code)
		assert.Equal(t, uint64(4), rep.Receipts, "the real count")
		assert.Equal(t, uint64(4), rep.Head.Seq, "the real head")
		assert.Equal(t, want.Head.Hash, rep.Head.Hash)
		assert.Equal(t, 1, rep.rules()["head_mismatch"], "once: %+v", rep.Violations)
		after, err := os.ReadFile(state)
		require.NoError(t, err)
		assert.Equal(t, pinned, after, "a failed run leaves the state file alone")
	})
	t.Run("pinned receipt edited in place", func(t *testing.T) {
		edited := copyLedger(t, l.DB, `UPDATE receipts SET actor = 'someone' WHERE seq = 6`)
		rep, code := verifyJSON(t, "--db", edited, "--state", state, "--incremental")
		assert.Equal(t, 1, code)
		assert.Equal(t, map[string]int{"hash_mismatch": 1}, rep.rules(), "%+v", rep.Violations)
		assert.Equal(t, uint64(6), rep.Violations[0].Seq)
		assert.Equal(t, uint64(6), rep.Checked, "the whole chain was checked")
	})
	t.Run("intact", func(t *testing.T) {
		rep, code := verifyJSON(t, "--db", l.DB, "--state", state, "--incremental")
		assert.Equal(t, 0, code)
		assert.Equal(t, uint64(6), rep.Receipts)
		assert.Equal(t, uint64(0), rep.Checked)
	})
}

// liveRun is what one `ledgerctl verify --json` run reported of interest.
type liveRun struct {
	OK   bool `json:"ok"`
	Head struct {
		Seq uint64 `json:"seq"`
	} `json:"head"`
	Audit struct {
		Failed []struct {
			Seq uint64 `json:"seq"`
		} `json:"failed"`
	} `json:"audit"`
}

// TestLedgerctl_incrementalVerifyWhileWriting: `verify --state
// --incremental` beside a running ledgerd checks each receipt once, up to
// the head it pins. Every key is reserved and then fails; a run from pin
// P to head H lists as failed exactly the keys whose commit is in (P, H]:
// a key left out is never checked (the next run starts after H), one past
// H is listed twice.
func TestLedgerctl_incrementalVerifyWhileWriting(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	state := filepath.Join(t.TempDir(), "verify-state.json")
	w := startLoad(t, l, 4, "live", `"execution_id":"e","tool":"t","effect":"write"`,
		func(int) string { return `"outcome":"failed","error":{"code":"T"}` })
	require.Eventually(t, func() bool { return w.written.Load() >= 20 }, 60*time.Second, time.Millisecond, "the clients write")
	var runs []liveRun
	for range 8 {
		out, stderr, code := ledgerctl(t, "verify", "--db", l.DB, "--state", state, "--incremental", "--json")
		require.Equal(t, 0, code, "%s%s", out, stderr)
		var r liveRun
		require.NoError(t, json.Unmarshal([]byte(out), &r), out)
		runs = append(runs, r)
	}
	w.Stop()
	assert.Zero(t, w.failures.Load(), "writes kept succeeding while verifying")

	failed := failedCommits(t, l.DB)
	var pin uint64
	for i, r := range runs {
		var want, got []uint64
		for _, seq := range failed {
			if seq > pin && seq <= r.Head.Seq {
				want = append(want, seq)
			}
		}
		for _, f := range r.Audit.Failed {
			got = append(got, f.Seq)
		}
		assert.Equal(t, want, got, "run %d from %d to %d", i, pin, r.Head.Seq)
		pin = r.Head.Seq
	}
}

// failedCommits returns the seqs of the failed commits of the ledger at
// db, in order, as ledgerctl export prints them.
func failedCommits(t *testing.T, db string) []uint64 {
	t.Helper()
	out, stderr, code := ledgerctl(t, "export", "--db", db)
	require.Equal(t, 0, code, stderr)
	var seqs []uint64
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r struct {
			Seq     uint64 `json:"seq"`
			Kind    string `json:"kind"`
			Outcome string `json:"outcome"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
		if r.Kind == "commit" && r.Outcome == "failed" {
			seqs = append(seqs, r.Seq)
		}
	}
	require.NoError(t, sc.Err())
	return seqs
}

// TestLedgerd_verifyMetricsOnlyWhenVerifying scrapes the real ledgerd's
// /metrics: without --verify-every there is no ledger_verify_* metric
// (no false "last success 0"); with it they appear after the first run.
func TestLedgerd_verifyMetricsOnlyWhenVerifying(t *testing.T) {
	t.Parallel()
	l := startPopulated(t)
	r := l.Do("GET", "/metrics", "")
	require.Equal(t, 200, r.Status)
	require.Contains(t, r.Raw, "ledger_", "the ledger's own metrics are there")
	assert.NotContains(t, r.Raw, "ledger_verify_")
	assert.NotContains(t, r.Raw, "ledger_audit_")
	require.NoError(t, l.Stop())

	l = StartLedgerd(t, l.DB, "--verify-every", "1h")
	require.Eventually(t, func() bool {
		return strings.Contains(l.Logs(), "ledger verified")
	}, 60*time.Second, 20*time.Millisecond)
	r = l.Do("GET", "/metrics", "")
	for _, name := range []string{`ledger_verify_last_success_timestamp_seconds{namespace="default"} `, `ledger_verify_violations{namespace="default"} 0`,
		`ledger_verify_duration_seconds{namespace="default"} `, `ledger_verify_runs_total{namespace="default",result="ok"} 1`} {
		assert.Contains(t, r.Raw, name)
	}
	assert.NotContains(t, r.Raw, "ledger_verify_last_success_timestamp_seconds{namespace=\"default\"} 0\n")
}

// TestLedgerd_verifyEveryNamespace: with --verify-every every namespace is
// verified, including one created while ledgerd runs; each has its own
// metrics, labelled by namespace.
func TestLedgerd_verifyEveryNamespace(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"), "--verify-every", "200ms")
	r := l.Do("POST", "/v1/namespaces", `{"name":"ops"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	r = l.Do("POST", "/v1/ns/ops/effects/reserve", `{"idempotency_key":"ops-key-0001","execution_id":"e","tool":"t","effect":"write"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	require.Eventually(t, func() bool {
		m := l.Do("GET", "/metrics", "").Raw
		return strings.Contains(m, `ledger_verify_runs_total{namespace="ops",result="ok"}`) &&
			strings.Contains(m, `ledger_verify_runs_total{namespace="default",result="ok"}`) &&
			strings.Contains(m, `ledger_verify_violations{namespace="ops"} 0`)
	}, 60*time.Second, 50*time.Millisecond)
}

// fourNamespaces fills namespaces a, b, c and d of the ledger db with
// three reserved keys each, through a ledgerd that is stopped again.
func fourNamespaces(t *testing.T, db string) {
	t.Helper()
	l := StartLedgerd(t, db)
	for _, ns := range []string{"a", "b", "c", "d"} {
		require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"`+ns+`"}`).Status)
		for i := 1; i <= 3; i++ {
			r := l.Do("POST", "/v1/ns/"+ns+"/effects/reserve", nsReserve(fmt.Sprintf("key-%s-%04d", ns, i), "exec-"+ns, "tool."+ns))
			require.Equal(t, 201, r.Status, r.Raw)
		}
	}
	require.NoError(t, l.Stop())
}

// TestLedgerctl_verifyAllNamespacesReportsEach: of four namespaces, a
// cannot be read (a value the verifier cannot scan on SQLite; a read that
// fails on PostgreSQL), b is intact, c is tampered (a forged
// external_ref) and d cannot be read either. verify --all-namespaces
// reports every one of them, as text and as JSON, and exits with the
// worst status (2), naming the namespaces it could not verify on stderr.
func TestLedgerctl_verifyAllNamespacesReportsEach(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		fourNamespaces(t, db)
		src := db
		if storage.IsPostgres(db) {
			src = unreadableNamespacesPG(t, db, "a", "d")
		} else {
			// (a seq edited into text is a violation, not an unreadable
			// namespace: TestLedgerctl_textSeqReported)
			editLedger(t, db, `DROP TRIGGER ns_receipts_no_update`, `DROP TRIGGER ns_settings_fixed`,
				`UPDATE ns_settings SET key_ttl_ms = 'x' WHERE ns = (SELECT id FROM namespaces WHERE name = 'a')`,
				`UPDATE ns_receipts SET external_ref = 'forged' WHERE ns = (SELECT id FROM namespaces WHERE name = 'c') AND seq = 1`,
				`UPDATE ns_head SET seq = 'x' WHERE ns = (SELECT id FROM namespaces WHERE name = 'd')`)
		}

		out, stderr, code := ledgerctl(t, "verify", "--db", src, "--all-namespaces")
		assert.Equal(t, 2, code, out+stderr)
		for _, want := range []string{
			"== namespace a ==\nERROR: could not be verified: ",
			"== namespace b ==\nOK: 3 receipts",
			"== namespace c ==\nFAILED: ",
			"== namespace d ==\nERROR: could not be verified: ",
			"== namespace default ==\nOK: 0 receipts",
			"5 namespaces verified, 1 with violations, 2 could not be verified\n",
		} {
			assert.Contains(t, out, want)
		}
		assert.Contains(t, out, "hash_mismatch")
		assert.Contains(t, stderr, "namespace a: ")
		assert.Contains(t, stderr, "namespace d: ")
		assert.NotContains(t, stderr, "namespace b")

		out, _, code = ledgerctl(t, "verify", "--db", src, "--all-namespaces", "--json")
		assert.Equal(t, 2, code, out)
		var all struct {
			OK         bool `json:"ok"`
			Namespaces map[string]struct {
				OK              bool   `json:"ok"`
				Error           string `json:"error"`
				ViolationsTotal int    `json:"violations_total"`
			} `json:"namespaces"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &all), out)
		assert.False(t, all.OK)
		require.Len(t, all.Namespaces, 5, out)
		for _, ns := range []string{"a", "d"} {
			assert.False(t, all.Namespaces[ns].OK, ns)
			assert.NotEmpty(t, all.Namespaces[ns].Error, ns)
		}
		assert.True(t, all.Namespaces["b"].OK)
		assert.Empty(t, all.Namespaces["b"].Error)
		assert.False(t, all.Namespaces["c"].OK)
		assert.Positive(t, all.Namespaces["c"].ViolationsTotal)
		assert.True(t, all.Namespaces["default"].OK)

		// The tampered namespace alone: exit 1.
		out, _, code = ledgerctl(t, "verify", "--db", src, "--namespace", "c")
		assert.Equal(t, 1, code, out)
	})
}

// unreadableNamespacesPG tampers namespace c of the PostgreSQL ledger db
// (a forged external_ref) and returns the URL of a role that cannot read
// the receipts of namespaces bad: a row-level policy divides by zero on
// their rows (sequential scans off, so that another namespace's scan
// never meets them).
func unreadableNamespacesPG(t *testing.T, db string, bad ...string) string {
	t.Helper()
	ctx := context.Background()
	u, err := url.Parse(db)
	require.NoError(t, err)
	role := "auditor_" + strings.TrimPrefix(u.Path, "/")
	conn, err := pgx.Connect(ctx, db)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, db)
		if err != nil {
			return
		}
		defer func() { _ = c.Close(ctx) }()
		_, _ = c.Exec(ctx, "DROP OWNED BY "+role)
		_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+role)
	})
	for _, q := range []string{
		`ALTER TABLE receipts DISABLE TRIGGER USER`,
		`UPDATE receipts SET external_ref = 'forged' WHERE namespace = 'c' AND seq = 1`,
		`ALTER TABLE receipts ENABLE TRIGGER USER`,
		"CREATE ROLE " + role + " LOGIN",
		"GRANT SELECT ON ALL TABLES IN SCHEMA public TO " + role,
		"ALTER ROLE " + role + " IN DATABASE " + strings.TrimPrefix(u.Path, "/") + " SET enable_seqscan = off",
		`ALTER TABLE receipts ENABLE ROW LEVEL SECURITY`,
		`CREATE POLICY unreadable ON receipts FOR SELECT USING (CASE WHEN namespace IN ('` + strings.Join(bad, "', '") +
			`') THEN 1 / (seq - seq) ELSE 1 END >= 0)`,
	} {
		_, err := conn.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	u.User = url.User(role)
	return u.String()
}

// TestLedgerctl_unknownKindUnsupported: a receipt of a kind this verifier
// does not know, correctly hashed and linked (a newer ledger wrote it, or
// a forger rehashed it), makes ledgerctl verify exit 2 naming unsupported,
// never 1 (SPEC §14), from the file and from a server.
func TestLedgerctl_unknownKindUnsupported(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"), "--default-payloads", "inline")
	for _, k := range []string{"mail-0001-abc", "mail-0002-abc"} {
		r := l.Do("POST", "/v1/effects/reserve", reserve(k, "exec-1", 1, false))
		require.Equal(t, 201, r.Status, r.Raw)
	}
	require.NoError(t, l.Stop())
	out, _, code := ledgerctl(t, "export", "--db", l.DB)
	require.Equal(t, 0, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var last chain.Receipt
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &last))
	last.Kind = "refund"
	h := last.ComputeHash(last.PrevHash)
	edited := copyLedger(t, l.DB, "PRAGMA ignore_check_constraints = ON",
		"DROP TRIGGER ns_receipts_link", "DROP TRIGGER ns_receipts_advance_head",
		fmt.Sprintf(`UPDATE receipts SET kind = 'refund', hash = x'%x' WHERE seq = %d`, h[:], last.Seq),
		fmt.Sprintf(`UPDATE ns_head SET hash = x'%x' WHERE ns = 0`, h[:]))

	rep, code := verifyJSON(t, "--db", edited)
	assert.Equal(t, 2, code, "unsupported exits 2, never 1")
	assert.Equal(t, map[string]int{"unsupported": 1}, rep.rules(), "%+v", rep.Violations)
	out, stderr, code := ledgerctl(t, "verify", "--db", edited)
	assert.Equal(t, 2, code)
	assert.Contains(t, out, "unsupported")
	assert.Contains(t, stderr, "unsupported: 1 receipt of a kind this verifier does not know")
	out, _, code = ledgerctl(t, "verify", "--db", edited, "--all-namespaces")
	assert.Equal(t, 2, code, out)

	_, stderr, code = ledgerctl(t, "rebuild-index", "--db", edited) // the tree, as the forger would
	require.Equal(t, 0, code, stderr)
	l = StartLedgerd(t, edited)
	rep, code = verifyJSON(t, "--server", l.URL)
	assert.Equal(t, 2, code)
	assert.Equal(t, map[string]int{"unsupported": 1}, rep.rules(), "%+v", rep.Violations)
}
