package sqlite

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/effect-ledger/effect-ledger/storage/keyindex"
)

// walCheckpoints counts the SQLite driver's background WAL checkpoints.
var walCheckpoints = promauto.NewCounterVec(prometheus.CounterOpts{
	Name: "ledger_wal_checkpoints_total",
	Help: "Background WAL checkpoints by result (ok, busy, error).",
}, []string{"result"})

// The key index's size, for the process's one writing Store (the last
// opened: ledgerd opens one). Its memory is allocated by Pebble outside
// the Go heap, so it shows in the RSS but not in go_memstats_*.
var (
	indexMu      sync.Mutex
	indexCurrent *keyindex.Index

	_ = promauto.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ledger_key_index_memory_bytes",
		Help: "Memory of the SQLite key index: its block cache and memtables (part of --cache-mib, allocated outside the Go heap).",
	}, func() float64 { return indexGauge((*keyindex.Index).Memory) })
	_ = promauto.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ledger_key_index_disk_bytes",
		Help: "Size on disk of the SQLite key index (<ledger file>.idx/).",
	}, func() float64 { return indexGauge(func(ix *keyindex.Index) int64 { return int64(ix.DiskBytes()) }) })
)

func indexGauge(f func(*keyindex.Index) int64) float64 {
	indexMu.Lock()
	defer indexMu.Unlock()
	if indexCurrent == nil {
		return 0
	}
	return float64(f(indexCurrent))
}

// setIndexMetrics makes ix the index the gauges report (nil: none).
func setIndexMetrics(ix *keyindex.Index) {
	indexMu.Lock()
	indexCurrent = ix
	indexMu.Unlock()
}
