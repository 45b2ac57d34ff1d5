package sqlite

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// walCheckpoints counts the SQLite driver's background WAL checkpoints.
var walCheckpoints = promauto.NewCounterVec(prometheus.CounterOpts{
	Name: "ledger_wal_checkpoints_total",
	Help: "Background WAL checkpoints by result (ok, busy, error).",
}, []string{"result"})
