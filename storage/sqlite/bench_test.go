package sqlite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/gen"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/testkit/storetest"
)

// BenchmarkDB_ReserveCommit measures one reserve+commit pair at a time
// (two durable transactions).
func BenchmarkDB_ReserveCommit(b *testing.B) {
	db := ledgertest.Open(b)
	ctx := context.Background()
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		k := fmt.Sprintf("bench-key-%09d", i)
		i++
		res, err := db.Reserve(ctx, testkit.ReserveReq(k, "exec-1"))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := db.Commit(ctx, testkit.Succeed(k, res.Reservation)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
}

// BenchmarkDB_ReserveCommitParallel measures pairs from many goroutines,
// which the writer groups into shared transactions.
func BenchmarkDB_ReserveCommitParallel(b *testing.B) {
	db := ledgertest.Open(b)
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := fmt.Sprintf("bench-key-%09d", n.Add(1))
			res, err := db.Reserve(ctx, testkit.ReserveReq(k, "exec-1"))
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := db.Commit(ctx, testkit.Succeed(k, res.Reservation)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
	b.ReportMetric(float64(db.WriterStats().PerOp().Nanoseconds())/1000, "writer-µs/op")
}

// benchLedger returns a copy of a generated ledger of n receipts with
// UUID-like keys and its key index (cached in the temp dir across runs;
// n = 0 is a new file).
func benchLedger(b *testing.B, n int) string {
	b.Helper()
	path := filepath.Join(b.TempDir(), "ledger.db")
	if n == 0 {
		return path
	}
	if err := gen.Copy(cachedLedger(b, n), path); err != nil {
		b.Fatal(err)
	}
	return path
}

// cachedLedger generates a ledger of n receipts once, with its index.
func cachedLedger(b *testing.B, n int) string {
	cached, err := gen.Cached(context.Background(), n, b.Logf)
	if err != nil {
		b.Fatal(err)
	}
	return cached
}

// dirSize is the size of the regular files in dir.
func dirSize(dir string) int64 {
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

// BenchmarkIndex_Rebuild rebuilds the key index of the pre-filled ledger
// from its receipts (ledgerctl rebuild-index), one rebuild per op.
func BenchmarkIndex_Rebuild(b *testing.B) {
	n := benchReceipts(b)
	cached := cachedLedger(b, n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		path := filepath.Join(b.TempDir(), "ledger.db")
		if err := gen.Copy(cached, path); err != nil {
			b.Fatal(err)
		}
		_ = os.RemoveAll(sqlite.IndexPath(path)) // rebuilt from nothing
		b.StartTimer()
		if _, err := sqlite.RebuildIndex(context.Background(), path, "default", quiet); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if i == 0 {
			b.ReportMetric(float64(dirSize(sqlite.IndexPath(path)))/float64(n), "index-bytes/receipt")
		}
		_ = os.RemoveAll(filepath.Dir(path)) // not kept for the next op
		b.StartTimer()
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "receipts/s")
}

// benchReceipts is the size of the pre-filled ledger of the write
// benchmarks (LEDGER_BENCH_RECEIPTS, default 1,000,000).
func benchReceipts(b *testing.B) int {
	if v := os.Getenv("LEDGER_BENCH_RECEIPTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	return 1_000_000
}

// BenchmarkDB_PairsRandom is the write path as users load it: 32
// goroutines, each pair a new UUID-like key and execution id, on an empty
// ledger and on one pre-filled with a million receipts. It reports
// pairs/s, the writer's busy time per request and the file's bytes per
// receipt.
func BenchmarkDB_PairsRandom(b *testing.B) {
	for _, size := range []struct {
		name string
		n    int
	}{{"empty", 0}, {"prefilled", benchReceipts(b)}} {
		b.Run(size.name, func(b *testing.B) {
			path := benchLedger(b, size.n)
			opts := quiet
			if v := os.Getenv("LEDGER_BENCH_PAGE_SIZE"); v != "" {
				opts.PageSize, _ = strconv.Atoi(v) // new files only
			}
			if v := os.Getenv("LEDGER_BENCH_CACHE_MIB"); v != "" {
				opts.CacheMiB, _ = strconv.Atoi(v)
			}
			db := ledgertest.Open(b, ledgertest.WithPath(path), ledgertest.WithStore(opts), ledgertest.WithNow(time.Now))
			defer db.Close()
			before := db.WriterStats()
			clients := 32
			if v := os.Getenv("LEDGER_BENCH_CLIENTS"); v != "" {
				clients, _ = strconv.Atoi(v)
			}
			storetest.BenchPairs(b, db, clients, testkit.Succeed)
			st := db.WriterStats()
			st.Ops -= before.Ops
			st.Busy -= before.Busy
			st.Batches -= before.Batches
			if st.Batches > 0 {
				b.ReportMetric(float64(st.Ops-st.Batches)/float64(st.Batches), "receipts/batch")
			}
			b.ReportMetric(float64(st.PerOp().Nanoseconds())/1000, "writer-µs/op")
			head := db.Head()
			if os.Getenv("LEDGER_BENCH_INDEX_STATS") != "" {
				fmt.Fprintln(os.Stderr, db.Store.IndexStats())
			}
			if err := db.Close(); err != nil {
				b.Fatal(err)
			}
			if fi, err := os.Stat(path); err == nil && head.Seq > 0 {
				idx := dirSize(sqlite.IndexPath(path))
				b.ReportMetric(float64(fi.Size())/float64(head.Seq), "sqlite-bytes/receipt")
				b.ReportMetric(float64(idx)/float64(head.Seq), "index-bytes/receipt")
				b.ReportMetric(float64(fi.Size()+idx)/float64(head.Seq), "bytes/receipt")
			}
		})
	}
}
