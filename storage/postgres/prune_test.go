package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/postgres"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// keptTxReader reads stored tree hashes in tx as the domain does
// (ledger/kepttree.go): those of levels 0–7 that a deleted leaf completed
// from the kept tiles, the rest from the driver.
func keptTxReader(ctx context.Context, tx ledger.Tx) sumdb.HashReader {
	return sumdb.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		return keptRead(ctx, locked(tx).Pruned.Kept, idx, tx.ReadHashes, tx.KeptTiles)
	})
}

func keptRead(ctx context.Context, kept uint64, idx []int64, read func(context.Context, []int64) ([]tlog.Hash, error),
	tiles func(context.Context, []int64) ([]tlog.KeptTile, error)) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	var live []int64
	var at []int
	for i, x := range idx {
		level, n := sumdb.SplitStoredHashIndex(x)
		if level >= 8 || uint64((n+1)<<level) > kept { // completing leaf (n+1)<<level - 1 ≥ kept
			live, at = append(live, x), append(at, i)
			continue
		}
		kts, err := tiles(ctx, []int64{tlog.KeptTileOf(x)})
		if err != nil || len(kts) != 1 {
			return nil, fmt.Errorf("kept tile of %d: %v (%d)", x, err, len(kts))
		}
		h, ok := kts[0].StoredHash(x)
		if !ok {
			return nil, fmt.Errorf("kept tile %d lacks %d", kts[0].Tile, x)
		}
		out[i] = h
	}
	if len(live) > 0 {
		hs, err := read(ctx, live)
		if err != nil {
			return nil, err
		}
		for j, i := range at {
			out[i] = hs[j]
		}
	}
	return out, nil
}

// appendKept is appendReceipt over keptTxReader.
func appendKept(ctx context.Context, tx ledger.Tx, r chain.Receipt) (chain.Receipt, error) {
	h := locked(tx).Head
	r.RecordedAt = locked(tx).Now
	l := chain.Link(h.Seq, h.Hash, r)
	hs, err := sumdb.StoredHashes(tlog.LeafIndex(l.Seq), l.Hash[:], keptTxReader(ctx, tx))
	if err != nil {
		return l, fmt.Errorf("tree hashes: %w", err)
	}
	return l, tx.Append(ctx, &l, hs)
}

// pairs appends a reserve and a committed success for each of keys, with
// the result's value kept off the chain (a committed namespace), an asked
// input beside each reserve and a reconciled token beside every fourth.
func pairs(ctx context.Context, tx ledger.Tx, keys []string) error {
	for i, key := range keys {
		k, found, err := tx.Key(ctx, key)
		if err != nil {
			return err
		}
		r := chain.Receipt{Kind: chain.KindReserve, IdempotencyKey: key, ExecutionID: "e", Attempt: 1, Tool: "t",
			Effect: chain.EffectWrite, InputHash: "in-" + key, LeaseExpiresAt: locked(tx).Now + 1000}
		if found {
			r.RefSeq = k.FinalSeq // a renewal: a new generation
		}
		res, err := appendKept(ctx, tx, r)
		if err != nil {
			return err
		}
		k = ledger.KeyRecord{Key: key, Tool: "t", Effect: chain.EffectWrite, InputHash: r.InputHash, FirstSeq: res.Seq}
		k.ReserveSeq, k.LeaseExpiresAt, k.TokenHash = res.Seq, r.LeaseExpiresAt, "token-"+key
		if err := tx.PutAskInput(ctx, res.Seq, `{"ask":"`+key+`"}`, locked(tx).Now+1e9, 0); err != nil {
			return err
		}
		if i%4 == 0 {
			if err := tx.PutReconciledToken(ctx, key, strings.Repeat("x", 32), res.Seq); err != nil {
				return err
			}
		}
		c := chain.Receipt{Kind: chain.KindCommit, IdempotencyKey: key, ExecutionID: "e", Attempt: 1, Tool: "t",
			Effect: chain.EffectWrite, InputHash: r.InputHash, Outcome: chain.OutcomeSucceeded, Result: `{"n":"` + key + `"}`,
			RefSeq: res.Seq}
		o := chain.CommitFields(&c)
		c.Open = &o
		fin, err := appendKept(ctx, tx, c)
		if err != nil {
			return err
		}
		k.FinalSeq = fin.Seq
		if err := tx.PutKey(ctx, &k); err != nil {
			return err
		}
	}
	return nil
}

