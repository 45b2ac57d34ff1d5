package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/tlog"
	"github.com/effect-ledger/effect-ledger/verify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sumdb "golang.org/x/mod/sumdb/tlog"
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
			require.NoError(t, s.CreateNamespace(ctx, ns, ledger.NamespaceSettings{}))
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

var errInjected = fmt.Errorf("injected disk failure: %w", ledger.ErrIO)

// TestStore_failedBatch fails every batch at COMMIT while concurrent requests
// run: each gets ErrUnavailable, nothing is appended, and afterwards the
// writer's in-memory state agrees with the database (reserves, commits and
// replays behave as if the failed requests never happened).
func TestStore_failedBatch(t *testing.T) {
	db := ledgertest.Open(t)
	var failing atomic.Bool
	db.Store.SetBeforeCommit(func() error {
		if failing.Load() {
			return errInjected
		}
		return nil
	})
	ctx := context.Background()
	done := ledgertest.MustReserve(t, db, testkit.ReserveReq("done-key-0001", "exec-1"))
	ledgertest.MustCommit(t, db, testkit.Succeed("done-key-0001", done.Reservation))
	open := ledgertest.MustReserve(t, db, testkit.ReserveReq("open-key-0001", "exec-1"))
	head := db.Head()

	failing.Store(true)
	var wg sync.WaitGroup
	var unavailable atomic.Int32
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			switch i % 3 {
			case 0:
				_, err = db.Reserve(ctx, testkit.ReserveReq(fmt.Sprintf("new-key-%04d", i), "exec-x"))
			case 1:
				_, err = db.Reserve(ctx, testkit.ReserveReq("done-key-0001", fmt.Sprintf("exec-%d", i)))
			case 2:
				_, err = db.Commit(ctx, testkit.Succeed("open-key-0001", open.Reservation))
			}
			if errors.Is(err, ledger.ErrUnavailable) && ledger.ErrorCode(err) == ledger.ECodeUnavailable {
				unavailable.Add(1)
			} else {
				t.Errorf("request %d: got %v, want unavailable", i, err)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int32(24), unavailable.Load())
	assert.Equal(t, head, db.Head(), "nothing appended")
	assert.Error(t, db.Ledger.Ready(ctx), "not ready while writes fail")

	failing.Store(false)
	// The first check after a failure is never ready: its probe write
	// succeeds and makes the next check ready.
	assert.Error(t, db.Ledger.Ready(ctx), "the first check after a failed write is not ready")
	require.NoError(t, db.Ledger.Ready(ctx))
	// The new keys were never recorded: they reserve as new.
	res := ledgertest.MustReserve(t, db, testkit.ReserveReq("new-key-0000", "exec-x"))
	assert.Equal(t, ledger.StatusReserved, res.Status)
	assert.Equal(t, head.Seq+1, res.Receipt.Seq)
	// The open reservation is still open: its commit is the first one.
	c := ledgertest.MustCommit(t, db, testkit.Succeed("open-key-0001", open.Reservation))
	assert.False(t, c.Replayed)
	// The succeeded key still replays.
	rep := ledgertest.MustReserve(t, db, testkit.ReserveReq("done-key-0001", "exec-2"))
	assert.Equal(t, ledger.StatusReplayed, rep.Status)
	ledgertest.VerifyChain(t, db)
}

