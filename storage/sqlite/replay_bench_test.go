package sqlite_test

import (
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/internal/ledgertest"
	"github.com/effect-ledger/effect-ledger/storage/storetest"
)

// BenchmarkLedger_ReplayRandom measures replays of random keys among
// 5,000 committed ones (storetest.BenchReplay) on a SQLite file.
func BenchmarkLedger_ReplayRandom(b *testing.B) {
	db := ledgertest.Open(b, ledgertest.WithStore(quiet), ledgertest.WithNow(time.Now))
	storetest.BenchReplay(b, db.Namespace, 5000)
	b.ReportMetric(float64(db.WriterStats().PerOp().Nanoseconds())/1000, "writer-µs/op")
}
