package keyindex_test

import (
	"fmt"
	"github.com/effect-ledger/effect-ledger/testkit"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/keyindex"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// apply commits receipts from..to of ns with to as the watermark.
func apply(ix *keyindex.Index, ns string, from, to uint64) error {
	b := ix.NewBatch(ns)
	defer b.Close()
	var last *chain.Receipt
	for seq := from; seq <= to; seq++ {
		last = receipt(seq, chain.KindReserve, fmt.Sprintf("key-%06d", seq), "exec", "tool", 1)
		if err := b.Receipt(last); err != nil {
			return err
		}
		if err := b.PutKey(&ledger.KeyRecord{Key: last.IdempotencyKey, FirstSeq: seq, ReserveSeq: seq}); err != nil {
			return err
		}
	}
	return b.Commit(ledger.Head{Seq: to, Hash: last.Hash})
}

// TestIndex_diskFull: a full disk under Pebble (every write of its files
// fails with ENOSPC) never panics: the apply fails, the index answers
// ErrUnusable to every call, its repeated failure is logged a few times
// at most, and Repair reopens it once the disk has room again, with what
// was durable.
func TestIndex_diskFull(t *testing.T) {
	var full atomic.Bool
	logs := &testkit.Buffer{}
	ix, err := keyindex.Open(filepath.Join(t.TempDir(), "idx"), keyindex.Options{
		Logger: slog.New(slog.NewTextHandler(logs, nil)), MemTableBytes: 1 << 20, MinFreeBytes: -1,
		WriteFault: func() error {
			if full.Load() {
				return syscall.ENOSPC
			}
			return nil
		}})
	require.NoError(t, err)
	defer ix.Close()
	require.NoError(t, apply(ix, "ns", 1, 10))
	require.NoError(t, ix.Sync())
	gen := ix.Gen()

	full.Store(true)
	var failed error
	for seq := uint64(11); seq < 100_000 && failed == nil; seq += 100 {
		failed = apply(ix, "ns", seq, seq+99) // until Pebble writes its log, or rotates it
	}
	require.Error(t, failed, "the disk is full")
	assert.ErrorIs(t, failed, keyindex.ErrUnusable)
	assert.ErrorIs(t, failed, syscall.ENOSPC)
	_, _, err = ix.Watermark("ns")
	assert.ErrorIs(t, err, keyindex.ErrUnusable, "no read from a failed index")
	assert.ErrorIs(t, apply(ix, "ns", 1, 1), keyindex.ErrUnusable)
	assert.ErrorIs(t, ix.Repair(), syscall.ENOSPC, "still full")
	time.Sleep(200 * time.Millisecond)
	assert.Less(t, strings.Count(logs.String(), "\n"), 20, "a failure is not logged in a loop:\n%s", logs.String())

	full.Store(false)
	require.NoError(t, ix.Repair())
	assert.NotEqual(t, gen, ix.Gen(), "the driver learns that it must replay")
	wm, found, err := ix.Watermark("ns")
	require.NoError(t, err)
	require.True(t, found)
	assert.GreaterOrEqual(t, wm.Seq, uint64(10), "what was synced is kept")
	require.NoError(t, apply(ix, "ns", wm.Seq+1, wm.Seq+5))
	k, found, err := ix.Key("ns", fmt.Sprintf("key-%06d", wm.Seq+5))
	require.NoError(t, err)
	assert.True(t, found)
	assert.Equal(t, wm.Seq+5, k.FirstSeq)
}

// TestIndex_openNoSpace: an index is not opened (nor created) while its
// file system has less than MinFreeBytes free: Pebble's open would wait
// forever for a flush the full disk fails. The error is a disk error,
// which the driver serves through (unavailable) rather than moving the
// index aside.
func TestIndex_openNoSpace(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "idx")
	ix := open(t, dir)
	require.NoError(t, apply(ix, "ns", 1, 10))
	require.NoError(t, ix.Close())
	for _, d := range []string{dir, filepath.Join(t.TempDir(), "new")} {
		_, err := keyindex.Open(d, keyindex.Options{Logger: quiet, MinFreeBytes: 1 << 62})
		require.ErrorIs(t, err, keyindex.ErrNoSpace, d)
		assert.True(t, keyindex.IsDiskError(err))
	}
	ix = open(t, dir)
	defer ix.Close()
	wm, found, err := ix.Watermark("ns")
	require.NoError(t, err)
	assert.True(t, found)
	assert.Equal(t, uint64(10), wm.Seq)
}

// TestIndex_corrupt: a corrupt table fails the open or the read that
// meets it (ErrCorrupt, no panic), and Repair moves the directory aside
// and starts an empty index.
func TestIndex_corrupt(t *testing.T) {
	build := func(t *testing.T) string {
		dir := filepath.Join(t.TempDir(), "idx")
		ix := open(t, dir)
		require.NoError(t, apply(ix, "ns", 1, 2000))
		require.NoError(t, ix.Compact(t.Context()))
		require.NoError(t, ix.Close())
		return dir
	}
	t.Run("at open", func(t *testing.T) {
		dir := build(t)
		ledgertest.CorruptTables(t, dir, 0.01, 0.99)
		_, err := keyindex.Open(dir, keyindex.Options{Logger: quiet})
		require.ErrorIs(t, err, keyindex.ErrCorrupt)
		assert.False(t, keyindex.IsDiskError(err), "the driver moves it aside")
	})
	t.Run("on read", func(t *testing.T) {
		dir := build(t)
		ledgertest.CorruptTables(t, dir, 0.3, 0.6) // the format key (first) and the table's index (last) stay readable
		ix, err := keyindex.Open(dir, keyindex.Options{Logger: quiet})
		require.NoError(t, err)
		defer ix.Close()
		err = ix.Keys("ns", func(*ledger.KeyRecord) error { return nil })
		if err == nil {
			err = ix.Seqs("ns", keyindex.ByTool, "tool", 0, func(uint64, []byte) (bool, error) { return true, nil })
		}
		require.ErrorIs(t, err, keyindex.ErrCorrupt)
		require.ErrorIs(t, err, keyindex.ErrUnusable)
		_, _, err = ix.Watermark("ns")
		require.ErrorIs(t, err, keyindex.ErrUnusable, "nothing more is read from it")
		require.ErrorIs(t, apply(ix, "ns", 2001, 2001), keyindex.ErrUnusable, "nor written")

		require.NoError(t, ix.Repair())
		aside, err := filepath.Glob(dir + ".unreadable-*")
		require.NoError(t, err)
		assert.Len(t, aside, 1, "the corrupt index is moved aside, not deleted")
		_, found, err := ix.Watermark("ns")
		require.NoError(t, err)
		assert.False(t, found, "a new, empty index")
		require.NoError(t, apply(ix, "ns", 1, 3))
	})
}
