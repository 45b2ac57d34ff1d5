package sqlite_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/verify"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// assertNewSchema checks that the database behind w has exactly the
// tables, views, indexes and triggers of a ledger file made new.
func assertNewSchema(t *testing.T, w *sql.DB) {
	t.Helper()
	schema := func(db *sql.DB) string {
		rows, err := db.Query(`SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_schema ORDER BY type, name`)
		require.NoError(t, err)
		defer rows.Close()
		var b strings.Builder
		for rows.Next() {
			var kind, name, table, text string
			require.NoError(t, rows.Scan(&kind, &name, &table, &text))
			b.WriteString(kind + " " + name + " " + table + " " + normalizeSpace(text) + "\n")
		}
		require.NoError(t, rows.Err())
		return b.String()
	}
	fresh := ledgertest.Open(t, ledgertest.WithPath(filepath.Join(t.TempDir(), "new.db")))
	nw, _ := fresh.Store.Pools()
	want := schema(nw)
	require.NoError(t, fresh.Close())
	assert.Equal(t, want, schema(w), "the migration makes the schema of a new file")
}

// v6Ledger copies testdata/v6.db — testdata/v5ns as ledgerd of schema 6
// (default in its own tables, alpha and beta in the shared ones) left it,
// with a signed checkpoint in each namespace — into a temp dir.
func v6Ledger(t *testing.T) string {
	b, err := os.ReadFile("testdata/v6.db")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "ledger.db")
	require.NoError(t, os.WriteFile(path, b, 0o644))
	return path
}

// TestOpen_migratesV6: a ledger of schema 6 opens with the default
// namespace moved into the shared tables as namespace 0 — every chain,
// checkpoint, key lifetime and open reservation as it was — and the
// schema of a new file; the view receipts is the default chain.
func TestOpen_migratesV6(t *testing.T) {
	ctx := context.Background()
	path := v6Ledger(t)
	sum := func() [32]byte {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		return sha256.Sum256(b)
	}
	before := sum()
	rd, err := sqlite.OpenReader(ctx, path, quiet)
	require.NoError(t, err, "a reader takes a version 6 file through a migrated copy")
	h, err := rd.ReadHead(ctx)
	require.NoError(t, err)
	assert.Equal(t, v5Heads["default"], formatHead(h))
	require.NoError(t, rd.Close())
	assert.Equal(t, before, sum(), "reading leaves the file byte for byte as it was")

	db := ledgertest.Open(t, ledgertest.WithPath(path))
	w, _ := db.Store.Pools()
	assertNewSchema(t, w)
	var version, n int
	require.NoError(t, w.QueryRow(`PRAGMA user_version`).Scan(&version))
	assert.Equal(t, sqlite.SchemaVersion, version)
	require.NoError(t, w.QueryRow(`SELECT count(*) FROM receipts`).Scan(&n))
	assert.Equal(t, 12, n, "the view receipts is the default chain")
	for ns, size := range map[string]int64{"default": 12, "alpha": 11, "beta": 11} {
		c, err := db.Store.Chain(ctx, ns)
		require.NoError(t, err)
		cp, err := c.LatestCheckpoint(ctx)
		require.NoError(t, err)
		require.NotNil(t, cp, ns)
		assert.Equal(t, size, cp.Size, "%s keeps its checkpoint", ns)
		tree, err := c.TreeSize(ctx)
		require.NoError(t, err)
		head, err := c.Head(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(head.Seq), tree, "%s has its whole tree", ns)
		ttl, err := c.KeyTTL(ctx)
		require.NoError(t, err)
		assert.Equal(t, map[string]uint64{"default": 0, "alpha": 0, "beta": 3_600_000}[ns], ttl, ns)
	}
	for ns, token := range v5Tokens {
		n, err := db.Ledger.NS(ctx, ns)
		require.NoError(t, err)
		h, err := n.Head(ctx)
		require.NoError(t, err)
		assert.Equal(t, v5Heads[ns], formatHead(h), ns)
		_, err = n.Commit(ctx, ledger.CommitRequest{IdempotencyKey: ns + "-open-0001", Reservation: token, Outcome: "succeeded"})
		require.NoError(t, err, "%s: the reservation made before the migration commits with its token", ns)
		rep, err := verify.New(chainOf(t, db.Store, ns), verify.Opts{}).Check(ctx)
		require.NoError(t, err)
		assert.True(t, rep.OK, "%s: %+v", ns, rep.Violations)
	}
	require.NoError(t, db.Close())
	db = ledgertest.Open(t, ledgertest.WithPath(path))
	assert.Equal(t, uint64(13), db.Head().Seq, "a migrated file opens again as it is")
	require.NoError(t, db.Close())
}

