package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/transparency-dev/merkle/rfc6962"
	"github.com/transparency-dev/merkle/testonly"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// allReceipts reads every receipt through the read pool.
func allReceipts(tb testing.TB, rd *sqlite.Reader) []chain.Receipt {
	tb.Helper()
	var out []chain.Receipt
	var after uint64
	for {
		rs, next, err := rd.ListReceipts(context.Background(), ledger.ReceiptFilter{After: after, Limit: ledger.MaxPageLimit})
		require.NoError(tb, err)
		out = append(out, rs...)
		if next == nil {
			return out
		}
		after = *next
	}
}

// checkTree compares the ledger's stored tree, at every size, with
// transparency-dev/merkle's reference tree built from the receipts' hashes.
func checkTree(tb testing.TB, rd *sqlite.Reader) {
	tb.Helper()
	ctx := context.Background()
	rs := allReceipts(tb, rd)
	n, err := rd.TreeSize(ctx)
	require.NoError(tb, err)
	require.Equal(tb, int64(len(rs)), n, "one leaf per receipt")
	ref := testonly.New(rfc6962.DefaultHasher)
	for i, r := range rs {
		ref.AppendData(r.Hash[:])
		root, err := tlog.TreeHash(int64(i+1), rd.HashReader(ctx))
		require.NoError(tb, err)
		require.Equal(tb, ref.Hash(), root[:], "root at size %d", i+1)
	}
}

func TestTree_OK(t *testing.T) {
	db := ledgertest.Open(t)
	var wg sync.WaitGroup
	for w := range 8 { // concurrent requests share batches
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				key := fmt.Sprintf("key-tree-%02d-%03d", w, i)
				res := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-"+key))
				ledgertest.MustCommit(t, db, testkit.Succeed(key, res.Reservation))
			}
		}()
	}
	wg.Wait()
	checkTree(t, db.Reader)
}

// A failed batch stores no tree hash and leaves the writer's cache as the
// database is: the next batches build on the committed tree.
func TestTree_ErrFailedBatch(t *testing.T) {
	db := ledgertest.Open(t)
	var failing atomic.Bool
	db.Store.SetBeforeCommit(func() error {
		if failing.Load() {
			return errors.New("injected failure")
		}
		return nil
	})
	for i := range 5 {
		ledgertest.MustReserve(t, db, testkit.ReserveReq(fmt.Sprintf("key-before-%03d", i), "exec-1"))
	}
	failing.Store(true)
	_, err := db.Reserve(context.Background(), testkit.ReserveReq("key-failed-0001", "exec-2"))
	require.Error(t, err)
	failing.Store(false)
	for i := range 5 {
		ledgertest.MustReserve(t, db, testkit.ReserveReq(fmt.Sprintf("key-after-%03d", i), "exec-3"))
	}
	checkTree(t, db.Reader)
}

// A ledger whose tree is missing (one migrated from a version whose tree
// is built again, or written before the tree existed) gets its tree
// back-filled when ledgerd opens it.
func TestTree_Backfill(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path))
	for i := range 300 {
		ledgertest.MustReserve(t, db, testkit.ReserveReq(fmt.Sprintf("key-fill-%04d", i), "exec-1"))
	}
	require.NoError(t, db.Close())

	execFile(t, path, `DROP TRIGGER ns_tree_no_delete; DELETE FROM ns_tree`)

	rd, err := sqlite.OpenReader(context.Background(), path, quiet)
	require.NoError(t, err)
	size, err := rd.TreeSize(context.Background())
	require.NoError(t, err)
	assert.Zero(t, size, "a reader on a file without the tree reads none")
	require.NoError(t, rd.Close())

	// Several back-fill transactions, the last one partial.
	defer sqlite.SetBackfillChunk(257)()
	db = ledgertest.Open(t, ledgertest.WithPath(path))
	checkTree(t, db.Reader)
	ledgertest.MustReserve(t, db, testkit.ReserveReq("key-fill-after", "exec-2"))
	checkTree(t, db.Reader)
}

