package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/postgres"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// TestChain_namespacesCommitInParallel: a transaction holding namespace
// a's head row does not hold up a write to namespace b (one head row per
// namespace), while a write to a waits for it.
func TestChain_namespacesCommitInParallel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	s := mustOpen(t, u, postgres.Options{})
	for _, ns := range []string{"a", "b"} {
		if err := s.CreateNamespace(ctx, ns, ledger.NamespaceSettings{}); err != nil {
			t.Fatal(err)
		}
	}
	holder := connect(t, u)
	defer func() { _ = holder.Close(ctx) }()
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM head WHERE namespace = 'a' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	write := func(ns, key string) chan error {
		done := make(chan error, 1)
		go func() {
			done <- mustChain(t, s, ns).Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
				return reserveKey(ctx, tx, key, "e")
			})
		}()
		return done
	}
	toA := write("a", "key-a-0001")
	select {
	case err := <-write("b", "key-b-0001"):
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("namespace b waited for a transaction holding namespace a's head")
	}
	// a's write waits for the lock: the server shows a session of this
	// database waiting for one. It is watched from a connection outside
	// holder's transaction, in which pg_stat_activity would stay the
	// snapshot of its first read.
	watch := connect(t, u)
	defer func() { _ = watch.Close(ctx) }()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		if len(toA) > 0 {
			return // a's write returned: refused below
		}
		var waiting int
		if assert.NoError(c, watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)) {
			assert.Positive(c, waiting, "namespace a's write neither waits for the lock nor returns")
		}
	}, 60*time.Second, 5*time.Millisecond)
	select {
	case err := <-toA:
		t.Fatalf("namespace a's write did not wait for the lock on its head: %v", err)
	default:
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-toA:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("namespace a's write never went through")
	}
	for _, ns := range []string{"a", "b"} {
		h, err := mustChain(t, s, ns).Head(ctx)
		if err != nil || h.Seq != 1 {
			t.Fatalf("%s: head %d, %v", ns, h.Seq, err)
		}
	}
}
