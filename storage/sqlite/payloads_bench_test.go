package sqlite_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/gen"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// BenchmarkDB_PairsPayloads is the cost of committed payloads (SPEC §14):
// the same load as BenchmarkDB_PairsRandom (32 goroutines, UUID-like keys)
// with a realistic payload on every commit — a ~200-byte result and an
// external reference — on a default namespace created inline and one
// created committed. Run the two in one process and compare (the goal:
// committed ≥ 0.95× inline):
//
//	go test -run XXX -bench PairsPayloads -count 5 ./storage/sqlite
//
// It reports pairs/s and the file's bytes per receipt (after a TRUNCATE
// checkpoint at close: values and salts included for committed).
func BenchmarkDB_PairsPayloads(b *testing.B) {
	result := json.RawMessage(`{"to":"` + strings.Repeat("x", 160) + `","amount":1200,"currency":"EUR"}`)
	for _, mode := range []ledger.PayloadMode{ledger.PayloadsInline, ledger.PayloadsCommitted} {
		b.Run(string(mode), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "ledger.db")
			opts := quiet
			opts.Payloads = mode
			db := ledgertest.Open(b, ledgertest.WithPath(path), ledgertest.WithStore(opts), ledgertest.WithNow(time.Now))
			defer db.Close()
			ctx := context.Background()
			var seq atomic.Uint64
			salt := strconv.FormatInt(time.Now().UnixNano(), 10)
			b.SetParallelism((32 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := seq.Add(1)
					k := gen.UUIDLike("bench-key-"+salt, i)
					res, err := db.Reserve(ctx, testkit.ReserveReq(k, gen.UUIDLike("bench-exec-"+salt, i)))
					if err != nil {
						b.Error(err)
						return
					}
					if _, err := db.Commit(ctx, ledger.CommitRequest{IdempotencyKey: k, Reservation: res.Reservation,
						Outcome: chain.OutcomeSucceeded, ExternalRef: "ch_" + k, Result: result}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
			head := db.Head()
			if err := db.Close(); err != nil {
				b.Fatal(err)
			}
			if fi, err := os.Stat(path); err == nil && head.Seq > 0 {
				b.ReportMetric(float64(fi.Size())/float64(head.Seq), "sqlite-bytes/receipt")
			}
		})
	}
}
