package storetest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sumdb "golang.org/x/mod/sumdb/tlog"
	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/archive"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// pruneNS opens a ledger archiving into a temporary directory, with a
// namespace of key lifetime ttl whose policy archives after a minute, and
// a signer of its checkpoints.
func pruneNS(t *testing.T, f Factory) (*ledger.Namespace, *testkit.Clock, *tlog.Checkpointer, string) {
	t.Helper()
	clock := testkit.NewClock()
	dir := t.TempDir()
	skey, _, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	signer, err := note.NewSigner(skey)
	require.NoError(t, err)
	l := ledger.New(f(t, clock.Now), ledger.Config{Now: clock.Now, ArchiveDir: dir})
	t.Cleanup(func() { _ = l.Close() })
	n := ttlNS(t, l)
	setPolicy(t, n, `{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`) // 1
	return n, clock, &tlog.Checkpointer{Store: n, Signer: signer, Origin: "ex.test/reports"}, dir
}

// storedHashes reads every stored hash of a tree of size leaves, and the
// chain hashes of its receipts.
func storedHashes(t *testing.T, n *ledger.Namespace, size int64) ([]tlog.Hash, []chain.Hash) {
	t.Helper()
	idx := make([]int64, sumdb.StoredHashCount(size))
	for i := range idx {
		idx[i] = int64(i)
	}
	hs, err := n.HashReader(context.Background()).ReadHashes(idx)
	require.NoError(t, err)
	chs, err := n.ReceiptHashes(context.Background(), 0, int(size))
	require.NoError(t, err)
	return hs, chs
}

// testPrune archives and prunes a namespace (SPEC §16), then checks that
// every hash and proof is what it was, that pruned receipts and keys
// answer 410, that a key pruned whole is new, and that the policy still
// holds.
func testPrune(t *testing.T, f Factory) {
	ctx := context.Background()
	n, clock, cp, dir := pruneNS(t, f)
	const pairs = 300 // 2 … 601: more than two tiles
	for i := range pairs {
		key := fmt.Sprintf("prune-%03d", i)
		r := testkit.MustReserve(t, n, testkit.ReserveReq(key, "e1"))
		testkit.MustCommit(t, n, testkit.Succeed(key, r.Reservation))
	}
	clock.Advance(ttl + 2*time.Minute)
	open := testkit.MustReserve(t, n, testkit.ReserveReq("prune-open", "e1")) // 602: pins
	_, err := cp.SignOnce(ctx)
	require.NoError(t, err)
	beforeTree, beforeChain := storedHashes(t, n, 602)
	proof, err := n.InclusionProof(ctx, 5, 0)
	require.NoError(t, err)

	w, err := n.Prunable(ctx, 0, 60_000)
	require.NoError(t, err)
	require.Equal(t, uint64(601), w.Through)
	_, err = n.Prune(ctx, ledger.PruneRequest{Through: 602, Actor: "ops"})
	requireNotPrunable(t, err, "pinned")

	res, err := n.Prune(ctx, ledger.PruneRequest{Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, ledger.PruneStatusPruned, res.Status)
	require.Equal(t, uint64(1), res.From)
	require.Equal(t, uint64(601), res.Through)
	require.Equal(t, uint64(603), res.Receipt.Seq)
	require.Equal(t, archive.Name("reports", 1, 601), res.Segment)
	checked, err := archive.Check(filepath.Join(dir, res.Segment), nil)
	require.NoError(t, err)
	require.Equal(t, res.Digest, checked.Digest)

	// Before the bodies go, and after: the same answers.
	for _, deleted := range []bool{false, true} {
		if deleted {
			require.NoError(t, n.DeletePruned(ctx))
			ps, err := n.Reader().Prunes(ctx)
			require.NoError(t, err)
			require.Len(t, ps, 1)
			require.Equal(t, uint64(601), ps[0].DeletedThrough)
		}
		tree, chs := storedHashes(t, n, 602)
		require.Equal(t, beforeTree, tree, "deleted %v", deleted)
		require.Equal(t, beforeChain, chs, "deleted %v", deleted)
		p, err := n.InclusionProof(ctx, 5, proof.TreeSize)
		require.NoError(t, err)
		require.Equal(t, proof, p)
		_, err = n.GetReceipt(ctx, 5)
		requirePruned(t, err)
		_, err = n.Key(ctx, "prune-007", false)
		requirePruned(t, err)
		pol, _, err := n.Policy(ctx)
		require.NoError(t, err)
		require.Equal(t, &ledger.Archive{KeepMS: 60_000, MinKeepMS: 60_000}, pol.Archive, "the policy the prune carries")
		rs, _, err := n.ListReceipts(ctx, ledger.ReceiptFilter{Limit: 10})
		require.NoError(t, err)
		require.Equal(t, uint64(602), rs[0].Seq, "a listing starts after the pruned prefix")
	}

	// The open key still commits; a key pruned whole is new.
	testkit.MustCommit(t, n, testkit.Succeed("prune-open", open.Reservation)) // 604
	again := testkit.MustReserve(t, n, testkit.ReserveReq("prune-007", "e2")) // 605
	require.Equal(t, ledger.StatusReserved, again.Status)
	require.Nil(t, again.Renewed, "a new key, not a renewal")
	require.Equal(t, uint64(605), again.Receipt.Seq)
	testkit.MustCommit(t, n, testkit.Succeed("prune-007", again.Reservation)) // 606
	v, err := n.Key(ctx, "prune-007", true)
	require.NoError(t, err)
	require.Equal(t, uint64(605), v.FirstSeq)

	// The tree goes on over the kept hashes: a checkpoint, proofs to it.
	s, err := cp.SignOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(606), s.Size)
	root, err := tlog.TreeHash(606, n.HashReader(ctx))
	require.NoError(t, err)
	require.Equal(t, s.Root, root)
	cons, err := n.ConsistencyProof(ctx, 602, 606)
	require.NoError(t, err)
	require.Equal(t, proof.Root, cons.RootFrom)
	require.Equal(t, tlog.HexHash(s.Root), cons.RootTo)

	again2, err := n.Prune(ctx, ledger.PruneRequest{Through: 300, Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, ledger.PruneStatusAlready, again2.Status)
	require.Equal(t, uint64(603), again2.Receipt.Seq)
}

// requirePruned checks that err is 410 pruned.
func requirePruned(t *testing.T, err error) {
	t.Helper()
	var e *ledger.Error
	require.True(t, errors.As(err, &e), "%v", err)
	require.Equal(t, ledger.ECodePruned, e.Code)
}

// requireNotPrunable checks that err is 409 not_prunable for reason.
func requireNotPrunable(t *testing.T, err error, reason string) {
	t.Helper()
	var e *ledger.Error
	require.True(t, errors.As(err, &e), "%v", err)
	require.Equal(t, ledger.ECodeNotPrunable, e.Code)
	require.Equal(t, reason, e.Details["reason"])
}
