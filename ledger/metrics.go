package ledger

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/effect-ledger/effect-ledger/internal/metrics"
)

// Metrics of the write path. Labels are fixed sets: receipt kinds and
// contract statuses or error codes.
var (
	receiptsAppended = metrics.CounterVec("ledger_receipts_appended_total",
		"Receipts appended to the chain, by kind and namespace.", "kind", "namespace")
	reserveOutcomes = metrics.CounterVec("ledger_reserve_outcomes_total",
		"Reserve requests by outcome: reserved, takeover, retry, renewed, after_not_applied, replayed, not_recorded or the error code.", "status", "namespace")
	commitOutcomes = metrics.CounterVec("ledger_commit_outcomes_total",
		"Commit requests by outcome: committed, late, repeat or the error code.", "status", "namespace")
	resolveOutcomes = metrics.CounterVec("ledger_resolve_outcomes_total",
		"Resolve requests by outcome: resolved or the error code.", "status", "namespace")
	headSeq = metrics.GaugeVec("ledger_chain_head_seq",
		"Seq of the latest durable receipt, by namespace.", "namespace")
	batchSize = metrics.Histogram("ledger_writer_batch_ops",
		"Write operations per transaction (group commit).", prometheus.ExponentialBuckets(1, 2, 10))
	writerReady = metrics.Gauge("ledger_writer_ready",
		"1 while the database accepts writes (the last write batch or readiness probe committed), 0 after one failed: what /readyz reports.")
	batchFailures = metrics.Counter("ledger_writer_batch_failures_total",
		"Write batches rolled back because the database could not be written (every request in them got 503).")
	batchSeconds = metrics.Histogram("ledger_writer_batch_duration_seconds",
		"Time from BEGIN to durable COMMIT of one write batch.", prometheus.ExponentialBuckets(0.0001, 2, 14))
	writerBusy = metrics.Counter("ledger_writer_busy_seconds_total",
		"Time the single writer spent running batches (BEGIN to durable COMMIT); divided by ledger_writer_ops_total it is the writer's cost per request.")
	writerOps = metrics.Counter("ledger_writer_ops_total",
		"Write operations run by the writer (requests and probes).")
	erasures = metrics.CounterVec("ledger_erasures_total",
		"Erase receipts appended (SPEC §14), by namespace and trigger (request, retention, replay).", "namespace", "trigger")
)

// SetHeadMetric sets the ledger_chain_head_seq gauge of namespace ns to
// seq: what a driver reports when it opens a namespace, before the first
// append moves the head.
func SetHeadMetric(ns string, seq uint64) { headSeq.WithLabelValues(ns).Set(float64(seq)) }
