package sqlite_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// metricValue reads a gauge or counter without labels from the default
// registry, where ledger's metrics live.
func metricValue(t *testing.T, name string) float64 {
	t.Helper()
	fams, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		require.Len(t, f.GetMetric(), 1, name)
		m := f.GetMetric()[0]
		if m.GetGauge() != nil {
			return m.GetGauge().GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("metric %s is not registered", name)
	return 0
}

// TestStore_readyMetric: ledger_writer_ready follows what /readyz reports, and
// every failed batch is counted.
func TestStore_readyMetric(t *testing.T) {
	db := ledgertest.Open(t)
	ctx := context.Background()
	assert.Equal(t, 1.0, metricValue(t, "ledger_writer_ready"), "ready after Open")

	var failing atomic.Bool
	db.Store.SetBeforeCommit(func() error {
		if failing.Load() {
			return errInjected
		}
		return nil
	})
	failuresBefore := metricValue(t, "ledger_writer_batch_failures_total")
	failing.Store(true)
	_, err := db.Reserve(ctx, testkit.ReserveReq("ready-key-0001", "exec-1"))
	require.ErrorIs(t, err, ledger.ErrUnavailable)
	assert.Equal(t, 0.0, metricValue(t, "ledger_writer_ready"), "not ready after a failed batch")
	assert.Equal(t, failuresBefore+1, metricValue(t, "ledger_writer_batch_failures_total"))
	assert.Error(t, db.Ledger.Ready(ctx))
	assert.Equal(t, 0.0, metricValue(t, "ledger_writer_ready"), "a failed probe keeps it 0")
	assert.Equal(t, failuresBefore+2, metricValue(t, "ledger_writer_batch_failures_total"))

	failing.Store(false)
	_ = db.Ledger.Ready(ctx) // the probe write succeeds; this check may still answer not ready
	assert.Equal(t, 1.0, metricValue(t, "ledger_writer_ready"), "ready again once the probe wrote")
	require.NoError(t, db.Ledger.Ready(ctx))
	assert.Equal(t, 1.0, metricValue(t, "ledger_writer_ready"))
}