// prune appends a prune receipt of from … through and records it, as the
// domain's prune op does.
func prune(ctx context.Context, tx ledger.Tx, from, through uint64, kept []ledger.KeptBody) (uint64, error) {
	r, err := appendKept(ctx, tx, chain.Receipt{Kind: chain.KindPrune, Actor: "test",
		Result: fmt.Sprintf(`{"digest":"d","from":%d,"policy":{"seq":0,"text":""},"through":%d}`, from, through)})
	if err != nil {
		return 0, err
	}
	return r.Seq, tx.PutPrune(ctx, &ledger.Prune{Seq: r.Seq, From: from, Through: through, Digest: "d",
		Segment: fmt.Sprintf("p-%d-%d", from, through), Kept: kept})
}

func keyNames(from, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("key-%012d", from+i)
	}
	return out
}

// storedTree reads every stored tree hash of a tree of size leaves.
func storedTree(t *testing.T, c *postgres.Chain, size int64) []tlog.Hash {
	t.Helper()
	idx := make([]int64, sumdb.StoredHashCount(size))
	for i := range idx {
		idx[i] = int64(i)
	}
	hs, err := c.HashReader(context.Background()).ReadHashes(idx)
	require.NoError(t, err)
	return hs
}

// refused runs sql in a transaction marked as the pruner's (mark) and
// requires the guards to refuse it.
func refused(t *testing.T, u string, mark bool, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	conn := connect(t, u)
	defer func() { _ = conn.Close(ctx) }()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	if mark {
		_, err = tx.Exec(ctx, `SELECT set_config('effect_ledger.pruner', 'on', true)`)
		require.NoError(t, err)
	}
	_, err = tx.Exec(ctx, sql, args...)
	require.Error(t, err, "%s: allowed", sql)
	require.Contains(t, err.Error(), "SQLSTATE 23001", "%s", sql) // restrict_violation
}

func count(t *testing.T, u, sql string, args ...any) int {
	t.Helper()
	ctx := context.Background()
	conn := connect(t, u)
	defer func() { _ = conn.Close(ctx) }()
	var n int
	require.NoError(t, conn.QueryRow(ctx, sql, args...).Scan(&n), sql)
	return n
}