// Receipts cut behind ledgerd's back: the tree is longer than the chain
// and Open refuses; rebuild-keys rebuilds the tree from the chain as it
// is, and the signer then refuses to sign a checkpoint that would fork the
// one it signed before the cut.
func TestTree_ErrTruncated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path))
	for i := range 6 {
		ledgertest.MustReserve(t, db, testkit.ReserveReq(fmt.Sprintf("key-cut-%04d", i), "exec-1"))
	}
	ctx := context.Background()
	cp := newCheckpointer(t, db)
	s, err := cp.SignOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(6), s.Size)
	require.NoError(t, db.Close())

	execFile(t, path, `DROP TRIGGER ns_receipts_no_delete; DELETE FROM ns_receipts WHERE ns = 0 AND seq > 3`)

	_, err = sqlite.RebuildIndex(ctx, path, ledger.DefaultNamespace, quiet)
	require.NoError(t, err)
	db = ledgertest.Open(t, ledgertest.WithPath(path))
	checkTree(t, db.Reader)
	for i := range 5 { // grows past the signed size with other receipts
		ledgertest.MustReserve(t, db, testkit.ReserveReq(fmt.Sprintf("key-new-%04d", i), "exec-2"))
	}
	cp = newCheckpointer(t, db)
	_, err = cp.SignOnce(ctx)
	require.ErrorIs(t, err, tlog.ErrFork)
	last, err := db.LatestCheckpoint(ctx)
	require.NoError(t, err)
	assert.Equal(t, s.Note, last.Note, "nothing new was signed")
}

func newCheckpointer(tb testing.TB, db *ledgertest.DB) *tlog.Checkpointer {
	tb.Helper()
	skey, _, err := tlog.GenerateKey("example.test")
	require.NoError(tb, err)
	signer, _, _, err := tlog.LoadSignerText(skey, "example.test")
	require.NoError(tb, err)
	return &tlog.Checkpointer{Store: db, Signer: signer, Origin: tlog.Origin("example.test", tlog.DefaultNamespace)}
}

func TestStoreCheckpoint_ErrNotLarger(t *testing.T) {
	db := ledgertest.Open(t)
	ctx := context.Background()
	for i := range 3 {
		ledgertest.MustReserve(t, db, testkit.ReserveReq(fmt.Sprintf("key-cp-%04d", i), "exec-1"))
	}
	require.NoError(t, db.StoreCheckpoint(ctx, &tlog.Signed{Size: 2, Note: "a"}))
	require.Error(t, db.StoreCheckpoint(ctx, &tlog.Signed{Size: 2, Note: "b"}))
	require.Error(t, db.StoreCheckpoint(ctx, &tlog.Signed{Size: 1, Note: "c"}))
	require.Error(t, db.StoreCheckpoint(ctx, &tlog.Signed{Size: 4, Note: "d"}), "beyond the chain")
	// A refused checkpoint in a batch does not fail the batch's other writes.
	ledgertest.MustReserve(t, db, testkit.ReserveReq("key-cp-after", "exec-2"))
	c, err := db.LatestCheckpoint(ctx)
	require.NoError(t, err)
	assert.Equal(t, "a", c.Note)
}

// Tiles, proofs and checkpoints are read through the read pool: they are
// served while the writer is stuck inside a batch.
func TestReadTile_NotOnWriter(t *testing.T) {
	db := ledgertest.Open(t)
	ctx := context.Background()
	for i := range 10 {
		ledgertest.MustReserve(t, db, testkit.ReserveReq(fmt.Sprintf("key-tile-%04d", i), "exec-1"))
	}
	cp := newCheckpointer(t, db)
	_, err := cp.SignOnce(ctx)
	require.NoError(t, err)

	var blocking atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	db.Store.SetBeforeCommit(func() error {
		if blocking.Load() {
			close(entered)
			<-release
		}
		return nil
	})
	blocking.Store(true)
	done := make(chan error, 1)
	go func() {
		_, err := db.Reserve(ctx, testkit.ReserveReq("key-tile-stuck", "exec-2"))
		done <- err
	}()
	<-entered
	defer func() { blocking.Store(false); close(release); require.NoError(t, <-done) }()

	tile, err := db.ReadTile(ctx, "tile/0/000.p/10")
	require.NoError(t, err)
	assert.Len(t, tile.Data, 10*32)
	assert.False(t, tile.Full)
	entries, err := db.ReadTile(ctx, "tile/entries/000.p/10")
	require.NoError(t, err)
	assert.Len(t, entries.Data, 10*34)
	_, err = db.InclusionProof(ctx, 3, 0)
	require.NoError(t, err)
	_, err = db.PortableReceipt(ctx, 10)
	require.NoError(t, err)
	_, err = db.ReadTile(ctx, "tile/0/000.p/11")
	assert.Equal(t, ledger.ECodeNotFound, ledger.ErrorCode(err), "beyond the tree")
}
