package sqlite_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit/gen"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// BenchmarkSQLite_Prune measures SPEC §16 on a generated ledger of
// benchReceipts receipts (a million by default) whose keys expire after an
// hour: a prune of all but the last 100,000 — the segment written,
// fsynced and read back, the prune receipt, then the deletion of the
// bodies — and the bytes the file uses before and after (its pages in
// use; the file itself keeps its size, its free pages reused) and after
// a VACUUM (what `ledgerctl compact` gives back). Run it once:
// -benchtime=1x.
func BenchmarkSQLite_Prune(b *testing.B) {
	ctx := context.Background()
	n := benchReceipts(b)
	const keep = 100_000
	for b.Loop() {
		dir := b.TempDir()
		path := filepath.Join(dir, "ledger.db")
		if _, err := gen.LedgerTTL(ctx, path, n, uint64(time.Hour.Milliseconds()), nil); err != nil {
			b.Fatal(err)
		}
		now := func() time.Time { return time.UnixMilli(int64(gen.T0) + int64(n) + 2*time.Hour.Milliseconds()) }
		opts := quiet
		opts.Now = now
		st, err := sqlite.OpenStore(ctx, path, opts, false)
		if err != nil {
			b.Fatal(err)
		}
		archive := filepath.Join(dir, "archive")
		if err := os.Mkdir(archive, 0o755); err != nil {
			b.Fatal(err)
		}
		l := ledger.New(st, ledger.Config{Now: now, ArchiveDir: archive, Logger: quiet.Logger})
		ns, err := l.Default(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ns.SetPolicy(ctx, json.RawMessage(`{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`), "ops"); err != nil {
			b.Fatal(err)
		}
		skey, _, err := tlog.GenerateKey("bench.test")
		if err != nil {
			b.Fatal(err)
		}
		signer, err := note.NewSigner(skey)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := (&tlog.Checkpointer{Store: ns, Signer: signer, Origin: "bench.test/default"}).SignOnce(ctx); err != nil {
			b.Fatal(err)
		}
		before := usedBytes(b, path)
		start := time.Now()
		res, err := ns.Prune(ctx, ledger.PruneRequest{Through: uint64(n - keep), Actor: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		archived := time.Since(start)
		if err := ns.DeletePruned(ctx); err != nil {
			b.Fatal(err)
		}
		deleted := time.Since(start) - archived
		after := usedBytes(b, path)
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
		compacted, err := sqlite.Compact(ctx, path, quiet)
		if err != nil {
			b.Fatal(err)
		}
		pruned := float64(res.Through)
		b.ReportMetric(pruned/archived.Seconds(), "archived-receipts/s")
		b.ReportMetric(pruned/deleted.Seconds(), "deleted-receipts/s")
		b.ReportMetric(float64(before)/float64(n), "B/receipt-before")
		b.ReportMetric(float64(after)/float64(before), "used-ratio")
		b.ReportMetric(float64(compacted.After)/float64(compacted.Before), "compacted-ratio")
		b.ReportMetric(float64(dirSize(filepath.Join(archive, res.Segment)))/pruned, "archive-B/receipt")
	}
}

// usedBytes is the bytes of the pages of the ledger file in use.
func usedBytes(b *testing.B, path string) int64 {
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	var pages, free, size int64
	for q, dst := range map[string]*int64{"PRAGMA page_count": &pages, "PRAGMA freelist_count": &free, "PRAGMA page_size": &size} {
		if err := db.QueryRow(q).Scan(dst); err != nil {
			b.Fatal(err)
		}
	}
	return (pages - free) * size
}
