package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/tlog"
	"github.com/effect-ledger/effect-ledger/verify"
)

// appendReserve links a reserve of key to tx's head, appends it with its
// tree hashes and writes its key record, as the domain does for a new key.
func appendReserve(ctx context.Context, tx ledger.Tx, key string) error {
	h := tx.Head()
	r := chain.Receipt{Kind: chain.KindReserve, IdempotencyKey: key, ExecutionID: "exec-" + key, Attempt: 1,
		Tool: "t", Effect: chain.EffectWrite, LeaseExpiresAt: tx.Now() + 1000, RecordedAt: tx.Now()}
	l := chain.Link(h.Seq, h.Hash, r)
	hs, err := sumdb.StoredHashes(tlog.LeafIndex(l.Seq), l.Hash[:], sumdb.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		return tx.ReadHashes(ctx, idx)
	}))
	if err != nil {
		return err
	}
	if err := tx.Append(ctx, &l, hs); err != nil {
		return err
	}
	return tx.PutKey(ctx, &ledger.KeyRecord{Key: key, Tool: "t", Effect: chain.EffectWrite, FirstSeq: l.Seq,
		ReserveSeq: l.Seq, LeaseExpiresAt: r.LeaseExpiresAt, TokenHash: fmt.Sprintf("%032x", len(key))})
}

// groupOf makes a group appending n reserves to each chain.
func groupOf(chains []ledger.Chain, n int, tag string) []ledger.GroupPart {
	parts := make([]ledger.GroupPart, len(chains))
	for i, c := range chains {
		parts[i] = ledger.GroupPart{Chain: c, Fn: func(ctx context.Context, tx ledger.Tx) error {
			for j := range n {
				if err := appendReserve(ctx, tx, fmt.Sprintf("%s-%d-%d", tag, i, j)); err != nil {
					return err
				}
			}
			return nil
		}}
	}
	return parts
}

// TestStore_UpdateGroup: the batches of several namespaces, default
// included, commit in one transaction of the ledger file, each on its own
// chain, with one COMMIT; a failing part or COMMIT leaves every chain as it
// was; a namespace twice, or another store's, is refused.
func TestStore_UpdateGroup(t *testing.T) {
	ctx := context.Background()
	db := ledgertest.Open(t)
	s := db.Store
	var chains []ledger.Chain
	for _, ns := range []string{"zeta", ledger.DefaultNamespace, "alpha"} {
		if ns != ledger.DefaultNamespace {
			require.NoError(t, s.CreateNamespace(ctx, ns, 0))
		}
		c, err := s.Chain(ctx, ns)
		require.NoError(t, err)
		chains = append(chains, c)
	}
	heads := func() []uint64 {
		var out []uint64
		for _, c := range chains {
			h, err := c.Head(ctx)
			require.NoError(t, err)
			out = append(out, h.Seq)
		}
		return out
	}

	before := s.WriterStats().Batches
	require.NoError(t, s.UpdateGroup(ctx, groupOf(chains, 2, "first")))
	assert.Equal(t, before+1, s.WriterStats().Batches, "one transaction for every namespace")
	assert.Equal(t, []uint64{2, 2, 2}, heads())

	boom := errors.New("boom")
	parts := groupOf(chains, 1, "second")
	parts[2].Fn = func(ctx context.Context, tx ledger.Tx) error {
		if err := appendReserve(ctx, tx, "second-doomed"); err != nil {
			return err
		}
		return boom
	}
	assert.ErrorIs(t, s.UpdateGroup(ctx, parts), boom)
	assert.Equal(t, []uint64{2, 2, 2}, heads(), "a failing part rolls the group back")

	s.SetBeforeCommit(func() error { return errInjected })
	assert.ErrorIs(t, s.UpdateGroup(ctx, groupOf(chains, 1, "third")), ledger.ErrIO)
	s.SetBeforeCommit(nil)
	assert.Equal(t, []uint64{2, 2, 2}, heads(), "a failed COMMIT appends nothing")
	require.NoError(t, s.UpdateGroup(ctx, groupOf(chains, 1, "fourth")), "the caches were left as the file is")
	assert.Equal(t, []uint64{3, 3, 3}, heads())

	var pe *ledger.PartError
	require.ErrorAs(t, s.UpdateGroup(ctx, []ledger.GroupPart{{Chain: chains[0]}, {Chain: chains[0]}}), &pe)
	assert.Equal(t, 1, pe.Part, "a namespace twice")
	other := ledgertest.Open(t)
	oc, err := other.Store.Chain(ctx, ledger.DefaultNamespace)
	require.NoError(t, err)
	require.ErrorAs(t, s.UpdateGroup(ctx, []ledger.GroupPart{{Chain: oc}}), &pe, "another store's chain")

	require.NoError(t, db.Close())
	ro, err := sqlite.OpenStore(ctx, db.Path(), sqlite.Options{}, true)
	require.NoError(t, err)
	defer ro.Close()
	for _, ns := range []string{"zeta", ledger.DefaultNamespace, "alpha"} {
		c, err := ro.Chain(ctx, ns)
		require.NoError(t, err)
		rep, err := verify.New(c.(verify.DB), verify.Opts{}).Check(ctx)
		require.NoError(t, err)
		assert.True(t, rep.OK, "%s: %+v", ns, rep.Violations)
		assert.EqualValues(t, 3, rep.Receipts, ns)
	}
}
