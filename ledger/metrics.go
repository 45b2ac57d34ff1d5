package ledger

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics of the write path. Labels are fixed sets: receipt kinds and
// contract statuses or error codes.
var (
	receiptsAppended = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "ledger_receipts_appended_total",
		Help: "Receipts appended to the chain, by kind and namespace.",
	}, []string{"kind", "namespace"})
	reserveOutcomes = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "ledger_reserve_outcomes_total",
		Help: "Reserve requests by outcome: reserved, takeover, retry, renewed, after_not_applied, replayed, not_recorded or the error code.",
	}, []string{"status", "namespace"})
	commitOutcomes = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "ledger_commit_outcomes_total",
		Help: "Commit requests by outcome: committed, late, repeat or the error code.",
	}, []string{"status", "namespace"})
	resolveOutcomes = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "ledger_resolve_outcomes_total",
		Help: "Resolve requests by outcome: resolved or the error code.",
	}, []string{"status", "namespace"})
	headSeq = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ledger_chain_head_seq",
		Help: "Seq of the latest durable receipt, by namespace.",
	}, []string{"namespace"})
	batchSize = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "ledger_writer_batch_ops",
		Help:    "Write operations per transaction (group commit).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 10),
	})
	writerReady = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "ledger_writer_ready",
		Help: "1 while the database accepts writes (the last write batch or readiness probe committed), 0 after one failed: what /readyz reports.",
	})
	batchFailures = promauto.NewCounter(prometheus.CounterOpts{
		Name: "ledger_writer_batch_failures_total",
		Help: "Write batches rolled back because the database could not be written (every request in them got 503).",
	})
	batchSeconds = promauto.NewHistogram(prometheus.HistogramOpts{
		Name:    "ledger_writer_batch_duration_seconds",
		Help:    "Time from BEGIN to durable COMMIT of one write batch.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
	})
	writerBusy = promauto.NewCounter(prometheus.CounterOpts{
		Name: "ledger_writer_busy_seconds_total",
		Help: "Time the single writer spent running batches (BEGIN to durable COMMIT); divided by ledger_writer_ops_total it is the writer's cost per request.",
	})
	writerOps = promauto.NewCounter(prometheus.CounterOpts{
		Name: "ledger_writer_ops_total",
		Help: "Write operations run by the writer (requests and probes).",
	})
)

// SetHeadMetric sets the ledger_chain_head_seq gauge of namespace ns to
// seq: what a driver reports when it opens a namespace, before the first
// append moves the head.
func SetHeadMetric(ns string, seq uint64) { headSeq.WithLabelValues(ns).Set(float64(seq)) }
