package tlog_test

import (
	"encoding/hex"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"github.com/transparency-dev/merkle/testonly"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// memStore keeps a tree's stored hashes in memory, as a driver would in a
// table, and reads them back for sumdb.
type memStore struct{ hashes []tlog.Hash }

func (m *memStore) ReadHashes(idx []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	for i, x := range idx {
		out[i] = m.hashes[x]
	}
	return out, nil
}

func (m *memStore) appendLeafHash(t testing.TB, h tlog.Hash) {
	t.Helper()
	n, err := tlog.SizeFromStoredCount(int64(len(m.hashes)))
	require.NoError(t, err)
	hs, err := sumdb.StoredHashesForRecordHash(n, h, m)
	require.NoError(t, err)
	m.hashes = append(m.hashes, hs...)
}

// The RFC 6962 test vectors of certificate-transparency (also
// transparency-dev/merkle testonly): leaf inputs and the roots of the
// trees of their first 1…8 leaves. Reproduce the first in a shell:
//
//	printf '\x00' | sha256sum   # leaf hash of the empty input = root of size 1
//	# 6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d
var (
	rfcLeaves = []string{"", "00", "10", "2021", "3031", "40414243", "5051525354555657",
		"606162636465666768696a6b6c6d6e6f"}
	rfcRoots = []string{
		"6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
		"fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
		"aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
		"d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
		"4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
		"76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
		"ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
		"5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
	}
)

func TestTree_RFC6962Vectors(t *testing.T) {
	// printf '' | sha256sum
	assert.Equal(t, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", hex.EncodeToString(tlog.EmptyRoot[:]))
	assert.Equal(t, testonly.EmptyRootHash(), tlog.EmptyRoot[:])
	var f tlog.Frontier
	var m memStore
	for i, l := range rfcLeaves {
		data, err := hex.DecodeString(l)
		require.NoError(t, err)
		f.AppendLeafHash(sumdb.RecordHash(data))
		m.appendLeafHash(t, sumdb.RecordHash(data))
		want := rfcRoots[i]
		assert.Equal(t, want, hex.EncodeToString(testonly.RootHashes()[i+1]), "vector table of transparency-dev")
		got := f.Root()
		assert.Equal(t, want, hex.EncodeToString(got[:]), "frontier root of size %d", i+1)
		stored, err := tlog.TreeHash(int64(i+1), &m)
		require.NoError(t, err)
		assert.Equal(t, want, hex.EncodeToString(stored[:]), "stored-hash root of size %d", i+1)
	}
}

// The ledger's leaves are chain hashes: the leaf hash is SHA-256(0x00 ‖ hash).
// Reproduce: printf '\x00' | cat - <(printf %064d 0 | xxd -r -p) | sha256sum
func TestLeafHash_OK(t *testing.T) {
	got := tlog.LeafHash(chain.Hash{})
	assert.Equal(t, rfc6962.DefaultHasher.HashLeaf(make([]byte, 32)), got[:])
	assert.Equal(t, "7f9c9e31ac8256ca2f258583df262dbc7d6f68f2a03043d5c99a4ae5a7396ce9", hex.EncodeToString(got[:]))
}

func TestSizeFromStoredCount(t *testing.T) {
	for n := int64(0); n < 3000; n++ {
		got, err := tlog.SizeFromStoredCount(sumdb.StoredHashCount(n))
		require.NoError(t, err)
		require.Equal(t, n, got)
	}
	_, err := tlog.SizeFromStoredCount(sumdb.StoredHashCount(3) + 1) // leaf 3 stores 3 hashes
	assert.ErrorIs(t, err, tlog.ErrPartialTree)
}

// randomTree builds n leaves of random chain hashes in both a memStore (our
// path: sumdb stored hashes) and transparency-dev/merkle's reference tree.
func randomTree(t testing.TB, r *rand.Rand, n int) ([]chain.Hash, *memStore, *testonly.Tree, *tlog.Frontier) {
	t.Helper()
	var m memStore
	ref := testonly.New(rfc6962.DefaultHasher)
	var f tlog.Frontier
	leaves := make([]chain.Hash, n)
	for i := range leaves {
		for j := range leaves[i] {
			leaves[i][j] = byte(r.UintN(256))
		}
		m.appendLeafHash(t, tlog.LeafHash(leaves[i]))
		ref.AppendData(leaves[i][:])
		f.Append(leaves[i])
	}
	return leaves, &m, ref, &f
}

func TestProofs_CrossCheck(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	leaves, m, ref, f := randomTree(t, r, 1000)
	root := f.Root()
	assert.Equal(t, ref.Hash(), root[:], "root of 1000 leaves")
	for range 300 {
		size := 1 + r.Int64N(int64(len(leaves)))
		idx := r.Int64N(size)
		root, err := tlog.TreeHash(size, m)
		require.NoError(t, err)
		require.Equal(t, ref.HashAt(uint64(size)), root[:], "root at %d", size)

		p, err := tlog.ProveInclusion(size, idx, m)
		require.NoError(t, err)
		require.NoError(t, tlog.CheckInclusion(p, size, root, idx, leaves[idx]))
		raw := make([][]byte, len(p))
		for i := range p {
			raw[i] = p[i][:]
		}
		leafHash := tlog.LeafHash(leaves[idx])
		require.NoError(t, proof.VerifyInclusion(rfc6962.DefaultHasher, uint64(idx), uint64(size), leafHash[:], raw, root[:]),
			"transparency-dev verifies our inclusion proof of %d in %d", idx, size)

		from := r.Int64N(size + 1)
		rootFrom, err := tlog.TreeHash(from, m)
		require.NoError(t, err)
		cp, err := tlog.ProveConsistency(size, from, m)
		require.NoError(t, err)
		require.NoError(t, tlog.CheckConsistency(cp, size, root, from, rootFrom))
		raw = make([][]byte, len(cp))
		for i := range cp {
			raw[i] = cp[i][:]
		}
		require.NoError(t, proof.VerifyConsistency(rfc6962.DefaultHasher, uint64(from), uint64(size), raw, rootFrom[:], root[:]),
			"transparency-dev verifies our consistency proof %d→%d", from, size)
		if from > 0 && from < size {
			// A wrong old root fails.
			bad := rootFrom
			bad[0] ^= 1
			require.ErrorIs(t, tlog.CheckConsistency(cp, size, root, from, bad), tlog.ErrProof)
		}
		// A proof for another leaf fails.
		other := leaves[idx]
		other[31] ^= 1
		require.ErrorIs(t, tlog.CheckInclusion(p, size, root, idx, other), tlog.ErrProof)
	}
}

func BenchmarkStoredHashes(b *testing.B) {
	var m memStore
	var h chain.Hash
	for i := 0; b.Loop(); i++ {
		h[0], h[1], h[2] = byte(i), byte(i>>8), byte(i>>16)
		m.appendLeafHash(b, tlog.LeafHash(h))
	}
}

// A frontier read from stored hashes at any size m, with the leaves after
// m appended, gives the root of the whole tree; a wrong number of nodes
// is refused.
func TestFrontierNodes_resume(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	leaves, m, ref, _ := randomTree(t, r, 70)
	for size := range int64(len(leaves)) + 1 {
		nodes, err := tlog.FrontierNodes(size, m)
		require.NoError(t, err)
		f, err := tlog.NewFrontier(size, nodes)
		require.NoError(t, err)
		for _, l := range leaves[size:] {
			f.Append(l)
		}
		require.Equal(t, tlog.Hash(ref.Hash()), f.Root(), "resumed at %d", size)
		require.Equal(t, int64(len(leaves)), f.Size())
	}
	_, err := tlog.NewFrontier(5, make([]tlog.Hash, 1))
	require.ErrorIs(t, err, tlog.ErrPartialTree)
	_, err = tlog.NewFrontier(-1, nil)
	require.Error(t, err)
}
