package verify

import (
	"context"
	"fmt"

	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// A pruned ledger (SPEC §16) keeps, of each receipt whose body it
// deleted, the chain hash, 256 to a kept tile. The chain pass of a full
// run starts at K, the last deleted body, from its kept hash; the kept
// hashes are tied to the signed tree here: the frontier absorbs the kept
// hashes 1…K, then the live ones as the chain pass reads them, and its
// roots are compared with every stored checkpoint and with the stored
// tree's root (kept_hash_mismatch).

// RuleKeptHashMismatch: the chain hashes a pruned ledger keeps for the
// receipts whose bodies it deleted do not give the Merkle roots the
// ledger stored and signed (SPEC §16): a kept hash was swapped. The
// detail names the first kept tile whose hashes no longer give its stored
// level-8 hash, when one does not.
const RuleKeptHashMismatch = "kept_hash_mismatch"

// keptTileHeight is a kept tile's height: its 256 leaves' root is a
// stored hash of level 8.
const keptTileHeight = 8

// keptTileBatch is how many kept tiles are read at once (≤ 2 MiB).
const keptTileBatch = 256

// pruneMark reads the pruned prefix of a database: nil and zero for a
// server.
func (v *Verifier) pruneMark(ctx context.Context) (DB, ledger.PruneMark, error) {
	c := v.db
	if v.db == nil {
		return nil, ledger.PruneMark{}, nil
	}
	m, err := c.Pruned(ctx)
	if err != nil {
		return nil, m, fmt.Errorf("read the pruned prefix: %w", err)
	}
	return c, m, nil
}

// keptTiles reads the kept chain hashes of seqs from…through (1 ≤ from,
// through ≤ kept) tile by tile, in seq order. A seq no tile holds is a
// read error: the pruned prefix says it is kept.
func keptTiles(ctx context.Context, c DB, from, through uint64, fn func(seq uint64, h chain.Hash) error) error {
	if from == 0 || through < from {
		return nil
	}
	first, last := int64((from-1)/tlog.KeptLeaves), int64((through-1)/tlog.KeptLeaves)
	for t := first; t <= last; t += keptTileBatch {
		want := make([]int64, 0, keptTileBatch)
		for i := t; i <= last && i < t+keptTileBatch; i++ {
			want = append(want, i)
		}
		kts, err := c.KeptTiles(ctx, want)
		if err != nil {
			return fmt.Errorf("read kept tiles %d…%d: %w", want[0], want[len(want)-1], err)
		}
		byTile := make(map[int64]*tlog.KeptTile, len(kts))
		for i := range kts {
			byTile[kts[i].Tile] = &kts[i]
		}
		for _, tile := range want {
			kt := byTile[tile]
			lo := max(from, uint64(tile)*tlog.KeptLeaves+1)
			hi := min(through, uint64(tile+1)*tlog.KeptLeaves)
			for seq := lo; seq <= hi; seq++ {
				i := int((seq - 1) % tlog.KeptLeaves)
				if kt == nil || i >= len(kt.Hashes) {
					return fmt.Errorf("the ledger keeps no chain hash of receipt %d (bodies ≤ %d deleted): %w", seq, through, ledger.ErrStorageCorrupt)
				}
				if err := fn(seq, kt.Hashes[i]); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// keptHash reads the kept chain hash of one seq ≤ K.
func keptHash(ctx context.Context, c DB, seq uint64) (chain.Hash, error) {
	var h chain.Hash
	err := keptTiles(ctx, c, seq, seq, func(_ uint64, k chain.Hash) error { h = k; return nil })
	return h, err
}

// prunedHashes are the chain hashes a pruned ledger keeps: those of
// seqs ≤ K from the kept tiles, the rest from the live receipts. A seq it
// does not hold is left out (KeptHashes).
func prunedHashes(c DB, kept uint64) KeptHashes {
	live := liveHashes(c)
	return func(ctx context.Context, from, through uint64, fn func(uint64, chain.Hash) error) error {
		if from <= kept {
			if err := keptTiles(ctx, c, from, min(through, kept), fn); err != nil {
				return err
			}
		}
		if through <= kept {
			return nil
		}
		return live(ctx, max(from, kept+1), through, fn)
	}
}

// keptTree rebuilds the Merkle tree of a pruned ledger from the kept
// hashes and the live ones (the chain pass's), and compares its roots
// with the stored checkpoints and the stored tree.
type keptTree struct {
	ctx  context.Context
	c    DB
	kept uint64
	col  *collector
	f    tlog.Frontier
	tile tlog.Frontier // the leaves of the current tile, for its level-8 hash
	// tiles are full tiles of kept hashes whose level-8 hash is compared
	// with the stored one (in batches); bad is the first that differs.
	tiles []tileRoot
	bad   int64
	// next is the smallest stored checkpoint not yet reached; sizes are
	// compared as the frontier reaches them.
	next       *tlog.Signed
	treeSize   int64 // the stored tree's size when the run began
	treeRoot   tlog.Hash
	treeRooted bool
	mismatch   []string // the roots that differ
	err        error
}

type tileRoot struct {
	tile int64
	root tlog.Hash
}

// newKeptTree absorbs the kept hashes 1…kept.
func newKeptTree(ctx context.Context, c DB, kept uint64, col *collector) (*keptTree, error) {
	t := &keptTree{ctx: ctx, c: c, kept: kept, col: col, bad: -1}
	var err error
	if t.treeSize, err = c.TreeSize(ctx); err != nil {
		return nil, fmt.Errorf("read the tree size: %w", err)
	}
	if t.next, err = c.FirstCheckpointCovering(ctx, 1); err != nil {
		return nil, fmt.Errorf("read the checkpoints: %w", err)
	}
	err = keptTiles(ctx, c, 1, kept, func(_ uint64, h chain.Hash) error {
		t.add(h)
		return t.err
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// add absorbs the next leaf's chain hash.
func (t *keptTree) add(h chain.Hash) {
	if t == nil || t.err != nil {
		return
	}
	t.f.Append(h)
	size := t.f.Size()
	if t.kept > 0 && uint64(size-1)/tlog.KeptLeaves <= (t.kept-1)/tlog.KeptLeaves { // up to the tile K ends in
		t.tile.Append(h)
		if t.tile.Size() == tlog.KeptLeaves {
			t.tiles = append(t.tiles, tileRoot{tile: (size - 1) / tlog.KeptLeaves, root: t.tile.Root()})
			t.tile = tlog.Frontier{}
			if len(t.tiles) == keptTileBatch {
				t.compareTiles()
			}
		}
	}
	if size == t.treeSize {
		t.treeRoot, t.treeRooted = t.f.Root(), true
	}
	for t.next != nil && t.next.Size <= size && t.err == nil {
		if t.next.Size == size && t.next.Root != t.f.Root() {
			t.mismatch = append(t.mismatch, fmt.Sprintf("the stored checkpoint of size %d signs root %s, the kept and live hashes give %s",
				size, t.next.Root, t.f.Root()))
		}
		t.next, t.err = t.c.FirstCheckpointCovering(t.ctx, t.next.Size+1)
	}
}

// compareTiles compares the level-8 hashes of the full tiles absorbed
// with the stored ones, and notes the first that differs.
func (t *keptTree) compareTiles() {
	if len(t.tiles) == 0 || t.err != nil {
		return
	}
	stored := t.tiles[:0:0]
	for _, tr := range t.tiles { // the tiles the stored tree holds
		if (tr.tile+1)*tlog.KeptLeaves <= t.treeSize {
			stored = append(stored, tr)
		}
	}
	t.tiles = t.tiles[:0]
	if len(stored) == 0 {
		return
	}
	idx := make([]int64, len(stored))
	for i, tr := range stored {
		idx[i] = sumdb.StoredHashIndex(keptTileHeight, tr.tile)
	}
	hs, err := ledger.KeptLog(t.c).HashReader(t.ctx).ReadHashes(idx)
	if err != nil {
		t.err = fmt.Errorf("read the level-8 hashes of kept tiles %d…%d: %w", stored[0].tile, stored[len(stored)-1].tile, err)
		return
	}
	for i, tr := range stored {
		if hs[i] != tr.root && t.bad < 0 {
			t.bad = tr.tile
		}
	}
}

// finish compares the roots with the stored tree's at its size, and
// reports a difference; it returns an error of reading.
func (t *keptTree) finish() error {
	if t == nil {
		return nil
	}
	t.compareTiles()
	if t.err != nil {
		return t.err
	}
	if t.treeRooted && t.treeSize > 0 {
		root, err := tlog.TreeHash(t.treeSize, ledger.KeptLog(t.c).HashReader(t.ctx))
		if err != nil {
			return fmt.Errorf("read the stored tree's root at %d: %w", t.treeSize, err)
		}
		if root != t.treeRoot {
			t.mismatch = append(t.mismatch, fmt.Sprintf("the stored tree's root at size %d is %s, the kept and live hashes give %s",
				t.treeSize, root, t.treeRoot))
		}
	}
	if t.bad < 0 && len(t.mismatch) == 0 {
		return nil
	}
	where := fmt.Sprintf("receipts 1…%d", t.kept)
	if t.bad >= 0 {
		where = fmt.Sprintf("kept tile %d (receipts %d…%d): its chain hashes no longer give its stored level-8 hash",
			t.bad, t.bad*tlog.KeptLeaves+1, (t.bad+1)*tlog.KeptLeaves)
	}
	detail := "the chain hashes kept for the deleted bodies of " + where
	for _, m := range t.mismatch {
		detail += "; " + m
	}
	seq := t.kept
	if t.bad >= 0 {
		seq = uint64(t.bad*tlog.KeptLeaves + 1)
	}
	t.col.addf(seq, RuleKeptHashMismatch, "%s", detail)
	return nil
}

// keptLeaves gives leaf the receipts whose bodies a pruned ledger deleted
// (SPEC §16), in seq order: each its kept chain hash, the key receipts
// (SPEC §9.2) their kept bodies when these hash to it. It returns K, the
// seq after which the live receipts follow (0 for src that is not a
// pruned ledger's chain).
func keptLeaves(ctx context.Context, c DB, leaf func(*chain.Receipt) error) (uint64, error) {
	if c == nil {
		return 0, nil
	}
	m, err := c.Pruned(ctx)
	if err != nil || m.Kept == 0 {
		return 0, err
	}
	bodies, err := c.KeptReceipts(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the kept key receipts: %w", err)
	}
	keys := make(map[uint64]*chain.Receipt, len(bodies))
	for _, b := range bodies {
		var r chain.Receipt
		if r.UnmarshalJSON([]byte(b.Body)) == nil && r.Seq == b.Seq && r.Check() == nil {
			keys[b.Seq] = &r
		}
	}
	err = keptTiles(ctx, c, 1, m.Kept, func(seq uint64, h chain.Hash) error {
		r := keys[seq]
		if r == nil || r.Hash != h { // a body that is not the kept one teaches nothing
			r = &chain.Receipt{Seq: seq}
		}
		r.Hash = h
		return leaf(r)
	})
	return m.Kept, err
}