// TestPrune_deleteInBatches prunes 520 of 610 receipts and deletes their
// bodies in batches: the kept tiles are the receipts' hashes, every
// stored tree hash is still read (from the driver, or recomputed from a
// kept tile), the derived rows go, the guards refuse what the ledger's
// deletion would not do, and a stale batch is refused.
func TestPrune_deleteInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	s := mustOpen(t, u, postgres.Options{Logger: quiet})
	require.NoError(t, s.CreateNamespace(ctx, "p", ledger.NamespaceSettings{KeyTTL: 60_000, Payloads: ledger.PayloadsCommitted}))
	c := mustChain(t, s, "p")
	for i := 0; i < 300; i += 50 {
		update(t, c, func(ctx context.Context, tx ledger.Tx) error { return pairs(ctx, tx, keyNames(i, 50)) })
	}
	// key 0 is reserved again after its generation: a later generation, live.
	update(t, c, func(ctx context.Context, tx ledger.Tx) error { return pairs(ctx, tx, []string{"key-000000000000"}) })
	before := allReceipts(t, c)
	require.Len(t, before, 602)
	var keyBody string
	var pruneSeq uint64
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		var err error
		keyBody = `{"key":"body"}`
		pruneSeq, err = prune(ctx, tx, 1, 520, []ledger.KeptBody{{Seq: 7, Body: keyBody}})
		if err != nil {
			return err
		}
		if m := locked(tx).Pruned; m.Through != 520 || m.Kept != 0 || m.Seq != pruneSeq || m.Segment != "p-1-520" {
			return fmt.Errorf("Locked.Pruned after PutPrune = %+v", m)
		}
		return nil
	})
	require.Equal(t, uint64(603), pruneSeq)
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		return pairs(ctx, tx, keyNames(300, 3)) // 604 … 609
	})
	size, err := c.TreeSize(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(609), size)
	tree := storedTree(t, c, size)
	hashes, err := c.ReceiptHashes(ctx, 0, int(size))
	require.NoError(t, err)
	m, err := c.Pruned(ctx)
	require.NoError(t, err)
	require.Equal(t, ledger.PruneMark{Through: 520, Kept: 0, Seq: pruneSeq, Segment: "p-1-520"}, m)

	// The guards, before any deletion: nothing kept, so nothing goes.
	refused(t, u, true, `DELETE FROM receipts WHERE namespace = 'p' AND seq = 1`)
	refused(t, u, false, `DELETE FROM keys WHERE namespace = 'p' AND idempotency_key = 'key-000000000001'`)
	refused(t, u, false, `DELETE FROM tree_hashes WHERE namespace = 'p' AND idx = 0`)
	refused(t, u, false, `DELETE FROM payloads WHERE namespace = 'p' AND seq = 2`)
	refused(t, u, false, `INSERT INTO kept_tiles (namespace, tile, hashes) VALUES ('p', 0, $1)`, make([]byte, 32))
	refused(t, u, false, `UPDATE prunes SET deleted_through = 10 WHERE namespace = 'p'`)
	refused(t, u, true, `DELETE FROM prunes WHERE namespace = 'p'`)
	refused(t, u, true, `DELETE FROM payloads WHERE namespace = 'p' AND seq = 2`) // its receipt is there
	refused(t, u, true, `DELETE FROM receipts WHERE namespace = 'p' AND seq = 540`)
	// A kept hash that is not the receipt's: its receipt stays.
	{
		conn := connect(t, u)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT set_config('effect_ledger.pruner', 'on', true)`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO kept_tiles (namespace, tile, hashes) VALUES ('p', 0, $1)`, make([]byte, 64))
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `DELETE FROM receipts WHERE namespace = 'p' AND seq = 1`)
		require.ErrorContains(t, err, "only a pruned receipt whose hash is kept may go")
		_ = tx.Rollback(ctx)
		_ = conn.Close(ctx)
	}

	mac := func(k string) uint64 { return uint64(len(k))<<32 | uint64(k[len(k)-1]) }
	batch := func(from, to uint64) ledger.DeleteBatch {
		keys, err := c.KeysIn(ctx, from, to)
		require.NoError(t, err)
		b := ledger.DeleteBatch{Prune: pruneSeq, From: from, To: to}
		for _, k := range keys {
			b.KeyMACs = append(b.KeyMACs, mac(k)<<8|uint64(len(b.KeyMACs)))
		}
		return b
	}
	keys, err := c.KeysIn(ctx, 1, 4)
	require.NoError(t, err)
	require.Equal(t, []string{"key-000000000000", "key-000000000001"}, keys)

	require.NoError(t, s.DeletePruned(ctx, "p", batch(1, 256)))
	m, err = c.Pruned(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(256), m.Kept)
	err = s.DeletePruned(ctx, "p", batch(1, 256))
	require.ErrorContains(t, err, "has deleted through 256", "a stale batch")
	require.ErrorContains(t, s.DeletePruned(ctx, "p", ledger.DeleteBatch{Prune: pruneSeq, From: 257, To: 521}), "covers receipts through 520")
	require.ErrorContains(t, s.DeletePruned(ctx, "p", ledger.DeleteBatch{Prune: 600, From: 257, To: 300}), "no prune receipt 600")
	require.NoError(t, s.DeletePruned(ctx, "p", batch(257, 300))) // a partial tile
	require.NoError(t, s.DeletePruned(ctx, "p", batch(301, 515))) // extended, and the next one begun
	require.NoError(t, s.DeletePruned(ctx, "p", batch(516, 520)))
	require.Eventually(t, func() bool { // the last batch vacuums the tables it deleted from
		return count(t, u, `SELECT count(*) FROM pg_stat_user_tables WHERE relname = 'receipts' AND last_vacuum IS NOT NULL`) == 1
	}, 20*time.Second, 50*time.Millisecond)

	// What was written.
	m, err = c.Pruned(ctx)
	require.NoError(t, err)
	require.Equal(t, ledger.PruneMark{Through: 520, Kept: 520, Seq: pruneSeq, Segment: "p-1-520"}, m)
	ps, err := c.Prunes(ctx)
	require.NoError(t, err)
	require.Equal(t, []ledger.Prune{{Seq: pruneSeq, From: 1, Through: 520, Digest: "d", Segment: "p-1-520", DeletedThrough: 520}}, ps)
	kr, err := c.KeptReceipts(ctx)
	require.NoError(t, err)
	require.Equal(t, []ledger.KeptBody{{Seq: 7, Body: keyBody}}, kr)
	by, err := c.WasPruned(ctx, mac("key-000000000001")<<8|1)
	require.NoError(t, err)
	require.Equal(t, pruneSeq, by)
	by, err = c.WasPruned(ctx, 12345)
	require.NoError(t, err)
	require.Zero(t, by)
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		if got := locked(tx).Pruned; got != m {
			return fmt.Errorf("Locked.Pruned = %+v, want %+v", got, m)
		}
		return nil
	})

	// The kept tiles are the receipts' hashes; full ones carry their upper hashes.
	kts, err := c.KeptTiles(ctx, []int64{0, 1, 2, 3})
	require.NoError(t, err)
	require.Len(t, kts, 3)
	for i, kt := range kts {
		require.Equal(t, int64(i), kt.Tile)
		want := hashes[i*256 : min((i+1)*256, 520)]
		require.Equal(t, want, kt.Hashes, "tile %d", i)
		if len(kt.Hashes) == 256 {
			for j, x := range tlog.KeptUpperIndexes(kt.Tile) {
				require.Equal(t, tree[x], kt.Upper[j])
			}
		} else {
			require.Empty(t, kt.Upper)
		}
	}
	// Every stored hash is still there: from the driver (a fresh store's,
	// whose tree cache is empty), or from a kept tile.
	rd := mustChain(t, mustOpen(t, u, postgres.Options{Logger: quiet}), "p").HashReader(ctx)
	gone := 0
	for x := range tree {
		got, err := rd.ReadHashes([]int64{int64(x)})
		if err != nil {
			level, n := sumdb.SplitStoredHashIndex(int64(x))
			require.Less(t, level, 8, "tree hash %d (level %d)", x, level)
			require.LessOrEqual(t, (n+1)<<level, int64(520), "tree hash %d", x)
			kts, err := c.KeptTiles(ctx, []int64{tlog.KeptTileOf(int64(x))})
			require.NoError(t, err)
			h, ok := kts[0].StoredHash(int64(x))
			require.True(t, ok, "tree hash %d", x)
			got = []tlog.Hash{h}
			gone++
		}
		require.Equal(t, tree[x], got[0], "tree hash %d", x)
	}
	want := 0
	for x := range tree {
		if level, n := sumdb.SplitStoredHashIndex(int64(x)); level < 8 && (n+1)<<level <= 512 {
			want++
		}
	}
	require.Equal(t, want, gone, "levels 0–7 of the full tiles pruned (leaves 0 … 511) are gone, the rest stay")
	got, err := c.ReceiptHashes(ctx, 0, int(size))
	require.NoError(t, err)
	require.Equal(t, hashes, got)
	got, err = c.ReceiptHashes(ctx, 510, 20)
	require.NoError(t, err)
	require.Equal(t, hashes[510:530], got)
	got, err = c.ReceiptHashes(ctx, 100, 5)
	require.NoError(t, err)
	require.Equal(t, hashes[100:105], got)
	n, err := c.TreeSize(ctx)
	require.NoError(t, err)
	require.Equal(t, size, n)

	// The bodies and their derived rows are gone; the live ones stay.
	rs := allReceipts(t, c)
	require.Equal(t, uint64(521), rs[0].Seq)
	require.Equal(t, before[520:], rs[:602-520])
	require.Zero(t, count(t, u, `SELECT count(*) FROM payloads WHERE namespace = 'p' AND seq <= 520`))
	require.NotZero(t, count(t, u, `SELECT count(*) FROM payloads WHERE namespace = 'p' AND seq > 520`))
	require.Zero(t, count(t, u, `SELECT count(*) FROM approval_inputs WHERE namespace = 'p' AND ask_seq <= 520`))
	require.Equal(t, 44, count(t, u, `SELECT count(*) FROM approval_inputs WHERE namespace = 'p'`))
	require.Zero(t, count(t, u, `SELECT count(*) FROM reconciled_tokens WHERE namespace = 'p' AND reserve_seq <= 520`))
	// keys 260 … 302 and key 0's second generation
	require.Equal(t, 44, count(t, u, `SELECT count(*) FROM keys WHERE namespace = 'p'`))
	_, err = c.GetKey(ctx, "key-000000000001")
	require.Equal(t, ledger.ECodeUnknownKey, ledger.ErrorCode(err), "GetKey of a pruned key: %v", err)
	v, err := c.GetKey(ctx, "key-000000000000") // its first generation pruned
	require.NoError(t, err)
	require.Len(t, v.Receipts, 2)
	require.Equal(t, uint64(601), v.FirstSeq)

	// Writes go on over the pruned tile: the frontier reads kept hashes.
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		if err := pairs(ctx, tx, keyNames(303, 10)); err != nil {
			return err
		}
		h, err := tx.KeyHistory(ctx, "key-000000000000", 1)
		if err != nil || len(h) != 2 || h[0].Seq != 601 {
			return fmt.Errorf("KeyHistory from 1 = %d receipts, %v", len(h), err)
		}
		if _, found, err := tx.MaxAttempt(ctx, "key-000000000001", "e", 1); found || err != nil {
			return fmt.Errorf("MaxAttempt of a pruned key: %v, %v", found, err)
		}
		if seq, err := tx.LastSeq(ctx, "key-000000000000"); seq != 602 || err != nil {
			return fmt.Errorf("LastSeq = %d, %v", seq, err)
		}
		var outcomes []uint64
		if err := tx.RecentOutcomes(ctx, "t", "in-key-000000000000", 0, func(r *chain.Receipt) bool {
			outcomes = append(outcomes, r.Seq)
			return true
		}); err != nil || len(outcomes) != 1 || outcomes[0] != 602 {
			return fmt.Errorf("RecentOutcomes = %v, %v", outcomes, err)
		}
		if o, err := tx.Openings(ctx, []uint64{2, 602}); err != nil || len(o) != 1 || o[602] == nil {
			return fmt.Errorf("Openings = %v, %v", o, err)
		}
		return nil
	})
	page, next, err := c.ListReceipts(ctx, ledger.ReceiptFilter{Limit: 10})
	require.NoError(t, err)
	require.Equal(t, uint64(521), page[0].Seq)
	require.NotNil(t, next)
	page, _, err = c.ListReceipts(ctx, ledger.ReceiptFilter{Key: "key-000000000000", Limit: 10})
	require.NoError(t, err)
	require.Len(t, page, 2)
	checkKeptTree(t, c, 520)

	// After the deletion, the guards still refuse.
	refused(t, u, true, `DELETE FROM receipts WHERE namespace = 'p' AND seq = 521`)
	refused(t, u, true, `UPDATE receipts SET note = 'x' WHERE namespace = 'p' AND seq = 521`)
	refused(t, u, true, `UPDATE kept_tiles SET hashes = substring(hashes FROM 1 FOR 32) WHERE namespace = 'p' AND tile = 2`)
	refused(t, u, true, `DELETE FROM kept_tiles WHERE namespace = 'p'`)
	refused(t, u, true, `UPDATE prunes SET deleted_through = 100 WHERE namespace = 'p'`)
	refused(t, u, true, `DELETE FROM pruned_keys WHERE namespace = 'p'`)
	refused(t, u, true, `DELETE FROM kept_receipts WHERE namespace = 'p'`)
	refused(t, u, false, `TRUNCATE kept_tiles`)
}

