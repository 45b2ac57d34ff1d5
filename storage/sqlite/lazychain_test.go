package sqlite_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// openLedger opens the ledger at path with at most maxOpen namespaces
// open.
func openLedger(tb testing.TB, path string, maxOpen int) (*ledger.Ledger, *sqlite.Store) {
	tb.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := sqlite.OpenStore(context.Background(), path, sqlite.Options{Logger: quiet, MaxOpenNamespaces: maxOpen}, false)
	require.NoError(tb, err)
	l := ledger.New(st, ledger.Config{Logger: quiet})
	return l, st
}

// TestStore_openFilesBounded: with more namespaces in use than
// MaxOpenNamespaces, the least recently used files are closed and reopened on
// use; every write stays, heads are exact while closed and after a
// restart, and the registry records each head.
func TestStore_openFilesBounded(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	l, st := openLedger(t, path, 2)
	const spaces = 6
	for i := range spaces {
		require.NoError(t, l.CreateNamespace(ctx, fmt.Sprintf("ns%d", i), ledger.NamespaceSettings{}))
	}
	assert.Zero(t, st.OpenNamespaces(), "creating a namespace leaves its file closed")
	for round := range 3 {
		for i := range spaces {
			n, err := l.NS(ctx, fmt.Sprintf("ns%d", i))
			require.NoError(t, err)
			_, err = n.Reserve(ctx, testkit.ReserveReq(fmt.Sprintf("key-%d-%d-abcdef", round, i), "exec-1"))
			require.NoError(t, err)
			assert.LessOrEqual(t, st.OpenNamespaces(), 2)
		}
	}
	infos, err := l.Namespaces(ctx)
	require.NoError(t, err)
	for _, info := range infos {
		if info.Name != ledger.DefaultNamespace {
			assert.Equal(t, uint64(3), info.Head.Seq, info.Name)
		}
	}
	require.NoError(t, l.Close())

	l, st = openLedger(t, path, 2)
	defer func() { _ = l.Close() }()
	infos2, err := l.Namespaces(ctx)
	require.NoError(t, err)
	assert.Equal(t, infos, infos2, "heads after a restart, without opening the files")
	assert.Zero(t, st.OpenNamespaces())
	n, err := l.NS(ctx, "ns0")
	require.NoError(t, err)
	_, err = n.Reserve(ctx, testkit.ReserveReq("key-0-0-abcdef", "exec-2"))
	assert.Equal(t, ledger.ECodeInProgress, ledger.ErrorCode(err), "a reopened file still knows its keys: %v", err)
}

// TestStore_closeWhileRecording: closing the store while its loop records
// namespace heads (every millisecond here) never deadlocks.
func TestStore_closeWhileRecording(t *testing.T) {
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := range 50 {
		path := filepath.Join(t.TempDir(), "ledger.db")
		st, err := sqlite.OpenStore(ctx, path, sqlite.Options{Logger: quiet, HeadRecordEvery: time.Millisecond}, false)
		require.NoError(t, err)
		l := ledger.New(st, ledger.Config{Logger: quiet})
		require.NoError(t, l.CreateNamespace(ctx, "a", ledger.NamespaceSettings{}))
		n, err := l.NS(ctx, "a")
		require.NoError(t, err)
		_, err = n.Reserve(ctx, testkit.ReserveReq(fmt.Sprintf("close-key-%04d", i), "exec-1"))
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- l.Close() }()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("Close did not return: a deadlock with the head-recording loop")
		}
	}
}
