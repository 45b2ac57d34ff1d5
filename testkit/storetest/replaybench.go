package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// ReplayClients is how many replays BenchReplay sends at once per round.
const ReplayClients = 16

// PrefillReplay commits keys keys in n for BenchReplay and returns them.
func PrefillReplay(b *testing.B, n *ledger.Namespace, keys int) []string {
	ctx := context.Background()
	salt := rand.Uint64()
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("replay-%x-%07d", salt, i)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < keys; i = int(next.Add(1)) - 1 {
				res, err := n.Reserve(ctx, testkit.ReserveReq(names[i], "exec-1"))
				if err == nil {
					_, err = n.Commit(ctx, testkit.Succeed(names[i], res.Reservation))
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return names
}

// BenchReplay measures the replay path of n (SPEC §4: a reserve of a
// succeeded key returns the recorded outcome and appends a replay
// receipt), where each recorded outcome is checked against the chain
// before it is served: each round replays ReplayClients of keys (from
// PrefillReplay), drawn at random, at once. It reports replays/s.
func BenchReplay(b *testing.B, n *ledger.Namespace, keys []string) {
	ctx := context.Background()
	var replays atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for b.Loop() {
		for range ReplayClients {
			wg.Go(func() {
				i := replays.Add(1)
				res, err := n.Reserve(ctx, testkit.ReserveReq(keys[rand.IntN(len(keys))], fmt.Sprintf("exec-r%d", i)))
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