// checkKeptTree recomputes the tree over the chain's hashes (the kept ones
// and the stored receipts') and compares every stored hash, read as the
// domain reads them.
func checkKeptTree(t *testing.T, c *postgres.Chain, kept uint64) {
	t.Helper()
	ctx := context.Background()
	size, err := c.TreeSize(ctx)
	require.NoError(t, err)
	hs, err := c.ReceiptHashes(ctx, 0, int(size))
	require.NoError(t, err)
	require.Len(t, hs, int(size))
	var want []tlog.Hash
	r := sumdb.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(idx))
		for i, x := range idx {
			out[i] = want[x]
		}
		return out, nil
	})
	for i := range hs {
		add, err := sumdb.StoredHashes(int64(i), hs[i][:], r)
		require.NoError(t, err)
		want = append(want, add...)
	}
	idx := make([]int64, len(want))
	for i := range idx {
		idx[i] = int64(i)
	}
	got, err := keptRead(ctx, kept, idx, func(ctx context.Context, idx []int64) ([]tlog.Hash, error) {
		return c.HashReader(ctx).ReadHashes(idx)
	}, c.KeptTiles)
	require.NoError(t, err)
	require.Equal(t, want, got)
}

// TestPrune_unfinishedEarlier: a prune recorded while an earlier one's
// deletion is unfinished leaves the kept prefix where that deletion is,
// and its own deletion waits for it.
func TestPrune_unfinishedEarlier(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	s := mustOpen(t, u, postgres.Options{Logger: quiet})
	require.NoError(t, s.CreateNamespace(ctx, "q", ledger.NamespaceSettings{KeyTTL: 1000}))
	c := mustChain(t, s, "q")
	update(t, c, func(ctx context.Context, tx ledger.Tx) error { return pairs(ctx, tx, keyNames(0, 20)) })
	var first, second uint64
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		var err error
		first, err = prune(ctx, tx, 1, 10, nil)
		return err
	})
	require.NoError(t, s.DeletePruned(ctx, "q", ledger.DeleteBatch{Prune: first, From: 1, To: 4}))
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		r, err := appendKept(ctx, tx, chain.Receipt{Kind: chain.KindPrune, Actor: "test", Result: "{}"})
		if err != nil {
			return err
		}
		if err := tx.PutPrune(ctx, &ledger.Prune{Seq: r.Seq, From: 12, Through: 20}); err == nil {
			return errors.New("a prune that does not start after the last one was recorded")
		}
		second = r.Seq
		return tx.PutPrune(ctx, &ledger.Prune{Seq: r.Seq, From: 11, Through: 20, Digest: "d", Segment: "p-11-20"})
	})
	{
		conn := connect(t, u)
		_, err := conn.Exec(ctx, `INSERT INTO prunes VALUES ('q', 42, 15, 20, 'd', 's', 14)`)
		require.ErrorContains(t, err, "starts after the last one")
		_, err = conn.Exec(ctx, `INSERT INTO prunes VALUES ('q', 40, 21, 30, 'd', 's', 20)`)
		require.Error(t, err)                                                                // through < seq
		_, err = conn.Exec(ctx, `INSERT INTO prunes VALUES ('q', 43, 21, 30, 'd', 's', 20)`) // seq 43: no receipt
		require.ErrorContains(t, err, "must name a stored prune receipt")
		_ = conn.Close(ctx)
	}
	m, err := c.Pruned(ctx)
	require.NoError(t, err)
	require.Equal(t, ledger.PruneMark{Through: 20, Kept: 4, Seq: second, Segment: "p-11-20"}, m)
	require.ErrorContains(t, s.DeletePruned(ctx, "q", ledger.DeleteBatch{Prune: second, From: 11, To: 20}),
		fmt.Sprintf("the deletion of the earlier prune %d is unfinished", first))
	require.NoError(t, s.DeletePruned(ctx, "q", ledger.DeleteBatch{Prune: first, From: 5, To: 10}))
	require.NoError(t, s.DeletePruned(ctx, "q", ledger.DeleteBatch{Prune: second, From: 11, To: 20}))
	m, err = c.Pruned(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(20), m.Kept)
	kts, err := c.KeptTiles(ctx, []int64{0})
	require.NoError(t, err)
	require.Len(t, kts[0].Hashes, 20)
	checkKeptTree(t, c, 20)

	// A prunes row must name a prune receipt of the chain.
	err = c.Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
		if err := pairs(ctx, tx, []string{"z"}); err != nil {
			return err
		}
		return tx.PutPrune(ctx, &ledger.Prune{Seq: locked(tx).Head.Seq, From: 21, Through: 30})
	})
	require.ErrorContains(t, err, "not a prune receipt")
}

