package ledger

import (
	"context"
	"fmt"
	"slices"

	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// The tree and chain hashes of a pruned prefix (SPEC §16). A driver keeps
// the chain hashes of deleted receipts in kept tiles and no tree hash of
// levels 0–7 over them; the domain recomputes those (tlog.KeptTile), since
// a driver never hashes. Every read of a stored hash or chain hash goes
// through here: the ones completed by a leaf ≤ kept come from the tiles.

// keptTileReader reads kept tiles by number.
type keptTileReader func(ctx context.Context, tiles []int64) ([]tlog.KeptTile, error)

// keptStoredHashes reads the stored tree hashes idx: those whose last leaf
// is ≤ kept from the kept tiles, the others with read.
func keptStoredHashes(ctx context.Context, kept uint64, idx []int64, tiles keptTileReader,
	read func(ctx context.Context, idx []int64) ([]tlog.Hash, error)) ([]tlog.Hash, error) {
	if kept == 0 {
		return read(ctx, idx)
	}
	out := make([]tlog.Hash, len(idx))
	var live []int64
	var livePos []int
	byTile := map[int64][]int{}
	for i, x := range idx {
		level, n := sumdb.SplitStoredHashIndex(x)
		if last := (n+1)<<level - 1; last < int64(kept) {
			t := last / tlog.KeptLeaves
			byTile[t] = append(byTile[t], i)
			continue
		}
		live = append(live, x)
		livePos = append(livePos, i)
	}
	if len(byTile) > 0 {
		kts, err := readKept(ctx, tiles, byTile)
		if err != nil {
			return nil, err
		}
		for t, pos := range byTile {
			for _, i := range pos {
				h, ok := kts[t].StoredHash(idx[i])
				if !ok {
					return nil, fmt.Errorf("tree hash %d: kept tile %d holds %d leaves: %w", idx[i], t, len(kts[t].Hashes), ErrStorageCorrupt)
				}
				out[i] = h
			}
		}
	}
	if len(live) > 0 {
		hs, err := read(ctx, live)
		if err != nil {
			return nil, err
		}
		if len(hs) != len(live) {
			return nil, fmt.Errorf("read %d tree hashes, got %d", len(live), len(hs))
		}
		for j, i := range livePos {
			out[i] = hs[j]
		}
	}
	return out, nil
}

// readKept reads the kept tiles named by byTile's keys.
func readKept[V any](ctx context.Context, tiles keptTileReader, byTile map[int64]V) (map[int64]*tlog.KeptTile, error) {
	nums := make([]int64, 0, len(byTile))
	for t := range byTile {
		nums = append(nums, t)
	}
	slices.Sort(nums)
	kts, err := tiles(ctx, nums)
	if err != nil {
		return nil, err
	}
	out := make(map[int64]*tlog.KeptTile, len(kts))
	for i := range kts {
		out[kts[i].Tile] = &kts[i]
	}
	for _, t := range nums {
		if out[t] == nil {
			return nil, fmt.Errorf("kept tile %d is missing: %w", t, ErrStorageCorrupt)
		}
	}
	return out, nil
}

// keptReceiptHashes returns the chain hashes of receipts from+1 … from+n:
// those ≤ kept from the kept tiles, the rest with read.
func keptReceiptHashes(ctx context.Context, kept, from uint64, n int, tiles keptTileReader,
	read func(ctx context.Context, from uint64, n int) ([]chain.Hash, error)) ([]chain.Hash, error) {
	if from >= kept || n <= 0 {
		return read(ctx, from, n)
	}
	inKept := int(min(uint64(n), kept-from))
	byTile := map[int64]bool{}
	for s := from; s < from+uint64(inKept); s++ {
		byTile[int64(s/tlog.KeptLeaves)] = true
	}
	kts, err := readKept(ctx, tiles, byTile)
	if err != nil {
		return nil, err
	}
	out := make([]chain.Hash, 0, n)
	for s := from; s < from+uint64(inKept); s++ { // leaf s is receipt s+1
		kt := kts[int64(s/tlog.KeptLeaves)]
		i := int(s % tlog.KeptLeaves)
		if i >= len(kt.Hashes) {
			return nil, fmt.Errorf("chain hash %d: kept tile %d holds %d leaves: %w", s+1, kt.Tile, len(kt.Hashes), ErrStorageCorrupt)
		}
		out = append(out, kt.Hashes[i])
	}
	if inKept == n {
		return out, nil
	}
	rest, err := read(ctx, kept, n-inKept)
	if err != nil {
		return nil, err
	}
	return append(out, rest...), nil
}

// ReadHashes reads stored tree hashes in the batch's transaction, those
// over pruned leaves from the kept tiles.
func (t *batchTx) ReadHashes(ctx context.Context, idx []int64) ([]tlog.Hash, error) {
	return keptStoredHashes(ctx, t.at.Pruned.Kept, idx, t.Tx.KeptTiles, t.Tx.ReadHashes)
}
