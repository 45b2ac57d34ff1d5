package sqlite

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"testing"

	sumdb "golang.org/x/mod/sumdb/tlog"
)

// TestFrontier: the hashes of leaf n read only the frontier of the tree of
// n leaves, and that frontier with leaf n's hashes holds the frontier of
// n+1 leaves; so a tree cache pruned to its frontier never reads the
// database.
func TestFrontier(t *testing.T) {
	stored := map[int64]sumdb.Hash{}
	for n := range int64(3000) {
		keep := map[int64]bool{}
		for _, x := range frontier(n) {
			if _, ok := stored[x]; !ok {
				t.Fatalf("n=%d: frontier index %d is not stored yet", n, x)
			}
			keep[x] = true
		}
		var leaf [8]byte
		binary.BigEndian.PutUint64(leaf[:], uint64(n))
		hs, err := sumdb.StoredHashesForRecordHash(n, sumdb.Hash(sha256.Sum256(leaf[:])),
			sumdb.HashReaderFunc(func(idx []int64) ([]sumdb.Hash, error) {
				out := make([]sumdb.Hash, len(idx))
				for i, x := range idx {
					if !keep[x] {
						return nil, fmt.Errorf("read %d outside the frontier %v", x, frontier(n))
					}
					out[i] = stored[x]
				}
				return out, nil
			}))
		if err != nil {
			t.Fatalf("leaf %d: %v", n, err)
		}
		base := sumdb.StoredHashIndex(0, n)
		for i, h := range hs {
			stored[base+int64(i)] = h
		}
	}
}