// metricValue reads a gauge or counter without labels from the default
// registry, where ledger's metrics live.
func metricValue(t *testing.T, name string) float64 {
	t.Helper()
	fams, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		require.Len(t, f.GetMetric(), 1, name)
		m := f.GetMetric()[0]
		if m.GetGauge() != nil {
			return m.GetGauge().GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("metric %s is not registered", name)
	return 0
}

// TestStore_readyMetric: ledger_writer_ready follows what /readyz reports, and
// every failed batch is counted.
func TestStore_readyMetric(t *testing.T) {
	db := ledgertest.Open(t)
	ctx := context.Background()
	assert.Equal(t, 1.0, metricValue(t, "ledger_writer_ready"), "ready after Open")

	var failing atomic.Bool
	db.Store.SetBeforeCommit(func() error {
		if failing.Load() {
			return errInjected
		}
		return nil
	})
	failuresBefore := metricValue(t, "ledger_writer_batch_failures_total")
	failing.Store(true)
	_, err := db.Reserve(ctx, testkit.ReserveReq("ready-key-0001", "exec-1"))
	require.ErrorIs(t, err, ledger.ErrUnavailable)
	assert.Equal(t, 0.0, metricValue(t, "ledger_writer_ready"), "not ready after a failed batch")
	assert.Equal(t, failuresBefore+1, metricValue(t, "ledger_writer_batch_failures_total"))
	assert.Error(t, db.Ledger.Ready(ctx))
	assert.Equal(t, 0.0, metricValue(t, "ledger_writer_ready"), "a failed probe keeps it 0")
	assert.Equal(t, failuresBefore+2, metricValue(t, "ledger_writer_batch_failures_total"))

	failing.Store(false)
	_ = db.Ledger.Ready(ctx) // the probe write succeeds; this check may still answer not ready
	assert.Equal(t, 1.0, metricValue(t, "ledger_writer_ready"), "ready again once the probe wrote")
	require.NoError(t, db.Ledger.Ready(ctx))
	assert.Equal(t, 1.0, metricValue(t, "ledger_writer_ready"))
}

// TestStore_payloadRowsInGroup: the payload rows of a batch go in
// multi-row INSERTs (at most 32 rows each, the rest at the batch's end),
// and a read or an erase in the same batch sees every row appended
// before it; a failed batch leaves no row behind.
func TestStore_payloadRowsInGroup(t *testing.T) {
	ctx := context.Background()
	db := ledgertest.Open(t, ledgertest.WithStore(sqlite.Options{Payloads: ledger.PayloadsCommitted}))
	s := db.Store
	appendCommitted := func(ctx context.Context, tx ledger.Tx, i int) (uint64, error) {
		h := locked(tx).Head
		r := chain.Receipt{Kind: chain.KindCommit, IdempotencyKey: fmt.Sprintf("key-%08d", i), ExecutionID: "e", Attempt: 1,
			Tool: "t", Effect: chain.EffectWrite, Outcome: chain.OutcomeSucceeded, Result: fmt.Sprintf(`{"n":%d}`, i),
			ExternalRef: fmt.Sprintf("ref-%d", i), RecordedAt: locked(tx).Now}
		o := chain.CommitFields(&r)
		l := chain.Link(h.Seq, h.Hash, r)
		l.Open = &o
		hs, err := sumdb.StoredHashes(tlog.LeafIndex(l.Seq), l.Hash[:], sumdb.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
			return tx.ReadHashes(ctx, idx)
		}))
		if err != nil {
			return 0, err
		}
		return l.Seq, tx.Append(ctx, &l, hs)
	}
	const n = 70
	require.NoError(t, s.Write(ctx, []ledger.Batch{{NS: ledger.DefaultNamespace, Ops: []ledger.Op{ledger.OpFunc(
		func(ctx context.Context, tx ledger.Tx) error {
			var seqs []uint64
			for i := 1; i <= n; i++ {
				seq, err := appendCommitted(ctx, tx, i)
				if err != nil {
					return err
				}
				seqs = append(seqs, seq)
				if i == 40 { // the batch's own rows: the first 32 inserted, 8 still queued
					got, err := tx.Openings(ctx, seqs)
					if err != nil {
						return err
					}
					if len(got) != 40 || got[40].Get(chain.FieldResult).Value != `{"n":40}` {
						return fmt.Errorf("openings in the batch: %d rows", len(got))
					}
					if err := tx.ErasePayloads(ctx, 999, map[uint64]chain.FieldSet{3: chain.FieldSet(0).With(chain.FieldResult)}); err != nil {
						return err
					}
				}
			}
			return nil
		})}}}))
	c, err := s.Chain(ctx, ledger.DefaultNamespace)
	require.NoError(t, err)
	pr := c.(ledger.PayloadReader)
	var all []uint64
	for i := uint64(1); i <= n; i++ {
		all = append(all, i)
	}
	got, err := pr.Openings(ctx, all)
	require.NoError(t, err)
	require.Len(t, got, n, "every row, the last 6 written at the batch's end")
	assert.EqualValues(t, 999, got[3].Get(chain.FieldResult).ErasedBy, "erased in the same batch")
	assert.Equal(t, "ref-3", got[3].Get(chain.FieldExternalRef).Value)
	assert.Equal(t, `{"n":70}`, got[70].Get(chain.FieldResult).Value)

	boom := errors.New("boom")
	require.ErrorIs(t, s.Write(ctx, []ledger.Batch{{NS: ledger.DefaultNamespace, Ops: []ledger.Op{ledger.OpFunc(
		func(ctx context.Context, tx ledger.Tx) error {
			for i := n + 1; i <= n+5; i++ {
				if _, err := appendCommitted(ctx, tx, i); err != nil {
					return err
				}
			}
			return boom
		})}}}), boom)
	got, err = pr.Openings(ctx, []uint64{n + 1})
	require.NoError(t, err)
	assert.Empty(t, got, "a failed batch leaves no payload row")
	require.NoError(t, s.Write(ctx, []ledger.Batch{{NS: ledger.DefaultNamespace, Ops: []ledger.Op{ledger.OpFunc(
		func(ctx context.Context, tx ledger.Tx) error {
			_, err := appendCommitted(ctx, tx, n+1)
			return err
		})}}}))
	got, err = pr.Openings(ctx, []uint64{n + 1})
	require.NoError(t, err)
	assert.Equal(t, `{"n":71}`, got[n+1].Get(chain.FieldResult).Value)
}
