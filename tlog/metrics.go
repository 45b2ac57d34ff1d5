package tlog

import "github.com/effect-ledger/effect-ledger/internal/metrics"

var (
	checkpointsSigned = metrics.CounterVec("ledger_tlog_checkpoints_signed_total",
		"Checkpoints signed and stored by this process, by namespace.", "namespace")
	checkpointSize = metrics.GaugeVec("ledger_tlog_checkpoint_size",
		"Tree size of the latest signed checkpoint (the stored one at start; with replicas, the latest any of them stored), by namespace.", "namespace")
	checkpointFailures = metrics.CounterVec("ledger_tlog_checkpoint_failures_total",
		"Attempts to sign a checkpoint of a grown tree that failed (storage errors, or a tree that no longer extends the last checkpoint), by namespace; each is retried on the next interval. A checkpoint another replica stored first is not a failure.", "namespace")
)

var (
	witnessRequests = metrics.CounterVec("ledger_tlog_witness_requests_total",
		"add-checkpoint requests to witnesses by result: cosigned, conflict (409, retried from the witness's size), refused (another status), invalid_cosignature, error (no answer).", "result")
	witnessErrors = metrics.CounterVec("ledger_witness_errors_total",
		"add-checkpoint requests a witness refused, by witness (its key name) and error: witness_key_unknown (403: the witness knows none of the keys that signed, e.g. after a key rotation it was not told of), refused (another status).", "witness", "error")
	witnessedSize = metrics.Gauge("ledger_tlog_witnessed_checkpoint_size",
		"Tree size of the checkpoint served, the newest one cosigned by the witness quorum.")
)

func init() {
	// Export every result from the start, so dashboards see zeros.
	for _, r := range []string{"cosigned", "conflict", "refused", "invalid_cosignature", "error"} {
		witnessRequests.WithLabelValues(r)
	}
}

func init() {
	// The default namespace's series exist from the start, signing or not,
	// so that dashboards and alerts see zeros rather than nothing.
	checkpointsSigned.WithLabelValues("default")
	checkpointSize.WithLabelValues("default")
	checkpointFailures.WithLabelValues("default")
}