// TestOpen_migrationRefusesBrokenChain: a schema 6 file whose default
// chain has a gap is refused, and left as it was.
func TestOpen_migrationRefusesBrokenChain(t *testing.T) {
	path := v6Ledger(t)
	execFile(t, path, `DROP TRIGGER receipts_no_delete; DELETE FROM receipts WHERE seq = 5`)
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	_, err = ledgertest.TryOpen(t, ledgertest.WithPath(path))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nothing was changed")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, before, after)
}

// TestOpenTokens_migratesOlderFile: a token made on a ledger of schema 6
// is kept: the file is migrated in place first, under its lock.
func TestOpenTokens_migratesOlderFile(t *testing.T) {
	ctx := context.Background()
	path := v6Ledger(t)
	tk, err := sqlite.OpenTokens(ctx, path)
	require.NoError(t, err)
	_, err = tk.Create(ctx, "probe", "reader")
	require.NoError(t, err)
	require.NoError(t, tk.Close())
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	var version, n int
	require.NoError(t, db.QueryRow(`PRAGMA user_version`).Scan(&version))
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM tokens WHERE name = 'probe'`).Scan(&n))
	assert.Equal(t, sqlite.SchemaVersion, version)
	assert.Equal(t, 1, n, "the token is in the ledger file")
}

// v5Ledger copies testdata/v5ns — a ledger that ledgerd v0.4.0 (schema 5,
// a file per namespace) wrote over HTTP and stopped cleanly: default,
// alpha and beta (key lifetime 1 h), each with successes, failures, a
// replay and one open reservation — into a temp dir.
func v5Ledger(t *testing.T) string {
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "ledger.db.ns"), 0o755))
	for _, f := range []string{"ledger.db", "ledger.db.ns/ns-alpha.db", "ledger.db.ns/ns-beta.db"} {
		b, err := os.ReadFile(filepath.Join("testdata/v5ns", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	return filepath.Join(dir, "ledger.db")
}

// The open reservations' tokens in testdata/v5ns, and the heads.
var v5Tokens = map[string]string{
	"default": "rsv_5a295254c4f9e154832792dbd3c758104db97634f1e7cb4f8f7a5160ac10e94b",
	"alpha":   "rsv_3b6019197c84aada92c0e676274b5143d3959bbe06e4dfca1d6d499138ca2376",
	"beta":    "rsv_95d579884c3915ab69b55b64ae6a323530e2134b33fccd657620616672ea7ea3",
}

var v5Heads = map[string]string{
	"default": "12:537aec25e9ccdd6eba8449294e27a6e97734ef26e9c001f85d099e4b1a586a3f",
	"alpha":   "11:4fca1515cf7aee4bc3417140ad2c87f9cc1867070ae1d36b54dd25ff75eab7f3",
	"beta":    "11:0b3babfb1e69bad2371c4339e4c32250578e067497ac7c2926b8a77e4a9b591b",
}

// TestStore_migratesNamespaceFiles: a ledger of the layout with a file per
// namespace opens with every namespace moved into the ledger file — same
// chains, same key lifetimes, open reservations still committable with
// their tokens, the key index right — and its files set aside as
// .migrated; the next open has nothing to move.
func TestStore_migratesNamespaceFiles(t *testing.T) {
	ctx := context.Background()
	path := v5Ledger(t)
	for round := range 2 {
		db := ledgertest.Open(t, ledgertest.WithPath(path))
		for _, ns := range []string{"default", "alpha", "beta"} {
			n, err := db.Ledger.NS(ctx, ns)
			require.NoError(t, err)
			h, err := n.Head(ctx)
			require.NoError(t, err)
			want := v5Heads[ns]
			if round == 1 {
				want = "" // moved on by the commits of round 0
			}
			if want != "" {
				assert.Equal(t, want, formatHead(h), ns)
			}
			if ns != ledger.DefaultNamespace {
				assert.NoFileExists(t, filepath.Join(path+".ns", "ns-"+ns+".db"), "moved into the ledger file")
				assert.FileExists(t, filepath.Join(path+".ns", "ns-"+ns+".db")+".migrated", "set aside, not deleted")
			}
			if round == 0 {
				// A replay of a key committed before the move.
				r, err := n.Reserve(ctx, ledger.ReserveRequest{IdempotencyKey: ns + "-order-0000", ExecutionID: "e3",
					Tool: "payments.refund", Effect: "write", Input: []byte(`{"order":0}`)})
				require.NoError(t, err, ns)
				assert.Equal(t, ledger.StatusReplayed, r.Status, ns)
				c, err := n.Commit(ctx, ledger.CommitRequest{IdempotencyKey: ns + "-open-0001", Reservation: v5Tokens[ns], Outcome: "succeeded"})
				require.NoError(t, err, "%s: the reservation made before the move commits with its token", ns)
				assert.NotZero(t, c.Receipt.Seq)
			}
			rep, err := verify.New(chainOf(t, db.Store, ns), verify.Opts{}).Check(ctx)
			require.NoError(t, err)
			assert.True(t, rep.OK, "%s: %+v", ns, rep.Violations)
		}
		ttls := map[string]uint64{}
		list, err := db.Ledger.Namespaces(ctx)
		require.NoError(t, err)
		for _, n := range list {
			ttls[n.Name] = n.KeyTTL
		}
		assert.Equal(t, map[string]uint64{"default": 0, "alpha": 0, "beta": 3_600_000}, ttls)
		require.NoError(t, db.Close())
		if round == 0 {
			// A crash after the move's COMMIT, before the rename: the next
			// start only sets the file aside again.
			require.NoError(t, os.Rename(filepath.Join(path+".ns", "ns-"+"alpha"+".db")+".migrated", filepath.Join(path+".ns", "ns-"+"alpha"+".db")))
		}
	}
}

// chainOf opens namespace ns of st's ledger file read-only, as ledgerctl
// verify does.
func chainOf(t *testing.T, st *sqlite.Store, ns string) verify.DB {
	ro, err := sqlite.OpenStore(context.Background(), st.Path(), sqlite.Options{}, true)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ro.Close() })
	c, err := ro.Chain(context.Background(), ns)
	require.NoError(t, err)
	return c.(verify.DB)
}

func formatHead(h ledger.Head) string { return strconv.FormatUint(h.Seq, 10) + ":" + h.Hash.String() }

// TestSchema_versionStamped: schema.sql stamps the version the driver
// serves, and the repository's top-level schema.sql is that file.
func TestSchema_versionStamped(t *testing.T) {
	raw, err := os.ReadFile("schema.sql")
	require.NoError(t, err)
	assert.Contains(t, string(raw), fmt.Sprintf("\nPRAGMA user_version = %d;", sqlite.SchemaVersion))
	top, err := os.ReadFile("../../schema.sql")
	require.NoError(t, err)
	assert.True(t, strings.EqualFold(string(top), string(raw)), "the top-level schema.sql is the driver's")
}

// TestOpen_migratesV7KeyTTL: a ledger of schema 7 — made by ledgerd of schema 7
// with --default-key-ttl 2h and a namespace beta with --key-ttl 1h, a key
// committed and one left open in each (testdata/v7-keyttl.db) — opens with the
// schema of a new file, every key lifetime as it was (default's too),
// every namespace inline (SPEC §14: a ledger made before v1.4 keeps its
// payloads in its receipts), its open reservations committable with their
// tokens, and verifies.
func TestOpen_migratesV7KeyTTL(t *testing.T) {
	ctx := context.Background()
	b, err := os.ReadFile("testdata/v7-keyttl.db")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "ledger.db")
	require.NoError(t, os.WriteFile(path, b, 0o644))

	db := ledgertest.Open(t, ledgertest.WithPath(path))
	w, _ := db.Store.Pools()
	assertNewSchema(t, w)
	list, err := db.Ledger.Namespaces(ctx)
	require.NoError(t, err)
	got := map[string]string{}
	for _, n := range list {
		got[n.Name] = fmt.Sprintf("%d %s %d", n.KeyTTL, n.Payloads, n.Head.Seq)
	}
	assert.Equal(t, map[string]string{"default": "7200000 inline 3", "beta": "3600000 inline 3"}, got)
	for ns, token := range map[string]string{
		"default": "rsv_06cf757a970bd9569abf97332f2ebe0942e78023bb6db00006faa20d6ce6fb9f",
		"beta":    "rsv_28f70ff8a53ecf227b8158c488afb62ed06772800c4bb3c72ff677a49e59cfdc",
	} {
		n, err := db.Ledger.NS(ctx, ns)
		require.NoError(t, err)
		r, err := n.Reserve(ctx, ledger.ReserveRequest{IdempotencyKey: "order-0000001", ExecutionID: "e2",
			Tool: "payments.refund", Effect: "write", Input: []byte(`{"order":1}`)})
		require.NoError(t, err, ns)
		assert.Equal(t, ledger.StatusReplayed, r.Status, ns)
		assert.Equal(t, `{"ok":true}`, r.Result, ns)
		_, err = n.Commit(ctx, ledger.CommitRequest{IdempotencyKey: "open-0000001", Reservation: token, Outcome: "succeeded"})
		require.NoError(t, err, "%s: the reservation made before the migration commits with its token", ns)
		rep, err := verify.New(chainOf(t, db.Store, ns), verify.Opts{}).Check(ctx)
		require.NoError(t, err)
		assert.True(t, rep.OK, "%s: %+v", ns, rep.Violations)
	}
	require.NoError(t, db.Close())
}

// TestOpen_migratesV7: testdata/v7.db — what ledgerd of schema 7 wrote
// over HTTP (a charge committed, another reserved with a 10 ms lease) and
// left at a clean stop — opens as schema 8, its chain as it was, and
// takes the kinds of contract v1.4: a reconcile (SPEC §15) of the
// interrupted charge, which verifies.
func TestOpen_migratesV7(t *testing.T) {
	ctx := context.Background()
	b, err := os.ReadFile("testdata/v7.db")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "ledger.db")
	require.NoError(t, os.WriteFile(path, b, 0o644))
	db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithNow(time.Now))
	w, _ := db.Store.Pools()
	assertNewSchema(t, w)
	var version int
	require.NoError(t, w.QueryRow(`PRAGMA user_version`).Scan(&version))
	assert.Equal(t, sqlite.SchemaVersion, version)
	assert.Equal(t, "3:07675b2d2ceb71a6511493f141ec18fa2099a49eb78dba643868ad97d465ffd0", formatHead(db.Head()))
	n, err := db.Ledger.NS(ctx, ledger.DefaultNamespace)
	require.NoError(t, err)
	_, err = n.SetPolicy(ctx, json.RawMessage(`{"rules":[{"tool":"payments.*","reconcile":{"allow":true}}]}`), "")
	require.NoError(t, err)
	res, err := n.Reconcile(ctx, ledger.ReconcileRequest{IdempotencyKey: "pay-key-0002", Outcome: "succeeded",
		ExternalRef: "ch_2", Evidence: json.RawMessage(`{"lookup":"payments.find_charge","answer":{"applied":true}}`)})
	require.NoError(t, err)
	assert.Equal(t, ledger.StateSucceeded, res.State)
	rep, err := verify.New(chainOf(t, db.Store, ledger.DefaultNamespace), verify.Opts{}).Check(ctx)
	require.NoError(t, err)
	assert.True(t, rep.OK, "%+v", rep.Violations)
	assert.Len(t, rep.Audit.Reconciliations, 1)
}

// TestOpen_addsSideTables: a file of schema 8 made before the side tables
// that schema gained (the subject index, the pending erasure marks, the
// tokens of reconciled reservations) opens with the schema of a new file,
// and the original call's commit after a not_applied reconcile and the
// key's rerun is appended on it (SPEC §15) and verifies.
func TestOpen_addsSideTables(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	require.NoError(t, ledgertest.Open(t, ledgertest.WithPath(path)).Close())
	raw, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	for _, table := range []string{"ns_subjects", "ns_pending_erasures", "ns_reconciled_tokens", "ns_erasure_subjects"} {
		_, err := raw.Exec(`DROP TABLE ` + table)
		require.NoError(t, err)
	}
	require.NoError(t, raw.Close())

	// Read as it is, such a file has no erased subjects and no pending marks.
	ro, err := sqlite.OpenStore(ctx, path, sqlite.Options{Logger: ledgertest.Quiet}, true)
	require.NoError(t, err)
	c, err := ro.Chain(ctx, ledger.DefaultNamespace)
	require.NoError(t, err)
	require.NoError(t, c.Erasures(ctx, func(*ledger.Erasure) error { return nil }))
	require.NoError(t, c.PendingErasures(ctx, func(*ledger.PendingErase) error { return nil }))
	require.NoError(t, ro.Close())

	db := ledgertest.Open(t, ledgertest.WithPath(path))
	w, _ := db.Store.Pools()
	assertNewSchema(t, w)
	_, err = db.SetPolicy(ctx, json.RawMessage(`{"rules":[{"tool":"payments.*","reconcile":{"allow":true,"settle_ms":0}}]}`), "")
	require.NoError(t, err)
	reserve := func(exec string, leaseMS int64) *ledger.ReserveResult {
		r, err := db.Reserve(ctx, ledger.ReserveRequest{IdempotencyKey: "pay-key-0001", ExecutionID: exec,
			Tool: "payments.charge", Effect: "external", Input: []byte(`{"order":1}`), LeaseMS: &leaseMS})
		require.NoError(t, err)
		require.Equal(t, ledger.StatusReserved, r.Status)
		return r
	}
	original := reserve("e1", 10)
	db.Clock.Advance(time.Second)
	_, err = db.Reconcile(ctx, ledger.ReconcileRequest{IdempotencyKey: "pay-key-0001", Outcome: "not_applied",
		Error: &ledger.FailureDetail{Code: "NOT_FOUND"}, Evidence: json.RawMessage(`{"lookup":"payments.find_charge","answer":{}}`)})
	require.NoError(t, err)
	rerun := reserve("e2", 60_000)
	_, err = db.Commit(ctx, ledger.CommitRequest{IdempotencyKey: "pay-key-0001", Reservation: rerun.Reservation,
		Outcome: "succeeded", ExternalRef: "ch_2"})
	require.NoError(t, err)
	late, err := db.Commit(ctx, ledger.CommitRequest{IdempotencyKey: "pay-key-0001", Reservation: original.Reservation,
		Outcome: "succeeded", ExternalRef: "ch_1"})
	require.NoError(t, err, "the original call's commit after the rerun")
	require.NotNil(t, late.ReconciledEarlier)
	rep, err := verify.New(chainOf(t, db.Store, ledger.DefaultNamespace), verify.Opts{Now: db.Clock.Now}).Check(ctx)
	require.NoError(t, err)
	assert.True(t, rep.OK, "%+v", rep.Violations)
	assert.Len(t, rep.Audit.ReconcileContradicted, 1)
	require.NoError(t, db.Close())
}