// TestPrune_markAfterLockWait: a write that waited for the head lock of a
// write recording a prune reads that prune in its Locked.Pruned. (Read in
// the head statement itself, the prunes row would come from the snapshot
// taken before the wait: the row locked is re-read, the other tables not.)
func TestPrune_markAfterLockWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	a := mustOpen(t, u, postgres.Options{Logger: quiet})
	require.NoError(t, a.CreateNamespace(ctx, "w", ledger.NamespaceSettings{KeyTTL: 1000}))
	update(t, mustChain(t, a, "w"), func(ctx context.Context, tx ledger.Tx) error { return pairs(ctx, tx, keyNames(0, 4)) })
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	postgres.SetBeforeCommit(a, func(uint32) { once.Do(func() { close(held); <-release }) })
	pruned := make(chan error, 1)
	go func() {
		pruned <- mustChain(t, a, "w").Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
			_, err := prune(ctx, tx, 1, 6, nil)
			return err
		})
	}()
	<-held // the prune's write holds the head row, before its COMMIT
	b := mustOpen(t, u, postgres.Options{Logger: quiet})
	seen := make(chan ledger.PruneMark, 1)
	done := make(chan error, 1)
	go func() {
		done <- mustChain(t, b, "w").Update(ctx, func(ctx context.Context, tx ledger.Tx) error {
			seen <- locked(tx).Pruned
			return nil
		})
	}()
	require.Eventually(t, func() bool {
		return queryInt(t, u, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%FROM head%'`) == 1
	}, 10*time.Second, 10*time.Millisecond, "the second write waits for the head lock")
	close(release)
	require.NoError(t, <-pruned)
	require.NoError(t, <-done)
	require.Equal(t, ledger.PruneMark{Through: 6, Kept: 0, Seq: 9, Segment: "p-1-6"}, <-seen)
}

