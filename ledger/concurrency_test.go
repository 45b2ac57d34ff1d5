package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// TestNamespace_Reserve_race races 64 goroutines on one key: exactly one wins,
// every other gets in_progress, and one receipt is appended.
func TestNamespace_Reserve_race(t *testing.T) {
	db := ledgertest.Open(t)
	const n = 64
	var wins, inProgress atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := db.Reserve(context.Background(), testkit.ReserveReq(key, fmt.Sprintf("exec-%d", i)))
			switch ledger.ErrorCode(err) {
			case "":
				wins.Add(1)
			case ledger.ECodeInProgress:
				inProgress.Add(1)
			default:
				t.Errorf("unexpected error: %v", err)
			}
		}()
	}
	close(start)
	wg.Wait()
	assert.Equal(t, int32(1), wins.Load())
	assert.Equal(t, int32(n-1), inProgress.Load())
	assert.Equal(t, uint64(1), db.Head().Seq)
}

// TestNamespace_Commit_race sends the same commit from 64 goroutines: one
// receipt, identical results.
func TestNamespace_Commit_race(t *testing.T) {
	db := ledgertest.Open(t)
	res := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
	const n = 64
	results := make([]*ledger.CommitResult, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := db.Commit(context.Background(), testkit.Succeed(key, res.Reservation))
			assert.NoError(t, err)
			results[i] = r
		}()
	}
	wg.Wait()
	replayed := 0
	for _, r := range results {
		require.NotNil(t, r)
		assert.Equal(t, results[0].Receipt, r.Receipt)
		if r.Replayed {
			replayed++
		}
	}
	assert.Equal(t, n-1, replayed, "one original, the rest repeats")
	assert.Equal(t, uint64(2), db.Head().Seq)
}

// TestNamespace_manyKeys runs 64 writers over many keys at once: every pair
// commits, seq is contiguous and the chain verifies.
func TestNamespace_manyKeys(t *testing.T) {
	db := ledgertest.Open(t)
	const writers, perWriter = 64, 40
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				k := fmt.Sprintf("key-%03d-%04d", w, i)
				res, err := db.Reserve(context.Background(), testkit.ReserveReq(k, k))
				if !assert.NoError(t, err) {
					return
				}
				// Every other key is also replayed by a second execution.
				_, err = db.Commit(context.Background(), testkit.Succeed(k, res.Reservation))
				assert.NoError(t, err)
				if i%2 == 0 {
					rep, err := db.Reserve(context.Background(), testkit.ReserveReq(k, k+"-again"))
					assert.NoError(t, err)
					assert.Equal(t, ledger.StatusReplayed, rep.Status)
				}
			}
		}()
	}
	wg.Wait()
	all := ledgertest.VerifyChain(t, db)
	assert.Len(t, all, writers*perWriter*5/2)
	seen := map[chain.Hash]bool{}
	for _, r := range all {
		assert.False(t, seen[r.PrevHash], "no two receipts share prev_hash")
		seen[r.PrevHash] = true
	}
}

// TestNamespace_mixedRace races reserves, commits and replays on a few keys and
// checks the outcome against the rules: per key at most one success, and
// the chain verifies.
func TestNamespace_mixedRace(t *testing.T) {
	db := ledgertest.Open(t)
	keys := []string{"mixed-key-0001", "mixed-key-0002", "mixed-key-0003"}
	var wg sync.WaitGroup
	var committed [3]atomic.Int32
	for g := range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				ki := (g + i) % len(keys)
				req := testkit.ReserveReq(keys[ki], fmt.Sprintf("exec-%d-%d", g, i))
				req.Idempotent = true
				res, err := db.Reserve(context.Background(), req)
				if err != nil {
					code := ledger.ErrorCode(err)
					assert.Contains(t, []string{ledger.ECodeInProgress}, code, "err=%v", err)
					continue
				}
				if res.Status != ledger.StatusReserved {
					continue
				}
				var c ledger.CommitRequest
				if i%3 == 0 {
					c = testkit.Fail(keys[ki], res.Reservation, true)
				} else {
					c = testkit.Succeed(keys[ki], res.Reservation)
				}
				out, err := db.Commit(context.Background(), c)
				require.NoError(t, err)
				if out.Outcome == chain.OutcomeSucceeded {
					committed[ki].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	for i := range keys {
		assert.LessOrEqual(t, committed[i].Load(), int32(1), "at most one success per key")
	}
	ledgertest.VerifyChain(t, db)
}
