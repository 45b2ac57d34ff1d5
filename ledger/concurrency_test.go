package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// TestNamespace_linger: with a long Linger, a lone request on an idle ledger is
// written at once, and requests under load still all commit (the writer
// gathers them into batches; none waits for more than the linger).
func TestNamespace_linger(t *testing.T) {
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now), ledgertest.WithConfig(ledger.Config{Linger: 2 * time.Second}))
	start := time.Now()
	_, err := db.Reserve(context.Background(), testkit.ReserveReq("lone-key-01", "e"))
	require.NoError(t, err)
	require.Less(t, time.Since(start), time.Second, "an idle ledger does not linger")

	var wg sync.WaitGroup
	start = time.Now()
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 5 {
				_, err := db.Reserve(context.Background(), testkit.ReserveReq(fmt.Sprintf("load-key-%d-%d", i, j), "e"))
				assert.NoError(t, err)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, uint64(161), db.Head().Seq)
	// 160 requests in rounds of 32: a round that fills the previous
	// batch's size never waits out the linger.
	assert.Less(t, time.Since(start), 10*time.Second)
}

// TestNamespace_fullQueue: under a group committer (SQLite groups), more
// requests in flight than a namespace's queue holds do not make every
// group wait out the linger: the requests waiting for room in the queue
// cannot join the next group, so it does not wait for them. Each of the
// ~48 groups waited out the linger before (the requests blocked on the
// full queue were counted as coming): 4 minutes with a 5 s linger. Now
// only the last requests may wait for a group of the previous one's
// size, once or twice.
func TestNamespace_fullQueue(t *testing.T) {
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now), ledgertest.WithConfig(ledger.Config{Linger: 5 * time.Second, MaxBatch: 2}))
	ctx := context.Background()
	var wg sync.WaitGroup
	start := time.Now()
	for i := range 24 {
		wg.Go(func() {
			for j := range 4 {
				_, err := db.Reserve(ctx, testkit.ReserveReq(fmt.Sprintf("full-queue-%d-%d", i, j), "e"))
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, uint64(96), db.Head().Seq)
	assert.Less(t, time.Since(start), 12*time.Second, "groups waited out the linger for requests that could not join them")
}
