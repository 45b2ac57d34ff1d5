package test

import (
	"bytes"
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit"
)

// succeedIn reserves and commits key in namespace ns of l.
func succeedIn(t *testing.T, l *Ledgerd, ns, key string) {
	t.Helper()
	r := l.Do("POST", "/v1/ns/"+ns+"/effects/reserve", reserve(key, "exec-"+key, 1, false))
	require.Equal(t, 201, r.Status, r.Raw)
	r = l.Do("POST", "/v1/ns/"+ns+"/effects/"+key+"/commit", `{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded","external_ref":"ref-`+key+`"}`)
	require.Equal(t, 201, r.Status, r.Raw)
}

// v5Ledger copies the ledger of storage/sqlite/testdata/v5ns — written by
// ledgerd v0.4.0 over HTTP, schema 5, a file per namespace: default, alpha
// and beta (11 receipts each, the registry recording 11) — into dir and
// returns its path.
func v5Ledger(t *testing.T, dir string) string {
	t.Helper()
	src := filepath.Join("..", "storage", "sqlite", "testdata", "v5ns")
	require.NoError(t, os.Mkdir(filepath.Join(dir, "ledger.db.ns"), 0o755))
	for _, f := range []string{"ledger.db", "ledger.db.ns/ns-alpha.db", "ledger.db.ns/ns-beta.db"} {
		testkit.CopyFile(t, filepath.Join(src, f), filepath.Join(dir, f))
	}
	return filepath.Join(dir, "ledger.db")
}

