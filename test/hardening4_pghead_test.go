package test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// tamperHeads runs stmts on the ledger db as someone with SQL access who
// gets past the ledger's triggers: on PostgreSQL a superuser with
// session_replication_role = replica, on SQLite someone with sqlite3 who
// drops them. Before that, it checks that an ordinary DELETE of the head
// row of namespace ns is refused.
func tamperHeads(t *testing.T, db, ns string, stmts ...string) {
	t.Helper()
	if strings.HasPrefix(db, "postgres") {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, db)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `DELETE FROM head WHERE namespace = $1`, ns)
		assert.ErrorContains(t, err, "never removed", "an ordinary DELETE of a head row is refused")
		_, err = conn.Exec(ctx, `TRUNCATE head, checkpoints, state_keys`)
		assert.Error(t, err, "TRUNCATE of the heads is refused")
		_, err = conn.Exec(ctx, `SET session_replication_role = replica`)
		require.NoError(t, err)
		for _, q := range stmts {
			_, err := conn.Exec(ctx, q)
			require.NoError(t, err, q)
		}
		return
	}
	del := `DELETE FROM ns_head WHERE ns = 0`
	if ns != "default" {
		del = `DELETE FROM ns_head WHERE ns = (SELECT id FROM namespaces WHERE name = '` + ns + `')`
	}
	conn, err := sql.Open("sqlite3", db)
	require.NoError(t, err)
	_, err = conn.Exec(del)
	assert.ErrorContains(t, err, "never removed", "an ordinary DELETE of a head row is refused")
	var trigger string // one trigger keeps every namespace's head row: put back once the edit is done
	require.NoError(t, conn.QueryRow(`SELECT sql FROM sqlite_schema WHERE name = 'ns_head_kept'`).Scan(&trigger))
	require.NoError(t, conn.Close())
	editLedger(t, db, append(append([]string{`DROP TRIGGER ns_head_kept`}, stmts...), trigger)...)
}

// TestLedgerd_headRowDeleted: someone with SQL access deletes the head
// row of a namespace that has receipts (first a non-default one, then
// default). The verifier reports it (derived_state, naming the missing
// head), the running ledgerd refuses to write to that namespace (503
// storage_corrupt, nothing appended: never a chain started again from
// seq 1) while the other namespaces go on, /readyz reports it until a
// restart, and a restart refuses, naming the namespace. Both drivers alike; an ordinary DELETE of a head
// row is refused by the schema.
func TestLedgerd_headRowDeleted(t *testing.T) {
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		l := StartLedgerd(t, db)
		r := l.Do("POST", "/v1/namespaces", `{"name":"pay"}`)
		require.Equal(t, 201, r.Status, r.Raw)
		for _, k := range []string{"charge-head-1", "charge-head-2"} {
			succeedIn(t, l, "default", k)
			succeedIn(t, l, "pay", k)
		}

		delPay := `DELETE FROM head WHERE namespace = 'pay'`
		delDefault := `DELETE FROM head WHERE namespace = 'default'`
		if !strings.HasPrefix(db, "postgres") {
			delPay = `DELETE FROM ns_head WHERE ns = (SELECT id FROM namespaces WHERE name = 'pay')`
			delDefault = `DELETE FROM ns_head WHERE ns = 0`
		}
		tamperHeads(t, db, "pay", delPay)

		rep, code := verifyJSON(t, "--db", db, "-n", "pay")
		assert.Equal(t, 1, code, "verify fails: %+v", rep)
		assert.False(t, rep.OK)
		assert.Equal(t, uint64(4), rep.Receipts)
		require.Equal(t, 1, rep.rules()["derived_state"], "%+v", rep.Violations)
		assert.Regexp(t, "head (row )?is missing", rep.Violations[0].Detail)
		rep, code = verifyJSON(t, "--db", db)
		assert.Equal(t, 0, code, "default is intact: %+v", rep.Violations)

		// the running ledgerd appends nothing to pay, above all no seq 1
		r = l.Do("POST", "/v1/ns/pay/effects/reserve", reserve("charge-head-3", "exec-3", 1, false))
		assert.Equal(t, 503, r.Status, r.Raw)
		assert.Equal(t, "storage_corrupt", r.Code())
		r = l.Do("POST", "/v1/ns/pay/effects/reserve", reserve("charge-head-1", "exec-again", 1, false))
		assert.Equal(t, 503, r.Status, "a committed key is not run again: %s", r.Raw)
		assert.Contains(t, l.Logs(), "head row is missing")
		succeedIn(t, l, "default", "charge-head-4") // the other namespaces go on
		for range 2 {
			r = l.Do("GET", "/readyz", "")
			assert.Equal(t, 503, r.Status, "readyz reports the damaged namespace until a restart: %s", r.Raw)
			assert.Contains(t, r.Raw, "storage_corrupt")
		}
		rep, _ = verifyJSON(t, "--db", db, "-n", "pay")
		assert.Equal(t, uint64(4), rep.Receipts, "nothing was appended to pay")
		require.NoError(t, l.Stop())

		out, code := runLedgerdBounded(t, "--db", db, "--listen", "127.0.0.1:0")
		assert.Equal(t, 1, code, out)
		assert.Contains(t, out, "namespace pay")
		assert.Regexp(t, "head (row )?is missing", out)

		tamperHeads(t, db, "default", delDefault)
		rep, code = verifyJSON(t, "--db", db)
		assert.Equal(t, 1, code)
		require.Equal(t, 1, rep.rules()["derived_state"], "%+v", rep.Violations)
		assert.Regexp(t, "head (row )?is missing", rep.Violations[0].Detail)
		out, code = runLedgerdBounded(t, "--db", db, "--listen", "127.0.0.1:0")
		assert.Equal(t, 1, code, out)
		assert.Regexp(t, "head (row )?is missing", out)
	})
}

