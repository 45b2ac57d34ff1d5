package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestIndex_applyFails: when the index apply of a committed batch fails,
// the namespace answers unavailable rather than deciding from an index
// that lacks a committed receipt; once the index takes writes again, the
// next write replays what it lacked first, and the committed key is
// replayed.
func TestIndex_applyFails(t *testing.T) {
	ctx := context.Background()
	defer sqlite.SetIndexRetry(0, 0)() // retry at once
	db := ledgertest.Open(t)
	var fail atomic.Bool
	db.Store.SetIndexFault(func() error {
		if fail.Load() {
			return errors.New("disk says no")
		}
		return nil
	})
	res := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-aaaa-0001", "exec-1"))
	fail.Store(true)
	_, err := db.Commit(ctx, testkit.Succeed("key-aaaa-0001", res.Reservation))
	require.NoError(t, err, "the commit is durable: its answer stands")

	_, err = db.Reserve(ctx, testkit.ReserveReq("key-aaaa-0001", "exec-2"))
	require.ErrorIs(t, err, ledger.ErrUnavailable, "no decision from an index that lacks a committed receipt")
	_, err = db.Reserve(ctx, testkit.ReserveReq("key-bbbb-0002", "exec-3"))
	require.ErrorIs(t, err, ledger.ErrUnavailable)
	_, err = db.GetKey(ctx, "key-aaaa-0001")
	require.ErrorIs(t, err, ledger.ErrUnavailable, "no read of an outdated state either")

	fail.Store(false)
	again := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-aaaa-0001", "exec-2"))
	assert.Equal(t, ledger.StatusReplayed, again.Status)
	v, err := db.GetKey(ctx, "key-aaaa-0001")
	require.NoError(t, err)
	assert.Equal(t, ledger.StateSucceeded, v.State)
}

// TestIndex_metrics: the key index's memory and size are exported while
// a Store holds it.
func TestIndex_metrics(t *testing.T) {
	db := ledgertest.Open(t)
	ledgertest.MustReserve(t, db, testkit.ReserveReq("key-aaaa-0001", "exec-1"))
	families, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "ledger_key_index_") {
			got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	assert.Greater(t, got["ledger_key_index_memory_bytes"], 0.0)
	assert.Greater(t, got["ledger_key_index_disk_bytes"], 0.0)
}

// diskFull is an IndexWriteFault that fails every write of the key
// index's files with ENOSPC while it is set.
type diskFull struct{ on atomic.Bool }

func (d *diskFull) fault() error {
	if d.on.Load() {
		return syscall.ENOSPC
	}
	return nil
}

// TestIndex_diskFull: when the disk under the key index fills up, no
// acknowledged receipt is lost and nothing panics: the batch that met the
// full disk stands (it is durable in the ledger file), then writes, key
// reads and Ready answer unavailable, without a replay (nor a log line)
// a request, until the disk has room again; then the index is replayed
// by itself and the committed key is replayed, never reserved again.
func TestIndex_diskFull(t *testing.T) {
	ctx := context.Background()
	defer sqlite.SetIndexRetry(50*time.Millisecond, 200*time.Millisecond)()
	var full diskFull
	logs := &testkit.Buffer{}
	db := ledgertest.Open(t, ledgertest.WithStore(sqlite.Options{Logger: slog.New(slog.NewJSONHandler(logs, nil)), IndexWriteFault: full.fault, HeadRecordEvery: 20 * time.Millisecond}))
	res := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-aaaa-0001", "exec-1"))

	full.on.Store(true)
	var acked []string
	var err error
	for i := 0; err == nil && i < 5000; i++ { // Pebble buffers its log: writes succeed until it meets the disk
		k := fmt.Sprintf("key-full-%06d", i)
		if _, err = db.Reserve(ctx, testkit.ReserveReq(k, "exec-2")); err == nil {
			acked = append(acked, k)
		}
	}
	require.ErrorIs(t, err, ledger.ErrUnavailable)
	_, err = db.Commit(ctx, testkit.Succeed("key-aaaa-0001", res.Reservation))
	require.ErrorIs(t, err, ledger.ErrUnavailable, "no decision from an index that lacks committed receipts")
	_, err = db.GetKey(ctx, acked[0])
	require.ErrorIs(t, err, ledger.ErrUnavailable)
	require.ErrorIs(t, db.Store.Ready(ctx), ledger.ErrUnavailable)
	for range 200 {
		_, _ = db.Reserve(ctx, testkit.ReserveReq("key-bbbb-0002", "exec-3"))
	}
	time.Sleep(300 * time.Millisecond)
	assert.Less(t, strings.Count(logs.String(), "\n"), 30, "the failure is not logged a request:\n%s", logs.String())

	full.on.Store(false)
	require.Eventually(t, func() bool { return db.Store.Ready(ctx) == nil }, 10*time.Second, 20*time.Millisecond)
	for _, k := range acked {
		v, err := db.GetKey(ctx, k)
		require.NoError(t, err, k)
		assert.Equal(t, ledger.StateReserved, v.State, k)
	}
	ledgertest.MustCommit(t, db, testkit.Succeed("key-aaaa-0001", res.Reservation))
	again := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-aaaa-0001", "exec-4"))
	assert.Equal(t, ledger.StatusReplayed, again.Status)
	ledgertest.VerifyChain(t, db)
}

