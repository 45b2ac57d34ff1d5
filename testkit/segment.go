package testkit

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/archive"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// Relink recomputes the chain of rs (seq 1 first, in order) from seq from
// on: each receipt's prev_hash and hash, as a forger who changed a
// receipt would.
func Relink(rs []chain.Receipt, from uint64) {
	for i := from - 1; i < uint64(len(rs)); i++ {
		prev := chain.ZeroHash
		if i > 0 {
			prev = rs[i-1].Hash
		}
		rs[i] = chain.Link(i, prev, rs[i])
	}
}

// SegmentOf writes into dir the segment (SPEC §16) of namespace ns
// holding receipts from…through of rs (a chain from seq 1, in order;
// their payloads, if any, are left out) without a ledger, the way a
// forger with a key of their own would: the tree recomputed from rs's
// hashes and a checkpoint of size through signed by a fresh key. The
// segment checks alone (archive.Check without keys) whatever rs holds, so
// it proves nothing about a ledger. It returns the segment's path.
func SegmentOf(t testing.TB, dir, ns string, rs []chain.Receipt, from, through uint64) string {
	t.Helper()
	before, err := tlog.NewFrontier(0, nil)
	require.NoError(t, err)
	for _, r := range rs[:from-1] {
		before.Append(r.Hash)
	}
	prev := chain.ZeroHash
	if from > 1 {
		prev = rs[from-2].Hash
	}
	w, err := archive.Create(dir, ns, from, prev, before.Nodes())
	require.NoError(t, err)
	all, err := tlog.NewFrontier(before.Size(), before.Nodes())
	require.NoError(t, err)
	for i := from - 1; i < through; i++ {
		require.NoError(t, w.Receipt(&rs[i]))
		all.Append(rs[i].Hash)
	}
	skey, _, err := tlog.GenerateKey("forger.test")
	require.NoError(t, err)
	signer, err := note.NewSigner(skey)
	require.NoError(t, err)
	msg, err := tlog.SignCheckpoint(tlog.Checkpoint{Origin: "forger.test/" + ns, Size: int64(through), Root: all.Root()}, []note.Signer{signer})
	require.NoError(t, err)
	path, err := w.Finish(string(msg), nil, nil)
	require.NoError(t, err)
	return path
}
