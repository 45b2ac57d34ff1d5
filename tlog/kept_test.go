package tlog_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// Every stored hash of a tree of 1…1,025 leaves — hence every tile,
// proof and checkpoint built from them — is recomputed from the kept
// tiles alone: the chain hashes and the upper hashes of full tiles.
func TestKeptTile_storedHashes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	leaves, m, _, _ := randomTree(t, r, 1025)
	for n := int64(1); n <= int64(len(leaves)); n++ {
		tiles := keptTiles(t, leaves[:n], m)
		count := sumdb.StoredHashCount(n)
		for idx := range count {
			tile := tlog.KeptTileOf(idx)
			require.Less(t, tile, int64(len(tiles)))
			got, ok := tiles[tile].StoredHash(idx)
			require.True(t, ok, "size %d: stored hash %d from tile %d", n, idx, tile)
			require.Equal(t, m.hashes[idx], got, "size %d: stored hash %d", n, idx)
		}
	}
}

// A tile answers only for what it holds.
func TestKeptTile_holdsOnlyItsOwn(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	leaves, m, _, _ := randomTree(t, r, 300)
	tiles := keptTiles(t, leaves, m)
	_, ok := tiles[0].StoredHash(sumdb.StoredHashIndex(0, 256)) // a leaf of tile 1
	require.False(t, ok)
	_, ok = tiles[1].StoredHash(sumdb.StoredHashIndex(5, 9)) // leaves 288…319: not all in yet
	require.False(t, ok)
	_, ok = tiles[1].StoredHash(sumdb.StoredHashIndex(8, 1)) // tile 1 is not full
	require.False(t, ok)
	got, ok := tiles[0].StoredHash(sumdb.StoredHashIndex(8, 0))
	require.True(t, ok)
	require.Equal(t, m.hashes[sumdb.StoredHashIndex(8, 0)], got)
}

// keptTiles makes the kept tiles of leaves, the upper hashes of full
// tiles read from m's stored hashes.
func keptTiles(t *testing.T, leaves []chain.Hash, m *memStore) []*tlog.KeptTile {
	t.Helper()
	var tiles []*tlog.KeptTile
	for start := 0; start < len(leaves); start += tlog.KeptLeaves {
		end := min(start+tlog.KeptLeaves, len(leaves))
		kt := &tlog.KeptTile{Tile: int64(start / tlog.KeptLeaves), Hashes: leaves[start:end]}
		if end-start == tlog.KeptLeaves {
			up, err := m.ReadHashes(tlog.KeptUpperIndexes(kt.Tile))
			require.NoError(t, err)
			kt.Upper = up
		}
		tiles = append(tiles, kt)
	}
	return tiles
}
