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
// of BenchPairs with 32 clients and a realistic payload on every commit —
// a ~200-byte result and an external reference. Each driver runs it on a
// namespace created inline and one created committed, in one process, and
// adds the bytes its files or tables take per receipt (the goal:
// committed ≥ 0.95× inline).
func BenchPairsPayloads(b *testing.B, n *ledger.Namespace) {
	result := json.RawMessage(`{"to":"` + strings.Repeat("x", 160) + `","amount":1200,"currency":"EUR"}`)
	BenchPairs(b, n, 32, func(key, token string) ledger.CommitRequest {
		return ledger.CommitRequest{IdempotencyKey: key, Reservation: token, Outcome: chain.OutcomeSucceeded,
			ExternalRef: "ch_" + key, Result: result}
	})
}

// BenchPairs is the write path as users load it: clients goroutines,
// each pair a reserve of a new UUID-like random key and execution id and
// its commit (commit makes the request). It reports pairs/s.
func BenchPairs(b *testing.B, w testkit.Writer, clients int, commit func(key, token string) ledger.CommitRequest) {
	ctx := context.Background()
	var seq atomic.Uint64
	salt := strconv.FormatUint(rand.Uint64(), 36)
	b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := seq.Add(1)
			k := gen.UUIDLike("bench-key-"+salt, i)
			res, err := w.Reserve(ctx, testkit.ReserveReq(k, gen.UUIDLike("bench-exec-"+salt, i)))
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := w.Commit(ctx, commit(k, res.Reservation)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
}
