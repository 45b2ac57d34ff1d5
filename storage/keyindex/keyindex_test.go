package keyindex_test

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/keyindex"
)

var quiet = slog.New(slog.DiscardHandler)

func open(t *testing.T, dir string) *keyindex.Index {
	t.Helper()
	ix, err := keyindex.Open(dir, keyindex.Options{Logger: quiet})
	require.NoError(t, err)
	return ix
}

// receipt is a receipt of key with the given kind at seq.
func receipt(seq uint64, kind, key, exec, tool string, attempt uint64) *chain.Receipt {
	r := &chain.Receipt{Seq: seq, Kind: kind, IdempotencyKey: key, ExecutionID: exec, Tool: tool, Attempt: attempt,
		Effect: chain.EffectWrite, RecordedAt: 1_000 * seq, LeaseExpiresAt: 1_000*seq + 30_000}
	r.Hash[0], r.Hash[1] = byte(seq), byte(seq>>8)
	return r
}

// TestIndex_postingLists: each list holds its receipts in seq order, a
// field that is a prefix of another (or holds a NUL) keeps its own list,
// and namespaces never see each other's entries.
func TestIndex_postingLists(t *testing.T) {
	ix := open(t, filepath.Join(t.TempDir(), "idx"))
	defer ix.Close()
	rs := []*chain.Receipt{
		receipt(1, chain.KindReserve, "key-a", "exec", "tool", 1),
		receipt(2, chain.KindReserve, "key-ab", "exec\x00x", "tool.x", 1),
		receipt(3, chain.KindCommit, "key-a", "exec", "tool", 1),
		receipt(4, chain.KindReserve, "key-a", "exec", "tool", 2),
		receipt(300, chain.KindReplay, "key-a", "exec-2", "tool", 1),
	}
	for _, ns := range []string{"a", "ab"} {
		b := ix.NewBatch(ns)
		for _, r := range rs {
			require.NoError(t, b.Receipt(r))
		}
		require.NoError(t, b.Commit(ledger.Head{Seq: 300, Hash: rs[4].Hash}))
		b.Close()
	}
	seqs := func(ns string, f keyindex.Field, v string, after uint64) []uint64 {
		var out []uint64
		require.NoError(t, ix.Seqs(ns, f, v, after, func(seq uint64, _ []byte) (bool, error) {
			out = append(out, seq)
			return true, nil
		}))
		return out
	}
	assert.Equal(t, []uint64{1, 3, 4, 300}, seqs("a", keyindex.ByKey, "key-a", 0))
	assert.Equal(t, []uint64{4, 300}, seqs("a", keyindex.ByKey, "key-a", 3))
	assert.Equal(t, []uint64{2}, seqs("a", keyindex.ByKey, "key-ab", 0))
	assert.Equal(t, []uint64{2}, seqs("a", keyindex.ByExecution, "exec\x00x", 0))
	assert.Equal(t, []uint64{1, 3, 4}, seqs("a", keyindex.ByExecution, "exec", 0))
	assert.Equal(t, []uint64{1, 3, 4, 300}, seqs("a", keyindex.ByTool, "tool", 0))
	assert.Equal(t, []uint64{1, 2, 4}, seqs("ab", keyindex.ByKind, chain.KindReserve, 0))
	assert.Empty(t, seqs("b", keyindex.ByKey, "key-a", 0))

	last, found, err := ix.LastSeq("a", "key-a")
	require.NoError(t, err)
	assert.True(t, found)
	assert.Equal(t, uint64(300), last)
	require.NoError(t, ix.Drop("a"))
	assert.Empty(t, seqs("a", keyindex.ByKey, "key-a", 0))
	_, found, err = ix.Watermark("a")
	require.NoError(t, err)
	assert.False(t, found)
	assert.Equal(t, []uint64{1, 3, 4, 300}, seqs("ab", keyindex.ByKey, "key-a", 0), "dropping a leaves ab")
}