// TestLedgerd_lostNamespaceRefused: a ledger of the layout with a file
// per namespace is moved into the ledger file only whole. A namespace the
// registry knows whose file is missing (the ledger file restored alone) or
// behind the head the registry recorded (a namespace file from an older
// backup) stops ledgerd at start, before anything is moved, and fails
// verify, naming both ways out; putting the file back moves every
// namespace in and serves the committed keys as replays; `ledgerctl
// namespace forget` gives a namespace up, keeping its receipts in a file
// of their own, and records who decided.
func TestLedgerd_lostNamespaceRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := v5Ledger(t, dir)
	nsDir := db + ".ns"
	nsFile := filepath.Join(nsDir, "ns-alpha.db")

	t.Run("ErrMissing", func(t *testing.T) {
		require.NoError(t, os.Rename(nsDir, nsDir+".away"))
		out, code := runLedgerd(t, "--db", db, "--listen", "127.0.0.1:0")
		assert.Equal(t, 1, code, out)
		assert.Contains(t, out, `namespace \"alpha\": its file `+nsFile+" is missing")
		assert.Contains(t, out, "ledgerctl namespace forget alpha --db "+db)
		assert.NoDirExists(t, nsDir, "nothing is created in place of the lost namespace")
		stdout, stderr, code := ledgerctl(t, "verify", "--db", db, "--all-namespaces")
		assert.NotEqual(t, 0, code, "verify fails while a namespace is missing: %s%s", stdout, stderr)
		assert.Contains(t, stderr, "is missing")
		require.NoError(t, os.Rename(nsDir+".away", nsDir))
	})

	t.Run("ErrBehind", func(t *testing.T) {
		current := filepath.Join(dir, "ns-alpha.db.current")
		testkit.CopyFile(t, nsFile, current)
		editLedger(t, nsFile, `DELETE FROM receipts WHERE seq > 8`, `UPDATE head SET seq = 8, hash = (SELECT hash FROM receipts WHERE seq = 8)`)
		edited, err := os.ReadFile(nsFile)
		require.NoError(t, err)
		out, code := runLedgerd(t, "--db", db, "--listen", "127.0.0.1:0")
		assert.Equal(t, 1, code, out)
		assert.Contains(t, out, "ends at receipt 8 but the registry recorded 11")
		stdout, stderr, code := ledgerctl(t, "verify", "--db", db, "--namespace", "alpha")
		assert.NotEqual(t, 0, code, "verify fails on a namespace behind the registry: %s%s", stdout, stderr)
		after, err := os.ReadFile(nsFile)
		require.NoError(t, err)
		assert.Equal(t, edited, after, "a refused start leaves the namespace's file as it was")
		require.NoError(t, os.Rename(current, nsFile))
	})

	t.Run("OK restored", func(t *testing.T) {
		l := StartLedgerd(t, db)
		reserveOrder := func(ns string) Resp {
			return l.Do("POST", "/v1/ns/"+ns+"/effects/reserve", `{"idempotency_key":"`+ns+`-order-0000","execution_id":"e9","tool":"payments.refund","effect":"write","input":{"order":0}}`)
		}
		r := reserveOrder("alpha")
		assert.Equal(t, 200, r.Status, "the committed key is replayed, never run again: %s", r.Raw)
		assert.Equal(t, "replayed", r.Body["status"])
		// beta keeps keys for an hour, and its receipts are older than that:
		// the moved namespace kept its key lifetime, so the key renews.
		r = reserveOrder("beta")
		assert.Equal(t, 201, r.Status, r.Raw)
		assert.Equal(t, "reserved", r.Body["status"])
		assert.NotNil(t, r.Body["renewed"], "beta's key lifetime moved with it: %s", r.Raw)
		for _, ns := range []string{"alpha", "beta"} {
			assert.NoFileExists(t, filepath.Join(nsDir, "ns-"+ns+".db"))
			assert.FileExists(t, filepath.Join(nsDir, "ns-"+ns+".db.migrated"))
		}
		require.NoError(t, l.Stop())
		stdout, stderr, code := ledgerctl(t, "verify", "--db", db, "--all-namespaces")
		assert.Equal(t, 0, code, stdout+stderr)
	})

	t.Run("OK forget", func(t *testing.T) {
		_, stderr, code := ledgerctl(t, "namespace", "forget", "--db", db, "alpha")
		assert.Equal(t, 2, code)
		assert.Contains(t, stderr, "--by and --reason are required")
		stdout, stderr, code := ledgerctl(t, "namespace", "forget", "--db", db, "alpha", "--by", "alice", "--reason", "tenant left (INC-42)")
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, stdout, "namespace alpha forgotten")
		kept, err := filepath.Glob(db + ".forgotten-alpha-*")
		require.NoError(t, err)
		require.Len(t, kept, 1, "its receipts are kept in a file of their own")
		assert.Contains(t, stdout, kept[0])
		out, stderr, code := ledgerctl(t, "verify", "--db", kept[0])
		assert.Equal(t, 0, code, stderr)
		assert.Contains(t, out, "OK: 12 receipts")

		raw, err := sql.Open("sqlite3", "file:"+db+"?mode=ro")
		require.NoError(t, err)
		var by, reason, movedTo string
		var seq, left int
		require.NoError(t, raw.QueryRow(`SELECT decided_by, reason, head_seq, moved_to FROM namespace_events WHERE name = 'alpha'`).Scan(&by, &reason, &seq, &movedTo))
		require.NoError(t, raw.QueryRow(`SELECT count(*) FROM ns_receipts WHERE ns != 0 AND ns NOT IN (SELECT id FROM namespaces)`).Scan(&left))
		require.NoError(t, raw.Close())
		assert.Equal(t, []any{"alice", "tenant left (INC-42)", 12, kept[0]}, []any{by, reason, seq, movedTo})
		assert.Zero(t, left, "the forgotten namespace's rows are gone from the ledger file")

		l := StartLedgerd(t, db)
		assert.Equal(t, 404, l.Do("GET", "/v1/ns/alpha/head", "").Status, "a forgotten namespace is unknown")
		require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"alpha"}`).Status, "and can be created again, empty")
		r := l.Do("GET", "/v1/ns/alpha/head", "")
		assert.Equal(t, float64(0), r.Body["seq"])
		r = l.Do("GET", "/v1/ns/beta/head", "")
		assert.Equal(t, float64(12), r.Body["seq"], "the other namespace is untouched")
		require.NoError(t, l.Stop())
		stdout, stderr, code = ledgerctl(t, "verify", "--db", db, "--all-namespaces")
		assert.Equal(t, 0, code, stdout+stderr)
	})
}

// TestLedgerd_unknownNamespaceFileRefused: a file of the earlier layout
// that holds receipts the registry does not know (the ledger file restored
// from before the namespace was created) is neither moved in nor taken
// over by a namespace created under its name, and is left as it was; an
// empty one (left by a creation that died) is no history.
func TestLedgerd_unknownNamespaceFileRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := v5Ledger(t, dir)
	nsDir := db + ".ns"
	testkit.CopyFile(t, filepath.Join(nsDir, "ns-alpha.db"), filepath.Join(nsDir, "ns-c.db"))
	before, err := os.ReadFile(filepath.Join(nsDir, "ns-c.db"))
	require.NoError(t, err)

	l := StartLedgerd(t, db)
	r := l.Do("POST", "/v1/namespaces", `{"name":"c"}`)
	assert.GreaterOrEqual(t, r.Status, 400, r.Raw)
	assert.Contains(t, r.Raw, "already holds receipts the ledger does not know")
	assert.Equal(t, 404, l.Do("GET", "/v1/ns/c/head", "").Status, "a refused creation registers nothing")
	_, stderr, code := ledgerctl(t, "namespace", "create", "--db", db, "c")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, stderr, "already holds 11 receipts")
	after, err := os.ReadFile(filepath.Join(nsDir, "ns-c.db"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(before, after), "the unknown file is left as it was")

	require.NoError(t, os.WriteFile(filepath.Join(nsDir, "ns-d.db.new"), []byte("half"), 0o644))
	r = l.Do("POST", "/v1/namespaces", `{"name":"d"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	r = l.Do("POST", "/v1/ns/d/effects/reserve", reserve("charge-0001", "exec-d", 1, false))
	assert.Equal(t, 201, r.Status, r.Raw)
}
