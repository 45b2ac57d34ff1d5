package tlog_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/tlog"
)

// failingStore is a Store whose tree has grown but whose checkpoints
// cannot be read: every signing attempt fails.
type failingStore struct{ latest *tlog.Signed }

func (failingStore) TreeSize(context.Context) (int64, error)     { return 5, nil }
func (failingStore) HashReader(context.Context) sumdb.HashReader { return nil }
func (failingStore) StoreCheckpoint(context.Context, *tlog.Signed) error {
	return errors.New("disk full")
}
func (f failingStore) LatestCheckpoint(context.Context) (*tlog.Signed, error) {
	if f.latest != nil {
		return f.latest, nil
	}
	return nil, errors.New("database is locked")
}

func metricValue(t *testing.T, name string) (float64, bool) {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) == 0 {
			continue
		}
		m := mf.GetMetric()[0]
		if m.GetCounter() != nil {
			return m.GetCounter().GetValue(), true
		}
		return m.GetGauge().GetValue(), true
	}
	return 0, false
}

// TestCheckpointer_Run_failuresCounted: a signer that cannot sign counts
// every failed attempt, so that an alert can fire (the log line is only
// written once per distinct error).
func TestCheckpointer_Run_failuresCounted(t *testing.T) {
	before, _ := metricValue(t, "ledger_tlog_checkpoint_failures_total")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Millisecond)
	defer cancel()
	(&tlog.Checkpointer{Store: failingStore{}, Origin: "ex.test/default", Interval: 10 * time.Millisecond}).Run(ctx)
	after, ok := metricValue(t, "ledger_tlog_checkpoint_failures_total")
	require.True(t, ok)
	assert.GreaterOrEqual(t, after-before, 3.0, "every failed attempt is counted")
}

// TestCheckpointer_Run_sizeAtStart: the published size is exported at
// start, before the tree grows again.
func TestCheckpointer_Run_sizeAtStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	(&tlog.Checkpointer{Store: failingStore{latest: &tlog.Signed{Size: 42}}, Origin: "ex.test/default", Interval: 10 * time.Millisecond}).Run(ctx)
	v, ok := metricValue(t, "ledger_tlog_checkpoint_size")
	require.True(t, ok)
	assert.Equal(t, 42.0, v)
}
