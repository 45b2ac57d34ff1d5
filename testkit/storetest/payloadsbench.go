package storetest

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/gen"
)

// PayloadsModes are the two payload modes (SPEC §14) BenchPairsPayloads
// compares, inline first.
var PayloadsModes = []ledger.PayloadMode{ledger.PayloadsInline, ledger.PayloadsCommitted}

// BenchPairsPayloads is the cost of committed payloads (SPEC §14): the load
// of the pairs benchmarks (32 goroutines, UUID-like random keys), a
// reserve and a commit each, with a realistic payload on every commit — a
// ~200-byte result and an external reference. Each driver runs it on a
// namespace created inline and one created committed, in one process,
// and adds the bytes its files or tables take per receipt (the goal:
// committed ≥ 0.95× inline). It reports pairs/s.
func BenchPairsPayloads(b *testing.B, n *ledger.Namespace) {
	result := json.RawMessage(`{"to":"` + strings.Repeat("x", 160) + `","amount":1200,"currency":"EUR"}`)
	ctx := context.Background()
	var seq atomic.Uint64
	salt := strconv.FormatUint(rand.Uint64(), 36)
	b.SetParallelism((32 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := seq.Add(1)
			k := gen.UUIDLike("bench-key-"+salt, i)
			res, err := n.Reserve(ctx, testkit.ReserveReq(k, gen.UUIDLike("bench-exec-"+salt, i)))
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := n.Commit(ctx, ledger.CommitRequest{IdempotencyKey: k, Reservation: res.Reservation,
				Outcome: chain.OutcomeSucceeded, ExternalRef: "ch_" + k, Result: result}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
}
