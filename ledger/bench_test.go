package ledger_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
)

// BenchmarkDB_ReserveCommit measures one reserve+commit pair at a time
// (two durable transactions).
func BenchmarkDB_ReserveCommit(b *testing.B) {
	db, _ := MustOpenDB(b)
	ctx := context.Background()
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		k := fmt.Sprintf("bench-key-%09d", i)
		i++
		res, err := db.Reserve(ctx, reserveReq(k, "exec-1"))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := db.Commit(ctx, succeed(k, res.Reservation)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
}

// BenchmarkDB_ReserveCommitParallel measures pairs from many goroutines,
// which the writer groups into shared transactions.
func BenchmarkDB_ReserveCommitParallel(b *testing.B) {
	db, _ := MustOpenDB(b)
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := fmt.Sprintf("bench-key-%09d", n.Add(1))
			res, err := db.Reserve(ctx, reserveReq(k, "exec-1"))
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := db.Commit(ctx, succeed(k, res.Reservation)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
}
