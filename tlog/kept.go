package tlog

import (
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
)

// KeptLeaves is how many leaves a kept tile holds: a tile of height 8, as
// the tiles the ledger serves (C2SP tlog-tiles).
const KeptLeaves = 1 << keptHeight

const keptHeight = 8

// KeptTile is what a prune keeps of the tree of one tile of leaves (SPEC
// §16): the chain hashes of its receipts, from which every stored hash of
// levels 0–7 over them is recomputed, and, once the tile is full, the
// stored hashes of level 8 and above that its last leaf completed. The
// hashes of levels 0–7 are ~97 % of the stored tree; dropping them is what
// lets a pruned ledger keep ~33 bytes a receipt.
type KeptTile struct {
	// Tile is the tile's number: its leaves are Tile*KeptLeaves onwards.
	Tile int64
	// Hashes are the chain hashes of its leaves, in order (≤ KeptLeaves).
	Hashes []chain.Hash
	// Upper are the stored hashes of levels 8, 9, … that the tile's last
	// leaf completed (KeptUpperIndexes), when the tile is full.
	Upper []Hash

	levels [keptHeight][]Hash // computed on first use
}

// KeptUpperIndexes are the stored-hash indexes of the nodes of level 8
// and above that the last leaf of full tile tile completes, level 8
// first: the indexes of KeptTile.Upper.
func KeptUpperIndexes(tile int64) []int64 {
	var idx []int64
	size := (tile + 1) * KeptLeaves // leaves once the tile's last is appended
	for level := keptHeight; size%(int64(1)<<level) == 0; level++ {
		idx = append(idx, sumdb.StoredHashIndex(level, size>>level-1))
	}
	return idx
}

// KeptTileOf is the tile whose leaves a stored hash depends on last: the
// tile of the leaf that completed it, which holds it (level < 8: from
// its chain hashes; level ≥ 8: in Upper).
func KeptTileOf(idx int64) int64 {
	level, n := sumdb.SplitStoredHashIndex(idx)
	return ((n+1)<<level - 1) / KeptLeaves
}

// StoredHash returns the stored hash at index idx (sumdb's numbering), if
// t holds what it takes: for level < 8 the chain hashes of its subtree's
// leaves, for level ≥ 8 the upper hash of t's last leaf.
func (t *KeptTile) StoredHash(idx int64) (Hash, bool) {
	level, n := sumdb.SplitStoredHashIndex(idx)
	first := n << level // the node's first leaf
	if level >= keptHeight {
		i := level - keptHeight
		if KeptTileOf(idx) != t.Tile || len(t.Hashes) != KeptLeaves || i >= len(t.Upper) {
			return Hash{}, false
		}
		return t.Upper[i], true
	}
	off := first - t.Tile*KeptLeaves
	if off < 0 || off+int64(1)<<level > int64(len(t.Hashes)) {
		return Hash{}, false
	}
	return t.level(level)[off>>level], true
}

// level returns the hashes of level l over t's leaves (complete nodes).
func (t *KeptTile) level(l int) []Hash {
	if t.levels[l] != nil {
		return t.levels[l]
	}
	var hs []Hash
	if l == 0 {
		hs = make([]Hash, len(t.Hashes))
		for i := range t.Hashes {
			hs[i] = LeafHash(t.Hashes[i])
		}
	} else {
		below := t.level(l - 1)
		hs = make([]Hash, len(below)/2)
		for i := range hs {
			hs[i] = sumdb.NodeHash(below[2*i], below[2*i+1])
		}
	}
	t.levels[l] = hs
	return hs
}
