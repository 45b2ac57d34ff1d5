package postgres_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/postgres"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
	"github.com/effect-ledger/effect-ledger/testkit/storetest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestStore_conformance runs the storage conformance suite against the
// PostgreSQL driver, a fresh database per case.
func TestStore_conformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T, now func() time.Time) ledger.Store {
		return mustOpen(t, pgtest.URL(t), postgres.Options{Now: now, Logger: quiet})
	})
}

// TestStore_conformanceReplicas runs the cases of two writers (two
// replicas) on one database.
func TestStore_conformanceReplicas(t *testing.T) {
	t.Parallel()
	storetest.RunReplicas(t, func(t *testing.T, now func() time.Time) (ledger.Store, ledger.Store) {
		u := pgtest.URL(t)
		return mustOpen(t, u, postgres.Options{Now: now, Logger: quiet}),
			mustOpen(t, u, postgres.Options{Now: now, Logger: quiet})
	})
}
