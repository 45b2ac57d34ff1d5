package sqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

var quiet = sqlite.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}

// makeSQLite creates an SQLite file of another application with a
// rollback journal, running stmts.
func makeSQLite(tb testing.TB, path string, stmts ...string) {
	tb.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=DELETE")
	require.NoError(tb, err)
	defer db.Close()
	for _, s := range stmts {
		_, err := db.Exec(s)
		require.NoError(tb, err, s)
	}
}

// TestOpen_refusedFilesUntouched checks that a file Open refuses is left
// byte for byte as it was, with nothing created beside it.
func TestOpen_refusedFilesUntouched(t *testing.T) {
	for _, tt := range []struct {
		desc    string
		make    func(tb testing.TB, path string)
		wantErr error
	}{
		{"another application's SQLite database", func(tb testing.TB, p string) {
			makeSQLite(tb, p, `CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)`, `INSERT INTO notes (body) VALUES ('keep me')`)
		}, ledger.ErrNotLedger},
		{"a database with another application_id", func(tb testing.TB, p string) {
			makeSQLite(tb, p, `PRAGMA application_id = 42`, `CREATE TABLE t (x)`)
		}, ledger.ErrNotLedger},
		{"an SQLite database with user_version but no application_id", func(tb testing.TB, p string) {
			makeSQLite(tb, p, `CREATE TABLE receipts (x)`, `PRAGMA user_version = 2`)
		}, ledger.ErrNotLedger},
		{"not an SQLite file", func(tb testing.TB, p string) {
			require.NoError(tb, os.WriteFile(p, bytes.Repeat([]byte("not a database\n"), 100), 0o644))
		}, ledger.ErrNotLedger},
		{"a few bytes", func(tb testing.TB, p string) {
			require.NoError(tb, os.WriteFile(p, []byte("SQLite"), 0o644))
		}, ledger.ErrNotLedger},
		{"a ledger of a newer schema", func(tb testing.TB, p string) {
			makeSQLite(tb, p, `PRAGMA application_id = 1701209452`, `CREATE TABLE receipts (x)`, `PRAGMA user_version = 99`)
		}, ledger.ErrSchemaVersion},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "x.db")
			tt.make(t, path)
			before, err := os.ReadFile(path)
			require.NoError(t, err)
			_, err = ledgertest.TryOpen(t, ledgertest.WithPath(path))
			require.ErrorIs(t, err, tt.wantErr)
			after, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(before, after), "the refused file was changed")
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			assert.Equal(t, []string{"x.db"}, names, "nothing is created beside a refused file")
		})
	}
}

func TestOpen_missingDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no", "such", "ledger.db")
	_, err := ledgertest.TryOpen(t, ledgertest.WithPath(path))
	require.Error(t, err)
	assert.Contains(t, err.Error(), path, "the message names the database")
	assert.Contains(t, err.Error(), "does not exist")
	assert.NotContains(t, err.Error(), ".lock")
}

