package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/storage/postgres"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// TestStore_OpenKeysIndex: the count of open keys can read the partial
// index keys_open (its predicate is the query's), and a database made
// without the index gets it at the next writable open.
func TestStore_OpenKeysIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	s := mustOpen(t, u, postgres.Options{Logger: quiet})
	_, err := s.OpenKeys(ctx)
	require.NoError(t, err)
	plan := func() string {
		conn, err := pgx.Connect(ctx, u)
		require.NoError(t, err)
		defer func() { _ = conn.Close(ctx) }()
		_, err = conn.Exec(ctx, `SET enable_seqscan = off`)
		require.NoError(t, err)
		rows, err := conn.Query(ctx, `EXPLAIN `+postgres.SQLOpenKeys, nil)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(lines, "\n")
	}
	require.Contains(t, plan(), "keys_open")

	psql(t, u, `DROP INDEX keys_open`)
	require.NotContains(t, plan(), "keys_open")
	mustOpen(t, u, postgres.Options{Logger: quiet, ReadOnly: true})
	require.NotContains(t, plan(), "keys_open", "a read-only open creates nothing")
	mustOpen(t, u, postgres.Options{Logger: quiet})
	require.Contains(t, plan(), "keys_open", "made again by a writable open")
}
