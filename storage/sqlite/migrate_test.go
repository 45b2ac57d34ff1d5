package sqlite_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/verify"
)

// assertNewSchema checks that the database behind w has exactly the
// tables, views, indexes and triggers of a ledger file made new.
func assertNewSchema(t *testing.T, w *sql.DB) {
	t.Helper()
	schema := func(db *sql.DB) string {
		rows, err := db.Query(`SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_schema ORDER BY type, name`)
		require.NoError(t, err)
		defer rows.Close()
		var b strings.Builder
		for rows.Next() {
			var kind, name, table, text string
			require.NoError(t, rows.Scan(&kind, &name, &table, &text))
			b.WriteString(kind + " " + name + " " + table + " " + normalizeSpace(text) + "\n")
		}
		require.NoError(t, rows.Err())
		return b.String()
	}
	fresh := ledgertest.Open(t, ledgertest.WithPath(filepath.Join(t.TempDir(), "new.db")))
	nw, _ := fresh.Store.Pools()
	want := schema(nw)
	require.NoError(t, fresh.Close())
	assert.Equal(t, want, schema(w), "the migration makes the schema of a new file")
}

// v6Ledger copies testdata/v6.db — testdata/v5ns as ledgerd of schema 6
// (default in its own tables, alpha and beta in the shared ones) left it,
// with a signed checkpoint in each namespace — into a temp dir.
func v6Ledger(t *testing.T) string {
	b, err := os.ReadFile("testdata/v6.db")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "ledger.db")
	require.NoError(t, os.WriteFile(path, b, 0o644))
	return path
}

// TestOpen_migratesV6: a ledger of schema 6 opens with the default
// namespace moved into the shared tables as namespace 0 — every chain,
// checkpoint, key lifetime and open reservation as it was — and the
// schema of a new file; the view receipts is the default chain.
func TestOpen_migratesV6(t *testing.T) {
	ctx := context.Background()
	path := v6Ledger(t)
	sum := func() [32]byte {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		return sha256.Sum256(b)
	}
	before := sum()
	rd, err := sqlite.OpenReader(ctx, path, quiet)
	require.NoError(t, err, "a reader takes a version 6 file through a migrated copy")
	h, err := rd.ReadHead(ctx)
	require.NoError(t, err)
	assert.Equal(t, v5Heads["default"], formatHead(h))
	require.NoError(t, rd.Close())
	assert.Equal(t, before, sum(), "reading leaves the file byte for byte as it was")

	db := ledgertest.Open(t, ledgertest.WithPath(path))
	w, _ := db.Store.Pools()
	assertNewSchema(t, w)
	var version, n int
	require.NoError(t, w.QueryRow(`PRAGMA user_version`).Scan(&version))
	assert.Equal(t, sqlite.SchemaVersion, version)
	require.NoError(t, w.QueryRow(`SELECT count(*) FROM receipts`).Scan(&n))
	assert.Equal(t, 12, n, "the view receipts is the default chain")
	for ns, size := range map[string]int64{"default": 12, "alpha": 11, "beta": 11} {
		c, err := db.Store.Chain(ctx, ns)
		require.NoError(t, err)
		cp, err := c.LatestCheckpoint(ctx)
		require.NoError(t, err)
		require.NotNil(t, cp, ns)
		assert.Equal(t, size, cp.Size, "%s keeps its checkpoint", ns)
		tree, err := c.TreeSize(ctx)
		require.NoError(t, err)
		head, err := c.Head(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(head.Seq), tree, "%s has its whole tree", ns)
		ttl, err := c.KeyTTL(ctx)
		require.NoError(t, err)
		assert.Equal(t, map[string]uint64{"default": 0, "alpha": 0, "beta": 3_600_000}[ns], ttl, ns)
	}
	for ns, token := range v5Tokens {
		n, err := db.Ledger.NS(ctx, ns)
		require.NoError(t, err)
		h, err := n.Head(ctx)
		require.NoError(t, err)
		assert.Equal(t, v5Heads[ns], formatHead(h), ns)
		_, err = n.Commit(ctx, ledger.CommitRequest{IdempotencyKey: ns + "-open-0001", Reservation: token, Outcome: "succeeded"})
		require.NoError(t, err, "%s: the reservation made before the migration commits with its token", ns)
		rep, err := verify.New(chainOf(t, db.Store, ns), verify.Opts{}).Check(ctx)
		require.NoError(t, err)
		assert.True(t, rep.OK, "%s: %+v", ns, rep.Violations)
	}
	require.NoError(t, db.Close())
	db = ledgertest.Open(t, ledgertest.WithPath(path))
	assert.Equal(t, uint64(13), db.Head().Seq, "a migrated file opens again as it is")
	require.NoError(t, db.Close())
}

// TestOpen_migrationRefusesBrokenChain: a schema 6 file whose default
// chain has a gap is refused, and left as it was.
func TestOpen_migrationRefusesBrokenChain(t *testing.T) {
	path := v6Ledger(t)
	execFile(t, path, `DROP TRIGGER receipts_no_delete; DELETE FROM receipts WHERE seq = 5`)
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	_, err = ledgertest.TryOpen(t, ledgertest.WithPath(path))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nothing was changed")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, before, after)
}

// TestOpenTokens_migratesOlderFile: a token made on a ledger of schema 6
// is kept: the file is migrated in place first, under its lock.
func TestOpenTokens_migratesOlderFile(t *testing.T) {
	ctx := context.Background()
	path := v6Ledger(t)
	tk, err := sqlite.OpenTokens(ctx, path)
	require.NoError(t, err)
	_, err = tk.Create(ctx, "probe", "reader")
	require.NoError(t, err)
	require.NoError(t, tk.Close())
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	var version, n int
	require.NoError(t, db.QueryRow(`PRAGMA user_version`).Scan(&version))
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM tokens WHERE name = 'probe'`).Scan(&n))
	assert.Equal(t, sqlite.SchemaVersion, version)
	assert.Equal(t, 1, n, "the token is in the ledger file")
}