// TestIndex_records: key records round-trip, with every field but the
// fingerprint (the reader takes it from the first reserve) and a token
// hash holding any bytes, and survive a reopen with the watermark.
func TestIndex_records(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "idx")
	ix := open(t, dir)
	want := ledger.KeyRecord{Key: "key-\x00-1", Generated: true, Tool: "payments.refund", Effect: chain.EffectWrite,
		InputHash: "sha256:00ff", Idempotent: true, FirstSeq: 7, ReserveSeq: 1 << 40, LeaseExpiresAt: 1<<63 + 5,
		FinalSeq: 9, TokenHash: "\x00\xff token"}
	b := ix.NewBatch("default")
	require.NoError(t, b.PutKey(&want))
	head := ledger.Head{Seq: 9}
	head.Hash[31] = 1
	require.NoError(t, b.Commit(head))
	b.Close()
	require.NoError(t, ix.Sync())
	require.NoError(t, ix.Close())

	ix = open(t, dir)
	defer ix.Close()
	got, found, err := ix.Key("default", want.Key)
	require.NoError(t, err)
	require.True(t, found)
	want.Tool, want.Effect, want.InputHash = "", "", "" // the first reserve's: not stored
	assert.Equal(t, want, got)
	wm, found, err := ix.Watermark("default")
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, head, wm)
	_, found, err = ix.Key("other", want.Key)
	require.NoError(t, err)
	assert.False(t, found)
}

// chainSource serves a Deriver from receipts in memory.
type chainSource struct {
	rs     map[uint64]*chain.Receipt
	tokens map[uint64]string
}

func (c chainSource) Receipt(seq uint64) (*chain.Receipt, error) { return c.rs[seq], nil }
func (c chainSource) TokenHash(seq uint64) (string, error)       { return c.tokens[seq], nil }

// TestDeriver_generations: replaying receipts gives each key the record
// SPEC §4 and §12 give it, in one go or across a flush and a restart.
func TestDeriver_generations(t *testing.T) {
	const ttl = 60_000
	r := func(seq uint64, kind, key string, ref, at uint64) *chain.Receipt {
		rc := receipt(seq, kind, key, "exec", "tool", 1)
		rc.RefSeq, rc.RecordedAt = ref, at
		return rc
	}
	rs := []*chain.Receipt{
		r(1, chain.KindReserve, "renewed-key", 0, 1_000),
		r(2, chain.KindCommit, "renewed-key", 1, 2_000),
		r(3, chain.KindReserve, "renewed-key", 2, 2_000+ttl-1), // too early: the same generation (a rule the verifier reports)
		r(4, chain.KindReserve, "renewed-key", 2, 2_000+ttl),   // renews
		r(5, chain.KindReserve, "open-key-01", 0, 5_000),
		r(6, chain.KindReplay, "renewed-key", 4, 6_000),
		r(7, chain.KindCommit, "ghost-key-01", 99, 7_000), // no reserve: no record
	}
	src := chainSource{rs: map[uint64]*chain.Receipt{}, tokens: map[uint64]string{4: "tok-4", 5: "tok-5"}}
	for _, rc := range rs {
		src.rs[rc.Seq] = rc
	}
	ix := open(t, filepath.Join(t.TempDir(), "idx"))
	defer ix.Close()
	for split := range len(rs) + 1 {
		ns := fmt.Sprintf("ns%d", split)
		d := ix.NewDeriver(ns, ttl, ledger.Head{}, src)
		for _, rc := range rs[:split] {
			require.NoError(t, d.Apply(rc))
		}
		head, err := d.Finish()
		require.NoError(t, err)
		d = ix.NewDeriver(ns, ttl, head, src) // the rest after a restart
		for _, rc := range rs[split:] {
			require.NoError(t, d.Apply(rc))
		}
		head, err = d.Finish()
		require.NoError(t, err)
		assert.Equal(t, uint64(7), head.Seq)

		k, found, err := ix.Key(ns, "renewed-key")
		require.NoError(t, err)
		require.True(t, found)
		assert.Equal(t, uint64(4), k.FirstSeq, "split %d", split)
		assert.Equal(t, uint64(4), k.ReserveSeq)
		assert.Equal(t, uint64(0), k.FinalSeq)
		assert.Equal(t, "tok-4", k.TokenHash)
		k, found, err = ix.Key(ns, "open-key-01")
		require.NoError(t, err)
		require.True(t, found)
		assert.Equal(t, ledger.KeyRecord{Key: "open-key-01", FirstSeq: 5,
			ReserveSeq: 5, LeaseExpiresAt: rs[4].LeaseExpiresAt, TokenHash: "tok-5"}, k)
		_, found, err = ix.Key(ns, "ghost-key-01")
		require.NoError(t, err)
		assert.False(t, found)
	}
	d := ix.NewDeriver("ns0", ttl, ledger.Head{Seq: 7}, src)
	assert.Error(t, d.Apply(rs[6]), "a receipt at or below the head is refused")
}

