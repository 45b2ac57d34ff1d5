package postgres_test

import (
	"context"
	"testing"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/postgres"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// keyTTL reads the key_ttl_ms of namespace ns of s.
func keyTTL(t *testing.T, s *postgres.Store, ns string) uint64 {
	t.Helper()
	c, err := s.Chain(context.Background(), ns)
	if err != nil {
		t.Fatalf("chain %s: %v", ns, err)
	}
	ttl, err := c.KeyTTL(context.Background())
	if err != nil {
		t.Fatalf("key ttl of %s: %v", ns, err)
	}
	return ttl
}

// TestOpen_keyTTL: the default namespace takes Options.KeyTTL when Open
// creates the schema, a namespace its own at creation, and neither
// changes afterwards.
func TestOpen_keyTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	s := mustOpen(t, u, postgres.Options{Logger: quiet, KeyTTL: 86_400_000})
	if err := s.CreateNamespace(ctx, "reports", ledger.NamespaceSettings{KeyTTL: 60_000}); err != nil {
		t.Fatal(err)
	}
	again := mustOpen(t, u, postgres.Options{Logger: quiet, KeyTTL: 5})
	for ns, want := range map[string]uint64{ledger.DefaultNamespace: 86_400_000, "reports": 60_000} {
		if got := keyTTL(t, again, ns); got != want {
			t.Errorf("key_ttl_ms of %s = %d, want %d", ns, got, want)
		}
	}
	execErr(t, u, "", `UPDATE namespaces SET key_ttl_ms = 0 WHERE name = 'reports'`)
}

// TestOpen_migratesV1KeyTTL: a schema 1 database (no key_ttl_ms) is read
// as it is by a read-only store and migrated by a writer, its namespaces
// keeping keys forever.
func TestOpen_migratesV1KeyTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	s, err := postgres.Open(ctx, u, postgres.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateNamespace(ctx, "reports", ledger.NamespaceSettings{}); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	// Back to schema 1, as a database written before key lifetimes is.
	psql(t, u, `DROP TRIGGER namespaces_key_ttl_fixed ON namespaces`)
	psql(t, u, `DROP FUNCTION ledger_key_ttl_fixed()`)
	psql(t, u, `ALTER TABLE namespaces DROP COLUMN key_ttl_ms`)
	psql(t, u, `UPDATE schema_version SET version = 1`)

	ro := mustOpen(t, u, postgres.Options{Logger: quiet, ReadOnly: true})
	if got := keyTTL(t, ro, "reports"); got != 0 {
		t.Errorf("read-only on schema 1: key_ttl_ms = %d, want 0", got)
	}
	w := mustOpen(t, u, postgres.Options{Logger: quiet, KeyTTL: 1000})
	if v := schemaVersion(t, u); v != postgres.SchemaVersion {
		t.Errorf("schema version %d after migrating from 1, want %d", v, postgres.SchemaVersion)
	}
	for _, ns := range []string{ledger.DefaultNamespace, "reports"} {
		if got := keyTTL(t, w, ns); got != 0 {
			t.Errorf("migrated %s: key_ttl_ms = %d, want 0", ns, got)
		}
	}
	execErr(t, u, "", `UPDATE namespaces SET key_ttl_ms = 5`)
	again := mustOpen(t, u, postgres.Options{Logger: quiet})
	if got := keyTTL(t, again, "reports"); got != 0 {
		t.Errorf("after reopening: key_ttl_ms = %d, want 0", got)
	}
}
