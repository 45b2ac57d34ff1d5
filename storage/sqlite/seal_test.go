package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/internal/testkit"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// nsInfo is namespace name's entry of l.Namespaces.
func nsInfo(t *testing.T, l *ledger.Ledger, name string) ledger.NamespaceInfo {
	t.Helper()
	infos, err := l.Namespaces(context.Background())
	require.NoError(t, err)
	for _, info := range infos {
		if info.Name == name {
			return info
		}
	}
	t.Fatalf("no namespace %s", name)
	return ledger.NamespaceInfo{}
}

// TestStore_seals: a clean stop seals every namespace; the next start
// takes a sealed namespace's head and key lifetime from its seal without
// opening its file, as long as the file's fingerprint is unchanged, and
// checks the file as before once anything touched it.
func TestStore_seals(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	l, _ := openLedger(t, path, 4, time.Hour)
	require.NoError(t, l.CreateNamespace(ctx, "pay", 60_000))
	n, err := l.NS(ctx, "pay")
	require.NoError(t, err)
	_, err = n.Reserve(ctx, testkit.ReserveReq("sealed-key-1", "exec-1"))
	require.NoError(t, err)
	require.NoError(t, l.Close())

	// Mark the seal (in the ledger file, not the namespace's): a start that
	// trusts it reports the marked key lifetime.
	mark := func() {
		db, err := sql.Open("sqlite3", "file:"+path)
		require.NoError(t, err)
		defer db.Close()
		res, err := db.Exec(`UPDATE namespace_seals SET key_ttl_ms = 12345 WHERE name = 'pay' AND head_seq = 1`)
		require.NoError(t, err)
		rows, _ := res.RowsAffected()
		require.Equal(t, int64(1), rows, "a clean stop sealed the namespace at its head")
	}
	mark()
	l, _ = openLedger(t, path, 4, time.Hour)
	require.Equal(t, uint64(12345), nsInfo(t, l, "pay").KeyTTL, "the seal was trusted: the file was not opened")
	require.Equal(t, uint64(1), nsInfo(t, l, "pay").Head.Seq)
	// ... but never for a decision: the file's own key lifetime is
	// compared when it opens, and a seal that differs is refused.
	n, err = l.NS(ctx, "pay")
	require.NoError(t, err)
	_, err = n.Reserve(ctx, testkit.ReserveReq("sealed-key-1", "exec-2"))
	require.ErrorContains(t, err, "namespace_seals")
	require.NoError(t, l.Close())

	// Touching the file (its change time moves) breaks the seal: the file
	// is opened and its own key lifetime read.
	mark()
	nsPath := sqlite.NamespacePath(path, "pay")
	now := time.Now()
	require.NoError(t, os.Chtimes(nsPath, now, now))
	l, _ = openLedger(t, path, 4, time.Hour)
	require.Equal(t, uint64(60_000), nsInfo(t, l, "pay").KeyTTL, "a touched file is checked, not trusted")
	require.NoError(t, l.Close())

	// A file replaced while ledgerd runs, before it was ever opened, is
	// not sealed at the stop: the next start checks and refuses it.
	older := filepath.Join(t.TempDir(), "older.db")
	copyFile(t, nsPath, older)
	reserveAndStop(t, path, "pay", "sealed-key-3")
	good := filepath.Join(t.TempDir(), "good.db")
	copyFile(t, nsPath, good)
	l, _ = openLedger(t, path, 4, time.Hour) // pay sealed at 2, not opened
	copyFile(t, older, nsPath)
	require.NoError(t, l.Close())
	_, err = sqlite.OpenStore(ctx, path, sqlite.Options{}, false)
	require.ErrorIs(t, err, ledger.ErrNamespaceLost, "the replaced file was not sealed")
	copyFile(t, good, nsPath)

	// A file put back from an older copy is refused, seal or not.
	copyFile(t, nsPath, older)
	reserveAndStop(t, path, "pay", "sealed-key-2")
	copyFile(t, older, nsPath)
	_, err = sqlite.OpenStore(ctx, path, sqlite.Options{}, false)
	require.ErrorIs(t, err, ledger.ErrNamespaceLost)
}

// copyFile copies the SQLite file from to to, over any file there (and
// removes to's write-ahead log).
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	if err := os.Remove(to + "-wal"); !errors.Is(err, os.ErrNotExist) {
		require.NoError(t, err)
	}
	require.NoError(t, os.WriteFile(to, b, 0o600))
}

// reserveAndStop opens the ledger at path, reserves key in namespace ns
// and stops cleanly.
func reserveAndStop(t *testing.T, path, ns, key string) {
	t.Helper()
	l, _ := openLedger(t, path, 4, time.Hour)
	n, err := l.NS(context.Background(), ns)
	require.NoError(t, err)
	_, err = n.Reserve(context.Background(), testkit.ReserveReq(key, "exec-1"))
	require.NoError(t, err)
	require.NoError(t, l.Close())
}
