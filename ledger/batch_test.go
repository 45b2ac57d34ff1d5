package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

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