// TestOpen_migratesV4Prunes: a schema 4 database migrates to 5, and the
// migration runs again unharmed (its statements are idempotent).
func TestOpen_migratesV4Prunes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	s := mustOpen(t, u, postgres.Options{Logger: quiet})
	c := mustChain(t, s, ledger.DefaultNamespace)
	update(t, c, func(ctx context.Context, tx ledger.Tx) error { return pairs(ctx, tx, keyNames(0, 2)) })
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		_, err := prune(ctx, tx, 1, 2, nil)
		return err
	})
	require.NoError(t, s.Close())
	psql(t, u, `UPDATE schema_version SET version = 4`)
	again := mustOpen(t, u, postgres.Options{Logger: quiet})
	require.Equal(t, postgres.SchemaVersion, schemaVersion(t, u))
	require.NoError(t, again.DeletePruned(ctx, ledger.DefaultNamespace, ledger.DeleteBatch{Prune: 5, From: 1, To: 2}))
	m, err := mustChain(t, again, ledger.DefaultNamespace).Pruned(ctx)
	require.NoError(t, err)
	require.Equal(t, ledger.PruneMark{Through: 2, Kept: 2, Seq: 5, Segment: "p-1-2"}, m)
	for _, trigger := range []string{"receipts_guard", "receipts_pruned", "receipts_append_only", "tree_hashes_guard",
		"keys_guard", "prunes_guard", "kept_tiles_guard", "payloads_guard", "payloads_kept", "payloads_pruned"} {
		require.Equal(t, 1, queryInt(t, u, `SELECT count(*) FROM pg_trigger WHERE tgname = '`+trigger+`'`), trigger)
	}
	refused(t, u, true, `DELETE FROM receipts WHERE seq = 3`)
}

