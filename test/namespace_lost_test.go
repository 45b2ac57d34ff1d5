package test

import (
	"bytes"
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// succeedIn reserves and commits key in namespace ns of l.
func succeedIn(t *testing.T, l *Ledgerd, ns, key string) {
	t.Helper()
	r := l.Do("POST", "/v1/ns/"+ns+"/effects/reserve", reserve(key, "exec-"+key, 1, false))
	require.Equal(t, 201, r.Status, r.Raw)
	r = l.Do("POST", "/v1/ns/"+ns+"/effects/"+key+"/commit", `{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded","external_ref":"ref-`+key+`"}`)
	require.Equal(t, 201, r.Status, r.Raw)
}

// copyFile copies src to dst.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(dst, b, 0o644))
}

// TestLedgerd_lostNamespaceRefused: a namespace the registry knows is
// never served empty or stale. Its file missing (the ledger file restored
// alone) or behind the head the registry recorded (a namespace file from
// an older backup) stops ledgerd at start and fails verify, naming both
// ways out; putting the files back serves the committed key as a replay;
// `ledgerctl namespace forget` gives the namespace up and records who
// decided.
func TestLedgerd_lostNamespaceRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	nsDir := db + ".ns"
	nsFile := filepath.Join(nsDir, "ns-pay.db")
	l := StartLedgerd(t, db)
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"pay"}`).Status)
	succeedIn(t, l, "pay", "charge-0001")
	require.NoError(t, l.Stop())
	old := filepath.Join(dir, "ns-pay.db.old") // a backup taken now
	copyFile(t, nsFile, old)

	l = StartLedgerd(t, db)
	succeedIn(t, l, "pay", "charge-0002")
	require.NoError(t, l.Stop())

	t.Run("ErrMissing", func(t *testing.T) {
		require.NoError(t, os.Rename(nsDir, nsDir+".away"))
		out, code := runLedgerd(t, "--db", db, "--listen", "127.0.0.1:0")
		assert.Equal(t, 1, code, out)
		assert.Contains(t, out, `namespace \"pay\": its file `+nsFile+" is missing")
		assert.Contains(t, out, "ledgerctl namespace forget pay --db "+db)
		assert.NoDirExists(t, nsDir, "nothing is created in place of the lost namespace")
		stdout, stderr, code := ledgerctl(t, "verify", "--db", db, "--all-namespaces")
		assert.NotEqual(t, 0, code, "verify fails while a namespace is missing: %s%s", stdout, stderr)
		assert.Contains(t, stderr, "is missing")
		require.NoError(t, os.Rename(nsDir+".away", nsDir))
	})

	t.Run("ErrBehind", func(t *testing.T) {
		current := filepath.Join(dir, "ns-pay.db.current")
		require.NoError(t, os.Rename(nsFile, current))
		copyFile(t, old, nsFile)
		out, code := runLedgerd(t, "--db", db, "--listen", "127.0.0.1:0")
		assert.Equal(t, 1, code, out)
		assert.Contains(t, out, "ends at receipt 2 but the registry recorded 4")
		stdout, stderr, code := ledgerctl(t, "verify", "--db", db, "--namespace", "pay")
		assert.NotEqual(t, 0, code, "verify fails on a namespace behind the registry: %s%s", stdout, stderr)
		require.NoError(t, os.Rename(current, nsFile))
	})

	t.Run("OK restored", func(t *testing.T) {
		l := StartLedgerd(t, db)
		r := l.Do("POST", "/v1/ns/pay/effects/reserve", reserve("charge-0002", "exec-again", 1, false))
		assert.Equal(t, 200, r.Status, "the committed key is replayed, never run again: %s", r.Raw)
		assert.Equal(t, "replayed", r.Body["status"])
		require.NoError(t, l.Stop())
		stdout, stderr, code := ledgerctl(t, "verify", "--db", db, "--all-namespaces")
		assert.Equal(t, 0, code, stdout+stderr)
	})

	t.Run("OK forget", func(t *testing.T) {
		require.NoError(t, os.Rename(nsDir, nsDir+".lost"))
		_, stderr, code := ledgerctl(t, "namespace", "forget", "--db", db, "pay")
		assert.Equal(t, 2, code)
		assert.Contains(t, stderr, "--by and --reason are required")
		stdout, stderr, code := ledgerctl(t, "namespace", "forget", "--db", db, "pay", "--by", "alice", "--reason", "disk lost (INC-42)")
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, stdout, "namespace pay forgotten (its file was missing; the registry had recorded 5 receipts)")

		raw, err := sql.Open("sqlite3", "file:"+db+"?mode=ro")
		require.NoError(t, err)
		var by, reason string
		var seq int
		require.NoError(t, raw.QueryRow(`SELECT decided_by, reason, head_seq FROM namespace_events WHERE name = 'pay'`).Scan(&by, &reason, &seq))
		require.NoError(t, raw.Close())
		assert.Equal(t, []any{"alice", "disk lost (INC-42)", 5}, []any{by, reason, seq})

		l := StartLedgerd(t, db)
		assert.Equal(t, 404, l.Do("GET", "/v1/ns/pay/head", "").Status, "a forgotten namespace is unknown")
		require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"pay"}`).Status, "and can be created again, empty")
		r := l.Do("GET", "/v1/ns/pay/head", "")
		assert.Equal(t, float64(0), r.Body["seq"])
	})
}

// TestLedgerd_namespaceCreationCrash: a creation that died after making
// the namespace's file but before registering it left an empty file (and
// perhaps a half-made temporary one); the next creation takes it up. A
// file of the same name that holds receipts the registry does not know is
// refused, untouched.
func TestLedgerd_namespaceCreationCrash(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	l := StartLedgerd(t, db)
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"a"}`).Status)
	succeedIn(t, l, "a", "charge-0001")
	require.NoError(t, l.Stop())
	// "b": its file made, the process killed before the registry row.
	nsDir := db + ".ns"
	require.NoError(t, os.WriteFile(filepath.Join(nsDir, "ns-b.db.new"), []byte("half"), 0o644))
	_, stderr, code := ledgerctl(t, "namespace", "create", "--db", db, "empty")
	require.Equal(t, 0, code, stderr)
	raw, err := sql.Open("sqlite3", "file:"+db)
	require.NoError(t, err)
	_, err = raw.Exec(`DELETE FROM namespaces WHERE name = 'empty'`)
	require.NoError(t, err)
	require.NoError(t, raw.Close())
	require.NoError(t, os.Rename(filepath.Join(nsDir, "ns-empty.db"), filepath.Join(nsDir, "ns-b.db")))
	// "c": a file with history that the registry does not know.
	copyFile(t, filepath.Join(nsDir, "ns-a.db"), filepath.Join(nsDir, "ns-c.db"))
	before, err := os.ReadFile(filepath.Join(nsDir, "ns-c.db"))
	require.NoError(t, err)

	l = StartLedgerd(t, db)
	r := l.Do("POST", "/v1/namespaces", `{"name":"b"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	assert.NoFileExists(t, filepath.Join(nsDir, "ns-b.db.new"), "the half-made file is gone")
	r = l.Do("POST", "/v1/ns/b/effects/reserve", reserve("charge-0001", "exec-b", 1, false))
	assert.Equal(t, 201, r.Status, r.Raw)

	r = l.Do("POST", "/v1/namespaces", `{"name":"c"}`)
	assert.GreaterOrEqual(t, r.Status, 400, r.Raw)
	assert.Equal(t, 404, l.Do("GET", "/v1/ns/c/head", "").Status, "a refused creation registers nothing")
	after, err := os.ReadFile(filepath.Join(nsDir, "ns-c.db"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(before, after), "the unknown file is left as it was")
}

// TestLedgerd_emptyFileRefused: a zero-byte --db file is not a new ledger
// (history, tokens and auth would silently start over). ledgerd and
// rebuild-index refuse it and leave it as it was, with nothing beside it.
func TestLedgerd_emptyFileRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	require.NoError(t, os.WriteFile(db, nil, 0o644))
	out, code := runLedgerd(t, "--db", db, "--listen", "127.0.0.1:0")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "the file is empty (0 bytes)")
	_, stderr, code := ledgerctl(t, "rebuild-index", "--db", db)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, stderr, "the file is empty (0 bytes)")
	fi, err := os.Stat(db)
	require.NoError(t, err)
	assert.Zero(t, fi.Size())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no -wal, -shm or .lock beside the refused file")
}

// TestLedgerd_proofsAfterDamage: receipts cut from the chain after a
// checkpoint was signed, then rebuild-index: every proof route answers a
// 4xx with the contract's codes (never 500), naming the damage.
func TestLedgerd_proofsAfterDamage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, vkey, key := startSigned(t, dir)
	appendN(t, l, "cut", 6)
	waitCheckpoint(t, l, vkey, 6)
	require.NoError(t, l.Stop())
	raw, err := sql.Open("sqlite3", "file:"+l.DB)
	require.NoError(t, err)
	for _, q := range []string{`DROP TRIGGER receipts_no_delete`, `DELETE FROM receipts WHERE seq > 3`} {
		_, err := raw.Exec(q)
		require.NoError(t, err)
	}
	require.NoError(t, raw.Close())
	_, stderr, code := ledgerctl(t, "rebuild-index", "--db", l.DB)
	require.Equal(t, 0, code, stderr)

	l = StartLedgerd(t, l.DB, "--signing-key", key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms")
	for _, tc := range []struct {
		path, wantCode string
		wantStatus     int
	}{
		{"/v1/receipts/2/proof", "not_checkpointed", 404},
		{"/v1/receipts/2/proof?size=6", "not_checkpointed", 404},
		{"/v1/ns/default/receipts/3/proof", "not_checkpointed", 404},
		{"/v1/proof/inclusion?seq=2", "invalid_request", 400},
		{"/v1/proof/inclusion?seq=2&size=6", "invalid_request", 400},
		{"/v1/proof/consistency?from=2&to=6", "invalid_request", 400},
		{"/v1/receipts/5/proof", "unknown_receipt", 404},
	} {
		r := l.Do("GET", tc.path, "")
		assert.Equal(t, tc.wantStatus, r.Status, "%s: %s", tc.path, r.Raw)
		assert.Equal(t, tc.wantCode, r.Code(), tc.path)
	}
	assert.NotContains(t, l.Logs(), "internal error")
}

// TestLedgerd_maxNamespaces: --max-namespaces bounds how many namespaces
// exist (default included); one more is 507 namespace_limit, and nothing
// is created.
func TestLedgerd_maxNamespaces(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	l := StartLedgerd(t, db, "--max-namespaces", "3")
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"a"}`).Status)
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"b"}`).Status)
	r := l.Do("POST", "/v1/namespaces", `{"name":"c"}`)
	assert.Equal(t, 507, r.Status, r.Raw)
	assert.Equal(t, "namespace_limit", r.Code())
	assert.Contains(t, r.Raw, "at most 3 namespaces")
	assert.Equal(t, 409, l.Do("POST", "/v1/namespaces", `{"name":"a"}`).Status, "an existing name is still 409")
	assert.Equal(t, 404, l.Do("GET", "/v1/ns/c/head", "").Status)
	assert.NoFileExists(t, filepath.Join(db+".ns", "ns-c.db"))

	out, code := runLedgerd(t, "--db", db, "--max-namespaces", "-1")
	assert.Equal(t, 2, code, out)
	assert.Contains(t, out, "--max-namespaces must be 0 (no limit) or positive")
}
