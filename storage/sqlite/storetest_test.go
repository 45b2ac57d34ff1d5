package sqlite_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit/storetest"
)

// TestSQLiteStore_conformance runs the storage conformance suite against
// the SQLite driver (real files in a temp dir).
func TestSQLiteStore_conformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) ledger.Store {
		s, err := sqlite.OpenStore(context.Background(), filepath.Join(t.TempDir(), "ledger.db"),
			sqlite.Options{Now: now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, false)
		require.NoError(t, err)
		return s
	})
}

// TestSQLiteStore_secondWriterRefused: SQLite has one writer per file, so
// the replica cases do not apply; a second writer is refused.
func TestSQLiteStore_secondWriterRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	s, err := sqlite.OpenStore(context.Background(), path, sqlite.Options{}, false)
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	_, err = sqlite.OpenStore(context.Background(), path, sqlite.Options{}, false)
	require.Error(t, err)
}