// TestPrune_keyHeldByWriter: a key record that a writer holds is left by
// the deletion, which does not wait for it; its record reads with no
// receipts, and the next prune's last batch deletes it.
func TestPrune_keyHeldByWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	s := mustOpen(t, u, postgres.Options{Logger: quiet})
	require.NoError(t, s.CreateNamespace(ctx, "h", ledger.NamespaceSettings{KeyTTL: 1000}))
	c := mustChain(t, s, "h")
	update(t, c, func(ctx context.Context, tx ledger.Tx) error { return pairs(ctx, tx, keyNames(0, 20)) })
	var first uint64
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		var err error
		first, err = prune(ctx, tx, 1, 20, nil)
		return err
	})
	conn := connect(t, u)
	defer func() { _ = conn.Close(ctx) }()
	held, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = held.Exec(ctx, `SELECT 1 FROM keys WHERE namespace = 'h' AND idempotency_key = 'key-000000000001' FOR UPDATE`)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, s.DeletePruned(short, "h", ledger.DeleteBatch{Prune: first, From: 1, To: 20}))
	require.NoError(t, held.Rollback(ctx))
	require.Equal(t, 1, count(t, u, `SELECT count(*) FROM keys WHERE namespace = 'h' AND first_seq <= 20`))
	v, err := c.GetKey(ctx, "key-000000000001")
	require.NoError(t, err)
	require.Empty(t, v.Receipts)
	require.Equal(t, uint64(3), v.FirstSeq)

	var second uint64
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		var err error
		second, err = prune(ctx, tx, 21, 30, nil)
		return err
	})
	require.NoError(t, s.DeletePruned(ctx, "h", ledger.DeleteBatch{Prune: second, From: 21, To: 30}))
	require.Zero(t, count(t, u, `SELECT count(*) FROM keys WHERE namespace = 'h' AND first_seq <= 30`))
	require.Equal(t, 5, count(t, u, `SELECT count(*) FROM keys WHERE namespace = 'h'`))
	checkKeptTree(t, c, 30)
}

