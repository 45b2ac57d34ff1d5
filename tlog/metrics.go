package tlog

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	checkpointsSigned = promauto.NewCounter(prometheus.CounterOpts{
		Name: "ledger_tlog_checkpoints_signed_total",
		Help: "Checkpoints signed and stored.",
	})
	checkpointSize = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "ledger_tlog_checkpoint_size",
		Help: "Tree size of the latest signed checkpoint.",
	})
)
