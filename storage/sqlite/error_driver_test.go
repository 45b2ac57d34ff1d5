package sqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// TestClassify_driverErrors provokes real SQLite errors through whichever
// driver the build links (cgo by default, modernc under the tag or without
// cgo) and checks that Classify reads their codes.
func TestClassify_driverErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()

	garbage := filepath.Join(dir, "garbage.db")
	require.NoError(t, os.WriteFile(garbage, bytes.Repeat([]byte("not a database "), 600), 0o600))
	db, err := sql.Open("sqlite3", "file:"+garbage+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	_, err = db.ExecContext(ctx, `SELECT count(*) FROM sqlite_master`)
	require.ErrorIs(t, sqlite.Classify(err), ledger.ErrStorageCorrupt, "%v", err)

	path := filepath.Join(dir, "l.db")
	w, err := sql.Open("sqlite3", "file:"+path+"?mode=rwc&_busy_timeout=0")
	require.NoError(t, err)
	defer w.Close()
	_, err = w.ExecContext(ctx, `CREATE TABLE t (x INTEGER PRIMARY KEY)`)
	require.NoError(t, err)
	_, err = w.ExecContext(ctx, `INSERT INTO t VALUES (1)`)
	require.NoError(t, err)

	ro, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer ro.Close()
	_, err = ro.ExecContext(ctx, `INSERT INTO t VALUES (2)`)
	require.ErrorIs(t, sqlite.Classify(err), ledger.ErrReadOnly, "%v", err)

	held, err := w.Conn(ctx)
	require.NoError(t, err)
	defer held.Close()
	_, err = held.ExecContext(ctx, `BEGIN IMMEDIATE`)
	require.NoError(t, err)
	other, err := sql.Open("sqlite3", "file:"+path+"?mode=rw&_busy_timeout=0")
	require.NoError(t, err)
	defer other.Close()
	_, err = other.ExecContext(ctx, `INSERT INTO t VALUES (3)`)
	require.ErrorIs(t, sqlite.Classify(err), ledger.ErrBusy, "%v", err)
	_, err = held.ExecContext(ctx, `ROLLBACK`)
	require.NoError(t, err)

	_, err = w.ExecContext(ctx, `INSERT INTO t VALUES (1)`)
	require.Error(t, err)
	require.False(t, errors.Is(sqlite.Classify(err), ledger.ErrUnavailable), "a constraint is not unavailability: %v", err)
}
