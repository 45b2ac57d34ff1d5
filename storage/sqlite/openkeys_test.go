package sqlite_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/storetest"
)

// TestStore_OpenKeys: the count of open keys follows the receipts of
// namespaces whose files the Store closed (more namespaces than
// MaxOpenNamespaces) and is rebuilt from the chains after a restart, so a key
// interrupted before the restart is counted without any write to its
// namespace.
func TestStore_OpenKeys(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	clock := testkit.NewClock()
	open := func() (*ledger.Ledger, *sqlite.Store) {
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		st, err := sqlite.OpenStore(ctx, path, sqlite.Options{Logger: quiet, MaxOpenNamespaces: 2, Now: clock.Now}, false)
		require.NoError(t, err)
		return ledger.New(st, ledger.Config{Logger: quiet, Now: clock.Now}), st
	}
	l, st := open()
	const spaces = 4
	want := map[string]int{}
	for i := range spaces {
		name := fmt.Sprintf("ns%d", i)
		require.NoError(t, l.CreateNamespace(ctx, name, ledger.NamespaceSettings{}))
		want[name+"/reserved/not-idempotent"] = 1
	}
	require.Empty(t, storetest.OpenKeys(t, st))
	for round := range 2 {
		for i := range spaces {
			n, err := l.NS(ctx, fmt.Sprintf("ns%d", i))
			require.NoError(t, err)
			r := testkit.ReserveReq(fmt.Sprintf("key-%d-%d-abcdef", round, i), "exec-1")
			r.LeaseMS = i64(1000)
			res, err := n.Reserve(ctx, r)
			require.NoError(t, err)
			if round == 0 {
				_, err = n.Commit(ctx, testkit.Succeed(r.IdempotencyKey, res.Reservation))
				require.NoError(t, err)
			}
		}
		if round == 0 {
			require.Empty(t, storetest.OpenKeys(t, st), "every key of round 0 committed")
		}
	}
	require.LessOrEqual(t, st.OpenNamespaces(), 2)
	require.Equal(t, want, storetest.OpenKeys(t, st), "closed files' receipts are read too")
	require.NoError(t, l.Close())

	clock.Advance(2 * time.Second)
	l, st = open()
	defer func() { _ = l.Close() }()
	want = map[string]int{}
	for i := range spaces {
		want[fmt.Sprintf("ns%d/interrupted/not-idempotent", i)] = 1
	}
	require.Equal(t, want, storetest.OpenKeys(t, st), "after a restart, from the chains")
	n, err := l.NS(ctx, "ns2")
	require.NoError(t, err)
	_, err = n.Resolve(ctx, ledger.ResolveRequest{IdempotencyKey: "key-1-2-abcdef", Outcome: "succeeded",
		Note: "checked", Actor: "ops"})
	require.NoError(t, err)
	delete(want, "ns2/interrupted/not-idempotent")
	require.Equal(t, want, storetest.OpenKeys(t, st))
}