// TestIndex_startDiskFull: a ledger whose index cannot be written at
// start (its disk is full) opens all the same and answers unavailable
// until the disk has room; then the index catches up by itself.
func TestIndex_startDiskFull(t *testing.T) {
	ctx := context.Background()
	defer sqlite.SetIndexRetry(50*time.Millisecond, 200*time.Millisecond)()
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path))
	res := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-aaaa-0001", "exec-1"))
	ledgertest.MustCommit(t, db, testkit.Succeed("key-aaaa-0001", res.Reservation))
	require.NoError(t, db.Close())
	require.NoError(t, os.RemoveAll(sqlite.IndexPath(path)), "the index must be built again at start")

	var full diskFull
	full.on.Store(true)
	opts := quiet
	opts.IndexWriteFault, opts.HeadRecordEvery = full.fault, 20*time.Millisecond
	db = ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithStore(opts))
	require.ErrorIs(t, db.Store.Ready(ctx), ledger.ErrUnavailable)
	_, err := db.Reserve(ctx, testkit.ReserveReq("key-aaaa-0001", "exec-2"))
	require.ErrorIs(t, err, ledger.ErrUnavailable)

	full.on.Store(false)
	require.Eventually(t, func() bool { return db.Store.Ready(ctx) == nil }, 10*time.Second, 20*time.Millisecond)
	again := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-aaaa-0001", "exec-2"))
	assert.Equal(t, ledger.StatusReplayed, again.Status)
}

// TestIndex_corrupt: a key index with a corrupt table is moved aside
// (<db>.idx.unreadable-<ms>) and rebuilt from the receipts, whether the
// open meets the corruption or a later read does; a committed key is
// replayed either way and the receipts are untouched.
func TestIndex_corrupt(t *testing.T) {
	for _, tt := range []struct {
		name     string
		from, to float64
	}{{"at open", 0.01, 0.99}, {"on use", 0.3, 0.6}} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			defer sqlite.SetIndexRetry(0, 0)()
			path := filepath.Join(t.TempDir(), "ledger.db")
			db := ledgertest.Open(t, ledgertest.WithPath(path))
			var keys []string
			for i := range 400 {
				k := fmt.Sprintf("key-corrupt-%06d", i)
				res := ledgertest.MustReserve(t, db, testkit.ReserveReq(k, "exec-1"))
				ledgertest.MustCommit(t, db, testkit.Succeed(k, res.Reservation))
				keys = append(keys, k)
			}
			head := db.Head()
			require.NoError(t, db.Close())
			_, err := sqlite.RebuildIndex(ctx, path, ledger.DefaultNamespace, quiet) // one compacted table
			require.NoError(t, err)
			ledgertest.CorruptTables(t, sqlite.IndexPath(path), tt.from, tt.to)

			db = ledgertest.Open(t, ledgertest.WithPath(path))
			assert.Equal(t, head, db.Head())
			for _, k := range keys {
				r, err := db.Reserve(ctx, testkit.ReserveReq(k, "exec-2"))
				if err != nil {
					require.ErrorIs(t, err, ledger.ErrUnavailable, k) // the read that met it; the next one rebuilds
					r = ledgertest.MustReserve(t, db, testkit.ReserveReq(k, "exec-2"))
				}
				require.Equal(t, ledger.StatusReplayed, r.Status, k)
			}
			aside, err := filepath.Glob(sqlite.IndexPath(path) + ".unreadable-*")
			require.NoError(t, err)
			assert.Len(t, aside, 1, "the corrupt index is moved aside, not deleted")
			rs := ledgertest.VerifyChain(t, db)
			assert.Len(t, rs, int(head.Seq)+len(keys), "the receipts, and the replays")
		})
	}
}

// TestRebuildIndex_corrupt: ledgerctl rebuild-index's rebuild of a
// corrupt index moves it aside and builds a new one.
func TestRebuildIndex_corrupt(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path))
	for i := range 400 {
		ledgertest.MustReserve(t, db, testkit.ReserveReq(fmt.Sprintf("key-rebuild-%06d", i), "exec-1"))
	}
	head := db.Head()
	require.NoError(t, db.Close())
	_, err := sqlite.RebuildIndex(ctx, path, ledger.DefaultNamespace, quiet)
	require.NoError(t, err)
	for _, span := range [][2]float64{{0.3, 0.6}, {0.01, 0.99}} {
		ledgertest.CorruptTables(t, sqlite.IndexPath(path), span[0], span[1])
		got, err := sqlite.RebuildIndex(ctx, path, ledger.DefaultNamespace, quiet)
		require.NoError(t, err)
		assert.Equal(t, head, got)
	}
	aside, err := filepath.Glob(sqlite.IndexPath(path) + ".unreadable-*")
	require.NoError(t, err)
	assert.NotEmpty(t, aside)
	db = ledgertest.Open(t, ledgertest.WithPath(path))
	v, err := db.GetKey(ctx, "key-rebuild-000007")
	require.NoError(t, err)
	assert.Equal(t, ledger.StateReserved, v.State)
}