// TestPrune_thinCheckpoints: a batch deletes the checkpoints it is given
// to thin; the guard refuses the others (not covered by a prune, or the
// latest one) and any without the pruner mark.
func TestPrune_thinCheckpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	s := mustOpen(t, u, postgres.Options{Logger: quiet})
	require.NoError(t, s.CreateNamespace(ctx, "c", ledger.NamespaceSettings{KeyTTL: 1000}))
	c := mustChain(t, s, "c")
	for i := 0; i < 4; i++ {
		update(t, c, func(ctx context.Context, tx ledger.Tx) error {
			if err := pairs(ctx, tx, keyNames(3*i, 3)); err != nil {
				return err
			}
			return tx.PutCheckpoint(ctx, &tlog.Signed{Size: int64(locked(tx).Head.Seq), Note: "n"})
		})
	}
	var p uint64
	update(t, c, func(ctx context.Context, tx ledger.Tx) error {
		var err error
		p, err = prune(ctx, tx, 1, 18, nil)
		return err
	})
	cs, err := c.CheckpointTimes(ctx, 18)
	require.NoError(t, err)
	require.Len(t, cs, 3)
	for i, size := range []int64{6, 12, 18} {
		require.Equal(t, size, cs[i].Size)
		require.NotZero(t, cs[i].SignedAt)
	}
	refused(t, u, false, `DELETE FROM checkpoints WHERE namespace = 'c' AND size = 6`)
	refused(t, u, true, `DELETE FROM checkpoints WHERE namespace = 'c' AND size = 24`) // not pruned, and the latest
	refused(t, u, true, `UPDATE checkpoints SET note = 'x' WHERE namespace = 'c' AND size = 6`)
	require.NoError(t, s.DeletePruned(ctx, "c", ledger.DeleteBatch{Prune: p, From: 1, To: 18, Thin: []int64{6, 12, 24}}))
	cs, err = c.CheckpointTimes(ctx, 100)
	require.NoError(t, err)
	require.Len(t, cs, 2)
	require.Equal(t, []int64{18, 24}, []int64{cs[0].Size, cs[1].Size})
}
