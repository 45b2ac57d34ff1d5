package ledgertest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// MustReserve and MustCommit are testkit's, on a DB's default namespace
// as on any other.
var (
	MustReserve = testkit.MustReserve
	MustCommit  = testkit.MustCommit
)

// VerifyChain recomputes the default namespace's whole chain from the
// file and checks seq contiguity, links and hashes, and the head.
func VerifyChain(tb testing.TB, db *DB) []chain.Receipt {
	tb.Helper()
	var all []chain.Receipt
	after := uint64(0)
	for {
		rs, next, err := db.ListReceipts(context.Background(), ledger.ReceiptFilter{After: after, Limit: ledger.MaxPageLimit})
		require.NoError(tb, err)
		all = append(all, rs...)
		if next == nil {
			break
		}
		after = *next
	}
	prev := chain.ZeroHash
	for i, r := range all {
		require.Equal(tb, uint64(i+1), r.Seq, "seq contiguous")
		require.Equal(tb, prev, r.PrevHash, "prev_hash of %d", r.Seq)
		require.NoError(tb, r.Check())
		prev = r.Hash
	}
	h := db.Head()
	require.Equal(tb, uint64(len(all)), h.Seq)
	require.Equal(tb, prev, h.Hash)
	return all
}
