package storetest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/archive"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// pruneNS opens a ledger archiving into a temporary directory, with a
// namespace of key lifetime ttl whose policy archives after a minute, and
// a signer of its checkpoints.
func pruneNS(t *testing.T, f Factory, step ...func(string)) (*ledger.Namespace, *testkit.Clock, *tlog.Checkpointer, string) {
	t.Helper()
	clock := testkit.NewClock()
	dir := t.TempDir()
	skey, _, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	signer, err := note.NewSigner(skey)
	require.NoError(t, err)
	cfg := ledger.Config{Now: clock.Now, ArchiveDir: dir}
	if len(step) > 0 {
		cfg.PruneStep = step[0]
	}
	l := ledger.New(f(t, clock.Now), cfg)
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
		if i%100 == 99 { // checkpoints 201, 401, 601 in one hour
			_, err := cp.SignOnce(ctx)
			require.NoError(t, err)
		}
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
			for size, kept := range map[int64]bool{201: true, 401: false, 601: true, 602: true} {
				c, err := n.CheckpointAt(ctx, size)
				require.NoError(t, err)
				require.Equal(t, kept, c != nil, "checkpoint %d: thinned to the first in each hour, the last pruned, the latest", size)
			}
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

// testPruneErasure erases, by key and by subject, values of generations
// whose bodies were pruned: the segment's payloads.jsonl loses them and
// still checks, and the erase receipt names them.
func testPruneErasure(t *testing.T, f Factory) {
	ctx := context.Background()
	n, clock, cp, dir := pruneNS(t, f)
	for i := range 20 { // 2 … 41
		key := fmt.Sprintf("erase-%02d", i)
		req := testkit.ReserveReq(key, "e1")
		if i%5 == 0 {
			req.Subjects = []string{"person-1"}
		}
		r := testkit.MustReserve(t, n, req)
		testkit.MustCommit(t, n, testkit.Succeed(key, r.Reservation))
	}
	clock.Advance(ttl + 2*time.Minute)
	testkit.MustReserve(t, n, testkit.ReserveReq("erase-open", "e1")) // 42
	_, err := cp.SignOnce(ctx)
	require.NoError(t, err)
	res, err := n.Prune(ctx, ledger.PruneRequest{Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, uint64(41), res.Through)
	require.NoError(t, n.DeletePruned(ctx))
	seg := filepath.Join(dir, res.Segment)
	values := func() map[uint64]int {
		out := map[uint64]int{}
		require.NoError(t, archive.Payloads(seg, func(p *archive.Payload) error { out[p.Seq]++; return nil }))
		return out
	}
	before := values()
	require.Equal(t, 2, before[3], "erase-00's commit keeps external_ref and result")

	byKey, err := n.Erase(ctx, ledger.EraseRequest{Keys: []string{"erase-03"}, Reason: "asked", Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, ledger.StatusErased, byKey.Status)
	require.Equal(t, 1, byKey.Keys)
	after := values()
	require.Zero(t, after[9], "erase-03's commit (9): its values are gone from the segment")
	require.Equal(t, before[3], after[3], "erase-00's are not")

	bySubject, err := n.Erase(ctx, ledger.EraseRequest{Subject: "person-1", Reason: "asked", Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, ledger.StatusErased, bySubject.Status)
	require.Equal(t, 4, bySubject.Keys, "erase-00, -05, -10, -15")
	after = values()
	for _, seq := range []uint64{3, 13, 23, 33} {
		require.Zero(t, after[seq], "receipt %d", seq)
	}
	require.Equal(t, before[5], after[5], "erase-01 had no subject")
	_, err = archive.Check(seg, nil)
	require.NoError(t, err, "the rewritten segment still checks")
	e, _, err := n.Erasure(ctx, bySubject.Receipt.Seq)
	require.NoError(t, err)
	require.Equal(t, []chain.Range{{3, 3}, {13, 13}, {23, 23}, {33, 33}}, e.Ranges)

	again, err := n.Erase(ctx, ledger.EraseRequest{Subject: "person-1", Reason: "asked", Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, ledger.StatusNothingToErase, again.Status)
}

// testPruneKeyReceipt prunes a key receipt (SPEC §9.2): the namespace's
// key history still has its rotation, and a portable receipt still
// carries it, proven under the first checkpoint that covers it.
func testPruneKeyReceipt(t *testing.T, f Factory) {
	ctx := context.Background()
	n, clock, cp, _ := pruneNS(t, f)
	_, newV, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	for i := range 10 { // 2 … 21
		key := fmt.Sprintf("rotation-%02d", i)
		r := testkit.MustReserve(t, n, testkit.ReserveReq(key, "e1"))
		testkit.MustCommit(t, n, testkit.Succeed(key, r.Reservation))
	}
	rot, err := n.RotateKey(ctx, ledger.RotateRequest{VKey: newV, Retires: "00000000", Actor: "ops"}) // 22
	require.NoError(t, err)
	_, err = cp.SignOnce(ctx) // the first checkpoint covering 22
	require.NoError(t, err)
	clock.Advance(ttl + 2*time.Minute)
	open := testkit.MustReserve(t, n, testkit.ReserveReq("rotation-open", "e1")) // 23
	_, err = cp.SignOnce(ctx)
	require.NoError(t, err)
	res, err := n.Prune(ctx, ledger.PruneRequest{Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, uint64(22), res.Through)
	require.NoError(t, n.DeletePruned(ctx))
	_, err = n.GetReceipt(ctx, 22)
	requirePruned(t, err)
	hist, err := n.KeyHistory(ctx)
	require.NoError(t, err)
	require.Len(t, hist, 1)
	require.Equal(t, rot.Rotation.VKey, hist[0].VKey)
	p, err := n.PortableReceipt(ctx, open.Receipt.Seq)
	require.NoError(t, err)
	require.Len(t, p.Keys, 1, "the bundle carries the pruned key receipt")
	require.Equal(t, uint64(22), p.Keys[0].Receipt.Seq)
}

// testPruneRaces: two prunes of one range at once both answer (one
// pruned, one already_pruned) and leave one checked segment; an erase
// committed while a prune's segment was written makes the prune scan
// again, and the segment it keeps holds none of the erased values.
func testPruneRaces(t *testing.T, f Factory) {
	ctx := context.Background()
	var n *ledger.Namespace
	erased := false
	n, clock, cp, dir := pruneNS(t, f, func(step string) {
		if step == "segment-written" && !erased {
			erased = true
			_, err := n.Erase(ctx, ledger.EraseRequest{Keys: []string{"race-0003"}, Reason: "asked", Actor: "ops"})
			require.NoError(t, err)
		}
	})
	for i := range 20 { // 2 … 41
		key := fmt.Sprintf("race-%04d", i)
		r := testkit.MustReserve(t, n, testkit.ReserveReq(key, "e1"))
		testkit.MustCommit(t, n, testkit.Succeed(key, r.Reservation))
	}
	clock.Advance(ttl + 2*time.Minute)
	testkit.MustReserve(t, n, testkit.ReserveReq("race-open", "e1")) // 42
	_, err := cp.SignOnce(ctx)
	require.NoError(t, err)
	res, err := n.Prune(ctx, ledger.PruneRequest{Through: 30, Actor: "ops"})
	require.NoError(t, err)
	require.True(t, erased)
	require.Equal(t, ledger.PruneStatusPruned, res.Status)
	require.Equal(t, uint64(44), res.Receipt.Seq, "after the erase receipt (43): the prune scanned again")
	seg := filepath.Join(dir, res.Segment)
	_, err = archive.Check(seg, nil)
	require.NoError(t, err)
	held, err := archive.Holds(seg, map[uint64]chain.FieldSet{9: chain.AllFields})
	require.NoError(t, err)
	require.False(t, held, "race-0003's commit (9): erased before the prune committed")

	_, err = cp.SignOnce(ctx)
	require.NoError(t, err)
	answers := make(chan *ledger.PruneResult, 2)
	for range 2 {
		go func() {
			r, err := n.Prune(ctx, ledger.PruneRequest{Through: 41, Actor: "ops"})
			assert.NoError(t, err)
			answers <- r
		}()
	}
	a, b := <-answers, <-answers
	require.NotNil(t, a)
	require.NotNil(t, b)
	require.ElementsMatch(t, []string{ledger.PruneStatusPruned, ledger.PruneStatusAlready}, []string{a.Status, b.Status})
	require.Equal(t, a.Receipt.Seq, b.Receipt.Seq)
	_, err = archive.Check(filepath.Join(dir, a.Segment), nil)
	require.NoError(t, err, "the segment both named is there")
}
