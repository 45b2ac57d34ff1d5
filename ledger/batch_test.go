package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/internal/ledgertest"
	"github.com/effect-ledger/effect-ledger/internal/testkit"
	"github.com/effect-ledger/effect-ledger/ledger"
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
