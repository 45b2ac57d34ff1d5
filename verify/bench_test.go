package verify_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit/gen"
	"github.com/effect-ledger/effect-ledger/verify"
)

// makeLedger writes a valid ledger of n receipts for benchmarks.
func makeLedger(tb testing.TB, n int) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "big.db")
	if _, err := gen.Ledger(context.Background(), path, n, nil); err != nil {
		tb.Fatal(err)
	}
	return path
}

// BenchmarkVerifier_offline verifies a generated ledger from its file.
// LEDGER_BENCH_RECEIPTS sets its size (default 100,000; the BENCHMARKS.md
// figure uses 1,000,000).
func BenchmarkVerifier_offline(b *testing.B) {
	n := 100_000
	if v, err := strconv.Atoi(os.Getenv("LEDGER_BENCH_RECEIPTS")); err == nil && v > 0 {
		n = v
	}
	path := makeLedger(b, n)
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer rd.Close()
	var peak uint64
	b.ResetTimer()
	for b.Loop() {
		rep, err := verify.New(rd, verify.Opts{}).Check(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if !rep.OK || rep.Receipts != uint64(n) {
			b.Fatalf("ok=%v receipts=%d violations=%v", rep.OK, rep.Receipts, rep.Violations)
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapInuse)
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "receipts/s")
	b.ReportMetric(float64(peak)/(1<<20), "heap-MiB")
}
