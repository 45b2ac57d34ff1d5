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
	h := locked(tx).Head
	r := chain.Receipt{Kind: chain.KindReserve, IdempotencyKey: key, ExecutionID: "exec-" + key, Attempt: 1,
		Tool: "t", Effect: chain.EffectWrite, LeaseExpiresAt: locked(tx).Now + 1000, RecordedAt: locked(tx).Now}
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

// groupOf makes a write appending n reserves to each namespace.
func groupOf(names []string, n int, tag string) []ledger.Batch {
	batches := make([]ledger.Batch, len(names))
	for i, ns := range names {
		batches[i] = ledger.Batch{NS: ns, Ops: []ledger.Op{ledger.OpFunc(func(ctx context.Context, tx ledger.Tx) error {
			for j := range n {
				if err := appendReserve(ctx, tx, fmt.Sprintf("%s-%d-%d", tag, i, j)); err != nil {
					return err
				}
			}
			return nil
		})}}
	}
	return batches
}

// TestStore_Write: the batches of several namespaces, default included,
// commit in one transaction of the ledger file, each on its own chain,
// with one COMMIT; a failing batch or COMMIT leaves every chain as it
// was; a namespace twice, or one that does not exist, is refused.
func TestStore_Write(t *testing.T) {
	ctx := context.Background()
	db := ledgertest.Open(t)
	s := db.Store
	names := []string{"zeta", ledger.DefaultNamespace, "alpha"}
	var chains []ledger.Chain
	for _, ns := range names {
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
	require.NoError(t, s.Write(ctx, groupOf(names, 2, "first")))
	assert.Equal(t, before+1, s.WriterStats().Batches, "one transaction for every namespace")
	assert.Equal(t, []uint64{2, 2, 2}, heads())

	boom := errors.New("boom")
	parts := groupOf(names, 1, "second")
	parts[2].Ops[0] = ledger.OpFunc(func(ctx context.Context, tx ledger.Tx) error {
		if err := appendReserve(ctx, tx, "second-doomed"); err != nil {
			return err
		}
		return boom
	})
	assert.ErrorIs(t, s.Write(ctx, parts), boom)
	assert.Equal(t, []uint64{2, 2, 2}, heads(), "a failing part rolls the group back")

	s.SetBeforeCommit(func() error { return errInjected })
	assert.ErrorIs(t, s.Write(ctx, groupOf(names, 1, "third")), ledger.ErrIO)
	s.SetBeforeCommit(nil)
	assert.Equal(t, []uint64{2, 2, 2}, heads(), "a failed COMMIT appends nothing")
	require.NoError(t, s.Write(ctx, groupOf(names, 1, "fourth")), "the caches were left as the file is")
	assert.Equal(t, []uint64{3, 3, 3}, heads())

	var pe *ledger.PartError
	require.ErrorAs(t, s.Write(ctx, []ledger.Batch{{NS: "zeta"}, {NS: "zeta"}}), &pe)
	assert.Equal(t, 1, pe.Part, "a namespace twice")
	require.ErrorIs(t, s.Write(ctx, []ledger.Batch{{NS: "nowhere"}}), ledger.ErrUnknownNamespace)

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

// locked is tx.Locked, which never fails on this driver.
func locked(tx ledger.Tx) ledger.Locked {
	l, _ := tx.Locked(context.Background())
	return l
}
