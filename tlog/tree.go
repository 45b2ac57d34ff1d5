// Package tlog is the verifiable-log layer of the ledger (SPEC §9): the
// RFC 6962 Merkle tree over a chain's receipt hashes, C2SP tlog-checkpoint
// signed notes, inclusion and consistency proofs, and the portable receipt.
// The tree arithmetic is golang.org/x/mod/sumdb/tlog's; this package only
// fixes how the ledger uses it and holds no storage: drivers store the
// tree's hashes (sumdb.StoredHashes) and hand back a sumdb.HashReader.
package tlog

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"

	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Hash is a node of the tree: 32 bytes of SHA-256.
type Hash = sumdb.Hash

// LeafHash is the RFC 6962 hash of leaf data: SHA-256(0x00 ‖ data). The
// ledger's leaf data is a receipt's 32-byte chain hash (SPEC §9).
func LeafHash(receiptHash chain.Hash) Hash { return sumdb.RecordHash(receiptHash[:]) }

// LeafIndex is the 0-based leaf index of the receipt with seq (seq ≥ 1).
func LeafIndex(seq uint64) int64 { return int64(seq - 1) }

// Frontier computes the root of a tree whose leaves arrive one at a time,
// keeping only the O(log n) roots of its complete subtrees (the right
// edge). The zero value is an empty tree. The verifier uses it to compute
// the root of a chain it rehashes, without trusting stored tree hashes.
type Frontier struct {
	size  int64
	nodes []Hash // roots of the complete subtrees, largest (leftmost) first
}

// Append adds a leaf whose data is a receipt's chain hash.
func (f *Frontier) Append(receiptHash chain.Hash) { f.AppendLeafHash(LeafHash(receiptHash)) }

// AppendLeafHash adds a leaf by its leaf hash.
func (f *Frontier) AppendLeafHash(h Hash) {
	// Merge one pair for each trailing one bit of the old size.
	for n := f.size; n&1 == 1; n >>= 1 {
		h = sumdb.NodeHash(f.nodes[len(f.nodes)-1], h)
		f.nodes = f.nodes[:len(f.nodes)-1]
	}
	f.nodes = append(f.nodes, h)
	f.size++
}

// NewFrontier is the frontier of a tree of size leaves whose complete
// subtrees have the roots nodes, largest (leftmost) first: one for each
// one bit of size (FrontierNodes). Appending leaves to it gives the roots
// of the larger trees without the first size leaves themselves.
func NewFrontier(size int64, nodes []Hash) (*Frontier, error) {
	if size < 0 || len(nodes) != bits.OnesCount64(uint64(size)) {
		return nil, fmt.Errorf("%w: a tree of %d leaves has %d complete subtrees, not %d",
			ErrPartialTree, size, bits.OnesCount64(uint64(max(size, 0))), len(nodes))
	}
	return &Frontier{size: size, nodes: slices.Clone(nodes)}, nil
}

// FrontierNodes reads from stored hashes the roots of the complete
// subtrees of the first n leaves, largest (leftmost) first: the nodes of
// NewFrontier(n, …).
func FrontierNodes(n int64, r sumdb.HashReader) ([]Hash, error) {
	var idx []int64
	for start, level := int64(0), 62; level >= 0; level-- {
		if n&(1<<level) != 0 {
			idx = append(idx, sumdb.StoredHashIndex(level, start>>level))
			start += 1 << level
		}
	}
	if len(idx) == 0 {
		return nil, nil
	}
	hs, err := r.ReadHashes(idx)
	if err != nil {
		return nil, fmt.Errorf("frontier of %d leaves: %w", n, err)
	}
	return hs, nil
}

// Nodes are the roots of the complete subtrees, largest (leftmost) first.
func (f *Frontier) Nodes() []Hash { return slices.Clone(f.nodes) }

// Size is the number of leaves appended.
func (f *Frontier) Size() int64 { return f.size }

// Root is the RFC 6962 root of the leaves appended so far; the empty tree
// has the hash of the empty string, as in RFC 6962 §2.1.
func (f *Frontier) Root() Hash {
	if len(f.nodes) == 0 {
		return EmptyRoot
	}
	h := f.nodes[len(f.nodes)-1]
	for i := len(f.nodes) - 2; i >= 0; i-- {
		h = sumdb.NodeHash(f.nodes[i], h)
	}
	return h
}

// EmptyRoot is the root of the empty tree: SHA-256 of the empty string.
var EmptyRoot = Hash{0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
	0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55}

// TreeHash returns the root of the first n leaves from stored hashes
// (sumdb.TreeHash, with the empty tree's root for n = 0).
func TreeHash(n int64, r sumdb.HashReader) (Hash, error) {
	if n == 0 {
		return EmptyRoot, nil
	}
	h, err := sumdb.TreeHash(n, r)
	if err != nil {
		return Hash{}, fmt.Errorf("tree hash at size %d: %w", n, err)
	}
	return h, nil
}

// SizeFromStoredCount returns the tree size n whose stored hashes number
// exactly count (sumdb.StoredHashCount(n) == count), or an error when no
// tree size has that many: the stored hashes end in the middle of a leaf.
func SizeFromStoredCount(count int64) (int64, error) {
	lo, hi := int64(0), count // StoredHashCount(n) ≥ n
	for lo < hi {
		mid := lo + (hi-lo)/2
		if sumdb.StoredHashCount(mid) < count {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if sumdb.StoredHashCount(lo) != count {
		return 0, fmt.Errorf("%w: %d stored hashes end inside leaf %d", ErrPartialTree, count, lo)
	}
	return lo, nil
}

// ErrPartialTree means the stored tree hashes do not end on a leaf boundary.
var ErrPartialTree = errors.New("the stored tree is incomplete")