// TestOpen_migratesV1 opens a file written by the version 1 schema
// (testdata/v1.db, made by ledgerd before schema 2: refund-order-1234
// succeeded and was replayed, mail-welcome-42 failed retryably,
// open-key-0001 is reserved with the token below) and checks it is
// migrated in place with every receipt and the derived state kept.
func TestOpen_migratesV1(t *testing.T) {
	src, err := os.ReadFile("testdata/v1.db")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "v1.db")
	require.NoError(t, os.WriteFile(path, src, 0o644))

	db := ledgertest.Open(t, ledgertest.WithPath(path))
	head := db.Head()
	assert.Equal(t, uint64(6), head.Seq)
	assert.Equal(t, "7466c1f48d5bcbab0c4bb621b0e49ffeff35078eedd7eb30e8766fcec4adb602", head.Hash.String())
	w, _ := db.Store.Pools()
	var version int
	require.NoError(t, w.QueryRow(`PRAGMA user_version`).Scan(&version))
	assert.Equal(t, sqlite.SchemaVersion, version)
	var uniques int
	require.NoError(t, w.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'receipts' AND name LIKE 'sqlite_autoindex%'`).Scan(&uniques))
	assert.Zero(t, uniques, "the UNIQUE hash indexes are gone")
	ledgertest.VerifyChain(t, db)

	rep := ledgertest.MustReserve(t, db, ledger.ReserveRequest{IdempotencyKey: "refund-order-1234", ExecutionID: "exec-9",
		Tool: "payments.refund", Effect: chain.EffectWrite, Input: json.RawMessage(`{"order":1234}`)})
	assert.Equal(t, ledger.StatusReplayed, rep.Status)
	assert.Equal(t, uint64(2), rep.Original.Seq)
	c := ledgertest.MustCommit(t, db, testkit.Succeed("open-key-0001", "rsv_97b515b4bc1af678bd5ec5fccdfed4ee75c4dc4e0d6fc69fe93bb516ad50417b"))
	assert.Equal(t, uint64(8), c.Receipt.Seq, "the reservation token survived the migration")
	retry := ledgertest.MustReserve(t, db, ledger.ReserveRequest{IdempotencyKey: "mail-welcome-42", ExecutionID: "exec-3", Attempt: i64(2),
		Tool: "email.send", Effect: chain.EffectExternal, Idempotent: true})
	assert.True(t, retry.Retry)
	ledgertest.VerifyChain(t, db)
	require.NoError(t, db.Close())

	db2, err := ledgertest.TryOpen(t, ledgertest.WithPath(path))
	require.NoError(t, err, "a migrated file opens again")
	assert.Equal(t, uint64(9), db2.Head().Seq)
	require.NoError(t, db2.Close())
}

// TestOpen_derivedState removes the receipts' tail behind ledgerd's back,
// as a bad restore or a tampered file would, and checks that Open refuses
// to serve from the derived state (it would replay another key's result)
// until rebuild-index repaired it.
func TestOpen_derivedState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path))
	a := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-aaaa-0001", "exec-1"))
	ledgertest.MustCommit(t, db, testkit.Succeed("key-aaaa-0001", a.Reservation))
	b := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-bbbb-0002", "exec-2"))
	ledgertest.MustCommit(t, db, testkit.Succeed("key-bbbb-0002", b.Reservation)) // seq 4
	require.NoError(t, db.Close())

	execFile(t, path, `DROP TRIGGER ns_receipts_no_delete; DELETE FROM ns_receipts WHERE ns = 0 AND seq > 2`)

	_, err := ledgertest.TryOpen(t, ledgertest.WithPath(path))
	require.ErrorIs(t, err, ledger.ErrDerivedState)
	assert.Contains(t, err.Error(), "ledgerctl rebuild-index --db "+path)

	head, err := sqlite.RebuildIndex(context.Background(), path, ledger.DefaultNamespace, quiet)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), head.Seq)

	db, err = ledgertest.TryOpen(t, ledgertest.WithPath(path))
	require.NoError(t, err, "open after rebuild-index")
	defer db.Close()
	assert.Equal(t, uint64(2), db.Head().Seq)
	res := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-bbbb-0002", "exec-3"))
	assert.Equal(t, ledger.StatusReserved, res.Status, "the removed key is new again, not a replay of another key's result")
	assert.Equal(t, uint64(3), res.Receipt.Seq)
}

// TestSchema_linkingTrigger checks that the database itself refuses a
// receipt that does not extend the head.
func TestSchema_linkingTrigger(t *testing.T) {
	db := ledgertest.Open(t)
	ledgertest.MustReserve(t, db, testkit.ReserveReq("key-aaaa-0001", "exec-1"))
	ledgertest.MustReserve(t, db, testkit.ReserveReq("key-bbbb-0002", "exec-2"))
	w, _ := db.Store.Pools()
	cols := `seq, kind, idempotency_key, key_generated, execution_id, attempt, tool, effect, idempotent, input_hash,
		outcome, external_ref, result, error_code, error_message, retryable, lease_expires_at, ref_seq, actor, note,
		recorded_at, prev_hash, hash`
	head := db.Head()
	for _, tt := range []struct {
		desc string
		seq  uint64
		prev []byte
	}{
		{"fork at seq 2", 2, head.Hash[:]},
		{"gap", 4, head.Hash[:]},
		{"wrong prev_hash", 3, make([]byte, 32)},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			_, err := w.Exec(`INSERT INTO ns_receipts (ns, `+cols+`) VALUES (0, ?, 'reserve', 'k', 0, 'e', 1, 't', 'write', 0, '', '', '', '', '', '', 0, 0, 0, '', '', 0, ?, ?)`,
				tt.seq, tt.prev, make([]byte, 32))
			require.Error(t, err)
			assert.True(t, strings.Contains(err.Error(), "extend the head") || strings.Contains(err.Error(), "UNIQUE"), err.Error())
		})
	}
	assert.Equal(t, head, db.Head())
}

// TestOpen_cacheMiB: a quarter of Options.CacheMiB (the key index takes
// the rest), at least 2 MiB, sizes
// the writer's page cache and sets SQLite's process-wide soft heap limit, under which page caches
// recycle pages instead of growing (what bounds ledgerd's memory with many
// namespaces).
func TestOpen_cacheMiB(t *testing.T) {
	opts := quiet
	opts.CacheMiB = 12
	db := ledgertest.Open(t, ledgertest.WithPath(filepath.Join(t.TempDir(), "l.db")), ledgertest.WithStore(opts))
	w, _ := db.Store.Pools()
	var cache int64
	require.NoError(t, w.QueryRow(`PRAGMA cache_size`).Scan(&cache))
	assert.Equal(t, int64(-3*1024), cache, "KiB, negative: a quarter of 12 MiB")
	var limit int64
	require.NoError(t, w.QueryRow(`PRAGMA soft_heap_limit`).Scan(&limit))
	assert.Equal(t, int64(3<<20), limit)

	ledgertest.Open(t, ledgertest.WithPath(filepath.Join(t.TempDir(), "d.db"))) // a second ledger, at the default cache size
	require.NoError(t, w.QueryRow(`PRAGMA soft_heap_limit`).Scan(&limit))
	assert.Equal(t, int64(sqlite.DefaultCacheMiB/4<<20), limit, "process-wide: the last Open sets it")
}

// openWithUserVersion makes a ledger file, sets its user_version (the
// schema version) to v and returns the error of opening it again.
func openWithUserVersion(t *testing.T, v int) error {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path))
	w, _ := db.Store.Pools()
	_, err := w.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, v))
	require.NoError(t, err)
	require.NoError(t, db.Close())
	_, err = ledgertest.TryOpen(t, ledgertest.WithPath(path))
	return err
}

func TestOpen(t *testing.T) {
	t.Run("ErrNotLedger", func(t *testing.T) {
		assert.ErrorIs(t, openWithUserVersion(t, 0), ledger.ErrNotLedger)
	})
	t.Run("ErrSchemaVersion", func(t *testing.T) {
		assert.ErrorIs(t, openWithUserVersion(t, 99), ledger.ErrSchemaVersion)
	})
	t.Run("directory", func(t *testing.T) {
		_, err := ledgertest.TryOpen(t, ledgertest.WithPath(t.TempDir()))
		assert.ErrorContains(t, err, "is a directory")
	})
	t.Run("unusable path", func(t *testing.T) {
		_, err := ledgertest.TryOpen(t, ledgertest.WithPath(t.TempDir()+"/no/such/dir/l.db"))
		assert.Error(t, err)
	})
	t.Run("ErrClosed", func(t *testing.T) {
		db := ledgertest.Open(t)
		require.NoError(t, db.Close())
		_, err := db.Reserve(context.Background(), testkit.ReserveReq(key, "exec-1"))
		assert.True(t, errors.Is(err, ledger.ErrClosed))
		assert.Equal(t, ledger.ECodeUnavailable, ledger.ErrorCode(err))
	})
	t.Run("reopen keeps state", func(t *testing.T) {
		path := t.TempDir() + "/r.db"
		clock := testkit.NewClock()
		db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithNow(clock.Now))
		res := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		head := db.Head()
		require.NoError(t, db.Close())
		db = ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithNow(clock.Now))
		assert.Equal(t, head, db.Head())
		ledgertest.MustCommit(t, db, testkit.Succeed(key, res.Reservation)) // the token survives a restart
		ledgertest.VerifyChain(t, db)
	})
}

// TestStore_pragmas checks that every connection, more than the pool holds,
// runs in WAL mode with synchronous FULL.
func TestStore_pragmas(t *testing.T) {
	db := ledgertest.Open(t)
	w, r := db.Store.Pools()
	ctx := context.Background()
	check := func(t *testing.T, conn interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}) {
		var mode string
		var sync int
		require.NoError(t, conn.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode))
		require.NoError(t, conn.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&sync))
		assert.Equal(t, "wal", mode)
		assert.Equal(t, 2, sync, "synchronous FULL")
	}
	check(t, w)
	// Hold every connection of the read pool at once, then drop them and
	// open a fresh set, so that connections the pool creates later are
	// checked too.
	for round := 0; round < 3; round++ {
		n := r.Stats().MaxOpenConnections
		require.Positive(t, n)
		var conns []*sql.Conn
		for range n {
			c, err := r.Conn(ctx)
			require.NoError(t, err)
			check(t, c)
			conns = append(conns, c)
		}
		for _, c := range conns {
			_ = c.Raw(func(any) error { return driver.ErrBadConn }) // discard it
			_ = c.Close()
		}
	}
	assert.GreaterOrEqual(t, r.Stats().OpenConnections, 0)
}

func TestOpen_ErrLocked(t *testing.T) {
	path := t.TempDir() + "/l.db"
	db := ledgertest.Open(t, ledgertest.WithPath(path))
	_, err := ledgertest.TryOpen(t, ledgertest.WithPath(path))
	require.ErrorIs(t, err, sqlite.ErrLocked)
	assert.Contains(t, err.Error(), "pid")
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(t, err, "readers do not need the lock")
	require.NoError(t, rd.Close())
	require.NoError(t, db.Close())
	db, err = ledgertest.TryOpen(t, ledgertest.WithPath(path))
	require.NoError(t, err, "the lock is released on Close")
	require.NoError(t, db.Close())
}

// TestOpen_migratesV3 opens a file written by schema 3, which kept the
// keys table and four indexes on receipts (testdata/v3.db, made by
// ledgerd v0.3.0: invoice-2026-0001 succeeded and was replayed,
// mail-2026-0002 and open-2026-0003 are reserved, the second for an
// hour with the token below). It is migrated in place to an append-only file whose key
// state is in the key index, and the open reservation still commits.
func TestOpen_migratesV3(t *testing.T) {
	src, err := os.ReadFile("testdata/v3.db")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "v3.db")
	require.NoError(t, os.WriteFile(path, src, 0o644))
	opts := quiet
	opts.Now = func() time.Time { return time.UnixMilli(1796147859887 - 30*60*1000) } // inside the lease
	db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithStore(opts))
	w, _ := db.Store.Pools()
	var version, tokens int
	require.NoError(t, w.QueryRow(`PRAGMA user_version`).Scan(&version))
	assert.Equal(t, sqlite.SchemaVersion, version)
	assertNewSchema(t, w)
	require.NoError(t, w.QueryRow(`SELECT count(*) FROM ns_tokens AS t JOIN ns_receipts AS r ON r.rowid = t.rid
		WHERE r.ns = 0 AND r.seq IN (3, 5)`).Scan(&tokens))
	assert.Equal(t, 2, tokens, "the open reservations' token hashes moved")
	ledgertest.VerifyChain(t, db)

	rep := ledgertest.MustReserve(t, db, ledger.ReserveRequest{IdempotencyKey: "invoice-2026-0001", ExecutionID: "exec-9",
		Tool: "billing.charge", Effect: chain.EffectWrite, Input: json.RawMessage(`{"amount":1200}`)})
	assert.Equal(t, ledger.StatusReplayed, rep.Status)
	assert.Equal(t, uint64(2), rep.Original.Seq)
	c := ledgertest.MustCommit(t, db, testkit.Succeed("open-2026-0003", "rsv_7feeda6d257eb72ae1f22ebe619334f98770261ad2c950575a96481d31b4601f"))
	assert.Equal(t, uint64(7), c.Receipt.Seq, "the reservation token survived the migration")
	v, err := db.GetKey(context.Background(), "mail-2026-0002")
	require.NoError(t, err)
	assert.Equal(t, ledger.StateInterrupted, v.State, "its lease ended half an hour ago")
	ledgertest.VerifyChain(t, db)

	ch, err := db.Store.Chain(context.Background(), ledger.DefaultNamespace)
	require.NoError(t, err)
	k1, err := ch.StateKey(context.Background())
	require.NoError(t, err)
	require.Len(t, k1, ledger.StateKeyLen, "a migrated file makes its secret")
	k2, err := ch.StateKey(context.Background())
	require.NoError(t, err)
	assert.Equal(t, k1, k2)
	ledgertest.VerifyChain(t, db)
}
