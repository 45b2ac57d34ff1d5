package postgres_test

import (
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/postgres"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
	"github.com/effect-ledger/effect-ledger/testkit/storetest"
)

// BenchmarkLedger_ReplayRandom measures replays of random keys among
// 5,000 committed ones (storetest.BenchReplay) on PostgreSQL, with
// ledgerd's default linger.
func BenchmarkLedger_ReplayRandom(b *testing.B) {
	l := ledger.New(mustOpen(b, pgtest.URL(b), postgres.Options{}), ledger.Config{Linger: 5 * time.Millisecond})
	b.Cleanup(func() { _ = l.Close() })
	n := mustNS(b, l, ledger.DefaultNamespace)
	storetest.BenchReplay(b, n, storetest.PrefillReplay(b, n, 5000))
}
