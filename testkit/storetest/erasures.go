package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// RunOverlappingErasures: erases of overlapping keys sent at once (the
// scheduler puts them in one write group, one transaction) each claim
// only what they erased (SPEC §14): their counts add up to the receipts
// that held values, once each, and every value is gone.
func RunOverlappingErasures(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	require.NoError(t, l.CreateNamespace(ctx, "ov", ledger.NamespaceSettings{Payloads: ledger.PayloadsCommitted}))
	n := ns(t, l, "ov")
	const keys = 40
	var all []string
	var commits []uint64
	for i := range keys {
		key := fmt.Sprintf("ov-key-%04d", i)
		all = append(all, key)
		r := testkit.MustReserve(t, n, testkit.ReserveReq(key, "exec-1"))
		c := testkit.MustCommit(t, n, testkit.Succeed(key, r.Reservation))
		commits = append(commits, c.Receipt.Seq)
	}
	for round := range 3 { // the grouping is the scheduler's: try more than once
		var wg sync.WaitGroup
		counts := make([]uint64, 8)
		for i := range counts {
			wg.Go(func() {
				window := all[i*4 : min(i*4+12, keys)] // each key in up to three windows
				res, err := n.Erase(ctx, ledger.EraseRequest{Keys: window, Actor: "ops", Reason: "overlap"})
				if assert.NoError(t, err) {
					counts[i] = res.Count
				}
			})
		}
		wg.Wait()
		var sum uint64
		for _, c := range counts {
			sum += c
		}
		want := uint64(keys)
		if round > 0 {
			want = 0 // nothing left to erase
		}
		assert.Equal(t, want, sum, "round %d: the erases claim each receipt once: %v", round, counts)
	}
	for _, seq := range commits {
		r, err := n.GetReceipt(ctx, seq)
		require.NoError(t, err)
		assert.Len(t, r.Open.Erased(), 2, "receipt %d: external_ref and result erased, once", seq)
	}
}
