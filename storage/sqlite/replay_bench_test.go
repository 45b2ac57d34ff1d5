package sqlite_test

import (
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/testkit/storetest"
)

// BenchmarkLedger_ReplayRandom measures replays of random keys among
// 5,000 committed ones (storetest.BenchReplay) on a SQLite file, with
// the writer's busy time per replay (what the check adds to the writer).
func BenchmarkLedger_ReplayRandom(b *testing.B) {
	db := ledgertest.Open(b, ledgertest.WithStore(quiet), ledgertest.WithNow(time.Now))
	keys := storetest.PrefillReplay(b, db.Namespace, 5000)
	before := db.WriterStats()
	storetest.BenchReplay(b, db.Namespace, keys)
	st := db.WriterStats()
	st.Ops -= before.Ops
	st.Busy -= before.Busy
	b.ReportMetric(float64(st.PerOp().Nanoseconds())/1000, "writer-µs/op")
}
