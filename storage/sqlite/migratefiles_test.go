package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/verify"
)

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