// FuzzRecord: any bytes either are refused or decode to a record that
// survives an encode and a decode unchanged; never a panic.
func FuzzRecord(f *testing.F) {
	f.Add([]byte{3, 1, 2, 3, 4, 1, 'a', 0, 0, 0})
	f.Add([]byte{})
	f.Add([]byte{0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, v []byte) {
		k, err := keyindex.DecodeRecord(v)
		if err != nil {
			return
		}
		again, err := keyindex.DecodeRecord(keyindex.EncodeRecord(&k))
		require.NoError(t, err)
		assert.Equal(t, k, again)
	})
}

// TestIndex_format: a Pebble database that is not a key index of this
// layout is refused, never read as one.
func TestIndex_format(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "idx")
	db, err := pebble.Open(dir, &pebble.Options{})
	require.NoError(t, err)
	require.NoError(t, db.Set([]byte("\x07default"), []byte("something else"), pebble.Sync))
	require.NoError(t, db.Close())
	_, err = keyindex.Open(dir, keyindex.Options{Logger: quiet})
	require.ErrorIs(t, err, keyindex.ErrFormat)

	ix := open(t, filepath.Join(t.TempDir(), "new"))
	require.NoError(t, ix.Close())
}

// TestBatch_closeTwice: closing a batch a second time leaves alone the
// batch Pebble's pool handed out next (it released that one from under
// its owner, whose commit then panicked: seen with 16 namespaces
// deriving at once, Deriver.Finish closing its first batch twice).
func TestBatch_closeTwice(t *testing.T) {
	ix := open(t, filepath.Join(t.TempDir(), "idx"))
	t.Cleanup(func() { _ = ix.Close() })
	for i := range 50 {
		first := ix.NewBatch("a")
		first.Close()
		next := ix.NewBatch("b") // often the pooled batch first held
		first.Close()
		require.NoError(t, next.Receipt(receipt(uint64(i+1), chain.KindReserve, "key-0000001", "e", "t", 1)))
		require.NoError(t, next.Commit(ledger.Head{Seq: uint64(i + 1)}), "round %d", i)
		next.Close()
	}
	require.NoError(t, ix.Err())
}

// TestBatch_lastWriteWins: a key written twice in one batch (a reserve
// and its commit in one group) keeps the value written last, and the
// batch's last watermark is the namespace's.
func TestBatch_lastWriteWins(t *testing.T) {
	ix := open(t, filepath.Join(t.TempDir(), "idx"))
	defer ix.Close()
	b := ix.NewBatch("default")
	for _, k := range []string{"zz-key-2", "aa-key-1", "mm-key-3"} {
		require.NoError(t, b.PutKey(&ledger.KeyRecord{Key: k, FirstSeq: 1, ReserveSeq: 1}))
	}
	require.NoError(t, b.PutKey(&ledger.KeyRecord{Key: "aa-key-1", FirstSeq: 1, ReserveSeq: 1, FinalSeq: 4}))
	require.NoError(t, b.Watermark(ledger.Head{Seq: 3}))
	require.NoError(t, b.Commit(ledger.Head{Seq: 4}))
	b.Close()
	got, found, err := ix.Key("default", "aa-key-1")
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, uint64(4), got.FinalSeq)
	for _, k := range []string{"zz-key-2", "mm-key-3"} {
		got, found, err = ix.Key("default", k)
		require.NoError(t, err)
		require.True(t, found)
		assert.Zero(t, got.FinalSeq, k)
	}
	wm, _, err := ix.Watermark("default")
	require.NoError(t, err)
	assert.Equal(t, uint64(4), wm.Seq)
}
