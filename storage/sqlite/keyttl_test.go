package sqlite_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/verify"
)

// TestOpen_migratesV2 opens a file written by the version 2 schema
// (testdata/v2.db, made by ledgerd before key lifetimes: report-2025-11-30
// succeeded, charge-order-77 failed retryably, both at testkit.T0) and
// checks it is migrated in place to a ledger whose keys never expire.
func TestOpen_migratesV2(t *testing.T) {
	src, err := os.ReadFile("testdata/v2.db")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "v2.db")
	require.NoError(t, os.WriteFile(path, src, 0o644))

	rd, err := sqlite.OpenReader(context.Background(), path, quiet)
	require.NoError(t, err, "a reader takes a version 2 file as it is")
	ttl, err := rd.KeyTTL(context.Background())
	require.NoError(t, err)
	assert.Zero(t, ttl)
	require.NoError(t, rd.Close())

	opts := quiet
	opts.KeyTTL = 1000 // applies only to a file this open creates
	opts.Now = func() time.Time { return time.UnixMilli(testkit.T0).Add(365 * 24 * time.Hour) }
	db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithStore(opts))
	assert.Equal(t, uint64(4), db.Head().Seq)
	w, _ := db.Store.Pools()
	var version int
	require.NoError(t, w.QueryRow(`PRAGMA user_version`).Scan(&version))
	assert.Equal(t, sqlite.SchemaVersion, version)
	assert.Zero(t, db.KeyTTL(), "a migrated file keeps keys forever")
	assertNewSchema(t, w)
	ledgertest.VerifyChain(t, db)

	rp := ledgertest.MustReserve(t, db, ledger.ReserveRequest{IdempotencyKey: "report-2025-11-30", ExecutionID: "exec-9",
		Tool: "reports.send", Effect: chain.EffectExternal, Input: json.RawMessage(`{"day":"2025-11-30"}`)})
	assert.Equal(t, ledger.StatusReplayed, rp.Status, "a year later the key is still remembered")
	retry := ledgertest.MustReserve(t, db, ledger.ReserveRequest{IdempotencyKey: "charge-order-77", ExecutionID: "exec-2", Attempt: i64(2),
		Tool: "payments.charge", Effect: chain.EffectWrite, Idempotent: true})
	assert.True(t, retry.Retry)
	require.NoError(t, db.Close())

	db2, err := ledgertest.TryOpen(t, ledgertest.WithPath(path))
	require.NoError(t, err, "a migrated file opens again")
	assert.Equal(t, uint64(6), db2.Head().Seq)
	require.NoError(t, db2.Close())
}

func normalizeSpace(s string) string {
	out := make([]byte, 0, len(s))
	space := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t', '\n':
			space = true
		default:
			if space && len(out) > 0 {
				out = append(out, ' ')
			}
			space = false
			out = append(out, c)
		}
	}
	return string(out)
}

// TestOpen_keyTTL: the key lifetime is stored in the file that is created
// with it, kept when the file is opened with another, refused as an edit,
// and stored in a namespace's own file.
func TestOpen_keyTTL(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	opts := quiet
	opts.KeyTTL = 86_400_000
	db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithStore(opts))
	assert.Equal(t, uint64(86_400_000), db.KeyTTL())
	w, _ := db.Store.Pools()
	_, err := w.Exec(`UPDATE ns_settings SET key_ttl_ms = 0`)
	require.Error(t, err, "the settings are fixed at creation")
	require.NoError(t, db.Ledger.CreateNamespace(ctx, "mail", ledger.NamespaceSettings{KeyTTL: 3_600_000}))
	require.NoError(t, db.Close())

	require.NoError(t, sqlite.CreateNamespace(ctx, path, "reports", ledger.NamespaceSettings{KeyTTL: 60_000}), "ledgerctl's way, beside the file")
	opts.KeyTTL = 5
	db = ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithStore(opts))
	assert.Equal(t, uint64(86_400_000), db.KeyTTL(), "an existing file keeps its own")
	list, err := db.Ledger.Namespaces(ctx)
	require.NoError(t, err)
	got := map[string]uint64{}
	for _, n := range list {
		got[n.Name] = n.KeyTTL
	}
	assert.Equal(t, map[string]uint64{"default": 86_400_000, "mail": 3_600_000, "reports": 60_000}, got)
	require.NoError(t, db.Close())

	st, err := sqlite.OpenStore(ctx, path, quiet, true)
	require.NoError(t, err)
	defer st.Close()
	c, err := st.Chain(ctx, "mail")
	require.NoError(t, err)
	ttl, err := c.(interface {
		KeyTTL(context.Context) (uint64, error)
	}).KeyTTL(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(3_600_000), ttl, "an offline verifier reads it from the ledger file")
}

// TestStore_RebuildIndex_generations: rebuilding the key index from the
// receipts gives each renewed key its current generation, as the writer
// recorded it, and the verifier agrees in all its strategies.
func TestStore_RebuildIndex_generations(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithStore(sqlite.Options{KeyTTL: 60_000}))
	clock := db.Clock
	req := func(key, exec, input string, idem bool) ledger.ReserveRequest {
		return ledger.ReserveRequest{IdempotencyKey: key, ExecutionID: exec, Tool: "reports.send",
			Effect: chain.EffectExternal, Idempotent: idem, Input: json.RawMessage(input)}
	}
	r := ledgertest.MustReserve(t, db, req("succeeded-key", "exec-1", `{"day":1}`, false))
	ledgertest.MustCommit(t, db, testkit.Succeed("succeeded-key", r.Reservation))
	ledgertest.MustReserve(t, db, req("succeeded-key", "exec-2", `{"day":1}`, false)) // replay
	r = ledgertest.MustReserve(t, db, req("failed-key", "exec-1", `{"day":1}`, true))
	ledgertest.MustCommit(t, db, testkit.Fail("failed-key", r.Reservation, true))
	second := req("failed-key", "exec-1", `{"day":1}`, true)
	second.Attempt = i64(2)
	r = ledgertest.MustReserve(t, db, second)
	ledgertest.MustCommit(t, db, testkit.Fail("failed-key", r.Reservation, true))
	clock.Advance(time.Minute)
	r = ledgertest.MustReserve(t, db, req("succeeded-key", "exec-3", `{"day":2}`, false))
	require.NotNil(t, r.Renewed)
	r = ledgertest.MustReserve(t, db, req("failed-key", "exec-1", `{"day":2}`, true))
	require.NotNil(t, r.Renewed)
	ledgertest.MustCommit(t, db, testkit.Succeed("failed-key", r.Reservation))
	before := indexRecords(t, db)
	for _, k := range before {
		drift, err := mainChain(t, db).KeyDrift(ctx, k.Key)
		require.NoError(t, err)
		assert.Empty(t, drift, "the derived record of %s matches the writer's", k.Key)
	}
	require.NoError(t, db.RebuildIndex(ctx))
	assert.Equal(t, before, indexRecords(t, db))
	require.NoError(t, db.Close())

	rd, err := sqlite.OpenReader(ctx, path, quiet)
	require.NoError(t, err)
	defer rd.Close()
	rep, err := verify.New(rd, verify.Opts{Now: clock.Now}).Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep.Violations)
	assert.Len(t, rep.Audit.RenewedKeys, 2)
}
