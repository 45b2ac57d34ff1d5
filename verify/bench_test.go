package verify_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	_ "github.com/mattn/go-sqlite3"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/verify"
)

// makeLedger writes a valid ledger of n receipts (reserve+commit pairs)
// straight into a new file, fast, for benchmarks.
func makeLedger(tb testing.TB, n int) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "big.db")
	db, err := ledger.Open(context.Background(), path, ledger.Options{Logger: quiet})
	if err != nil {
		tb.Fatal(err)
	}
	if err := db.Close(); err != nil {
		tb.Fatal(err)
	}
	raw, err := sql.Open("sqlite3", path+"?_journal_mode=WAL&_synchronous=OFF")
	if err != nil {
		tb.Fatal(err)
	}
	defer raw.Close()
	tx, err := raw.Begin()
	if err != nil {
		tb.Fatal(err)
	}
	stmt, err := tx.Prepare(`INSERT INTO receipts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	if err != nil {
		tb.Fatal(err)
	}
	var h chain.Hasher
	prev := chain.ZeroHash
	t0 := uint64(1764475200000)
	for i := 1; i <= n; i++ {
		pair := uint64((i + 1) / 2)
		r := chain.Receipt{Seq: uint64(i), Kind: chain.KindReserve, IdempotencyKey: fmt.Sprintf("bench-key-%010d", pair),
			ExecutionID: fmt.Sprintf("exec-%010d", pair), Attempt: 1, Tool: "payments.refund", Effect: chain.EffectWrite,
			InputHash:  "sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8",
			RecordedAt: t0 + pair, LeaseExpiresAt: t0 + pair + 30000}
		if i%2 == 0 {
			r.Kind, r.Outcome, r.ExternalRef, r.Result, r.RefSeq, r.LeaseExpiresAt = chain.KindCommit,
				chain.OutcomeSucceeded, "re_"+strconv.Itoa(i), `{"amount":1200,"currency":"eur"}`, uint64(i-1), 0
			r.InputHash = fmt.Sprintf("sha256:%064d", pair) // distinct inputs: no duplicate effects
		}
		if i%2 == 1 {
			r.InputHash = fmt.Sprintf("sha256:%064d", pair)
		}
		r.PrevHash = prev
		r.Hash = h.Hash(prev, &r)
		if _, err := stmt.Exec(r.Seq, r.Kind, r.IdempotencyKey, r.KeyGenerated, r.ExecutionID, r.Attempt, r.Tool,
			r.Effect, r.Idempotent, r.InputHash, r.Outcome, r.ExternalRef, r.Result, r.ErrorCode, r.ErrorMessage,
			r.Retryable, r.LeaseExpiresAt, r.RefSeq, r.Actor, r.Note, r.RecordedAt, r.PrevHash[:], r.Hash[:]); err != nil {
			tb.Fatal(err)
		}
		prev = r.Hash
	}
	if err := tx.Commit(); err != nil {
		tb.Fatal(err)
	}
	db, err = ledger.Open(context.Background(), path, ledger.Options{Logger: quiet})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := db.RebuildKeys(context.Background()); err != nil {
		tb.Fatal(err)
	}
	if err := db.Close(); err != nil {
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
	rd, err := ledger.OpenReader(context.Background(), path, ledger.Options{})
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
