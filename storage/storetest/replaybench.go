package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/effect-ledger/effect-ledger/internal/testkit"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// ReplayClients is how many replays BenchReplay sends at once per round.
const ReplayClients = 16

// BenchReplay measures the replay path of n (SPEC §4: a reserve of a
// succeeded key returns the recorded outcome and appends a replay
// receipt), where each recorded outcome is checked against the chain
// before it is served. It first commits keys keys (untimed), then each
// round replays ReplayClients keys drawn at random, at once. It reports
// replays/s.
func BenchReplay(b *testing.B, n *ledger.Namespace, keys int) {
	ctx := context.Background()
	salt := rand.Uint64()
	name := func(i int) string { return fmt.Sprintf("replay-%x-%07d", salt, i) }
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := int(next.Add(1)); i <= keys; i = int(next.Add(1)) {
				res, err := n.Reserve(ctx, testkit.ReserveReq(name(i), "exec-1"))
				if err == nil {
					_, err = n.Commit(ctx, testkit.Succeed(name(i), res.Reservation))
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		return
	}
	var replays atomic.Int64
	b.ResetTimer()
	for b.Loop() {
		for range ReplayClients {
			wg.Go(func() {
				i := replays.Add(1)
				res, err := n.Reserve(ctx, testkit.ReserveReq(name(1+rand.IntN(keys)), fmt.Sprintf("exec-r%d", i)))
				if err == nil && res.Status != ledger.StatusReplayed {
					err = fmt.Errorf("status %s, want replayed", res.Status)
				}
				if err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
	}
	b.ReportMetric(float64(replays.Load())/b.Elapsed().Seconds(), "replays/s")
}