// TestLedgerd_postgresTruncationCaught: a superuser removes the last
// receipts of a namespace, past the append-only triggers, and leaves its
// head row. Without a pinned head (--state, --expect-head) the verifier
// still reports it: the head row is not the chain's last receipt
// (derived_state, as the SQLite file's recorded head); ledgerd refuses to
// start on it.
func TestLedgerd_postgresTruncationCaught(t *testing.T) {
	t.Parallel()
	db := pgtest.URL(t)
	l := StartLedgerd(t, db)
	succeedIn(t, l, "default", "charge-trunc-1")
	succeedIn(t, l, "default", "charge-trunc-2")
	require.NoError(t, l.Stop())
	tamperHeads(t, db, "default", `DELETE FROM receipts WHERE namespace = 'default' AND seq > 2`)

	rep, code := verifyJSON(t, "--db", db)
	assert.Equal(t, 1, code)
	assert.Equal(t, uint64(2), rep.Receipts)
	require.Equal(t, 1, rep.rules()["derived_state"], "%+v", rep.Violations)
	assert.Contains(t, rep.Violations[0].Detail, "head row is 4")
	assert.Contains(t, rep.Violations[0].Detail, "receipts end at 2")
	out, code := runLedgerdBounded(t, "--db", db, "--listen", "127.0.0.1:0")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "namespace default")
	assert.Contains(t, out, "receipts end at 2")
}

// TestLedgerctl_textSeqReported: a receipt row of a namespace whose seq
// was edited into text (SQLite's shared tables take any value in that
// column) is a violation the verifier names — invalid_field, quoting the
// stored value — not an I/O error that stops it ("read malformed row: sql:
// no rows in result set", exit 2).
func TestLedgerctl_textSeqReported(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	l := StartLedgerd(t, db)
	r := l.Do("POST", "/v1/namespaces", `{"name":"pay"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	succeedIn(t, l, "pay", "charge-text-1")
	succeedIn(t, l, "pay", "charge-text-2")
	require.NoError(t, l.Stop())
	editLedger(t, db, `DROP TRIGGER IF EXISTS ns_receipts_no_update`,
		`UPDATE ns_receipts SET seq = 'two' WHERE seq = 2 AND ns = (SELECT id FROM namespaces WHERE name = 'pay')`)

	for _, args := range [][]string{{"--db", db, "-n", "pay"}, {"--db", db, "-n", "pay", "--state", filepath.Join(t.TempDir(), "state.json")}} {
		rep, code := verifyJSON(t, args...)
		assert.Equal(t, 1, code, "%v: %+v", args, rep)
		assert.GreaterOrEqual(t, rep.rules()["invalid_field"], 1, "%+v", rep.Violations)
		assert.GreaterOrEqual(t, rep.rules()["seq_gap"], 1, "%+v", rep.Violations)
		found := false
		for _, v := range rep.Violations {
			found = found || strings.Contains(v.Detail, "seq holds 'two'")
		}
		assert.True(t, found, "the stored value is named: %+v", rep.Violations)
	}
	stdout, stderr, code := ledgerctl(t, "verify", "--db", db, "--all-namespaces")
	assert.Equal(t, 1, code, "%s%s", stdout, stderr)
	assert.Contains(t, stdout, "seq holds 'two'")
}

// TestLedgerd_postgresHeadMadeAgain: a superuser deletes a namespace's
// head row and makes it again empty (seq 0, as a new namespace has it),
// under a running ledgerd. Its next write is refused (503
// storage_corrupt: the receipt at seq 1 exists; never a second chain from
// seq 1), /readyz says so, the verifier reports
// the head row that is not the chain's tail, and a restart refuses.
func TestLedgerd_postgresHeadMadeAgain(t *testing.T) {
	t.Parallel()
	db := pgtest.URL(t)
	l := StartLedgerd(t, db)
	succeedIn(t, l, "default", "charge-again-1")
	succeedIn(t, l, "default", "charge-again-2")
	tamperHeads(t, db, "default", `DELETE FROM head WHERE namespace = 'default'`,
		`INSERT INTO head (namespace, seq, hash, recorded_at) VALUES ('default', 0, '\x`+strings.Repeat("00", 32)+`', 0)`)

	r := l.Do("POST", "/v1/effects/reserve", reserve("charge-again-3", "exec-3", 1, false))
	assert.Equal(t, 503, r.Status, r.Raw)
	assert.Equal(t, "storage_corrupt", r.Code())
	assert.Equal(t, 503, l.Do("GET", "/readyz", "").Status)
	assert.Contains(t, l.Logs(), "head row is behind its receipts")
	rep, code := verifyJSON(t, "--db", db)
	assert.Equal(t, 1, code)
	assert.Equal(t, uint64(4), rep.Receipts, "nothing was appended")
	require.Equal(t, 1, rep.rules()["derived_state"], "%+v", rep.Violations)
	assert.Contains(t, rep.Violations[0].Detail, "head row is 0")
	require.NoError(t, l.Stop())
	out, code := runLedgerdBounded(t, "--db", db, "--listen", "127.0.0.1:0")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "receipts end at 4")
}
