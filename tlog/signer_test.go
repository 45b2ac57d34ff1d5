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

	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
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

// TestCheckpointer_SignOnce_twoSigners: two signers of one growing tree
// (replicas while the signer election changes hands). The other signer
// stores a larger checkpoint right after this one reads the tree's size:
// this one must see a stale signing (ErrStale), not a fork. It reads the
// last checkpoint first, so the tree it reads next is never smaller.
func TestCheckpointer_SignOnce_twoSigners(t *testing.T) {
	ctx := context.Background()
	db := ledgertest.Open(t)
	skey, _, err := tlog.GenerateKey("example.test")
	require.NoError(t, err)
	signer, _, _, err := tlog.LoadSignerText(skey, "example.test")
	require.NoError(t, err)
	origin := tlog.Origin("example.test", tlog.DefaultNamespace)
	other := &tlog.Checkpointer{Store: db, Signer: signer, Origin: origin}
	ledgertest.MustReserve(t, db, testkit.ReserveReq("key-first", "exec-1"))
	_, err = other.SignOnce(ctx)
	require.NoError(t, err)

	ledgertest.MustReserve(t, db, testkit.ReserveReq("key-second", "exec-1"))
	meanwhile := func() {
		ledgertest.MustReserve(t, db, testkit.ReserveReq("key-third", "exec-1"))
		s, err := other.SignOnce(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 3, s.Size)
	}
	cp := &tlog.Checkpointer{Store: afterTreeSize{db, meanwhile}, Signer: signer, Origin: origin}
	_, err = cp.SignOnce(ctx)
	require.ErrorIs(t, err, tlog.ErrStale)
	last, err := db.LatestCheckpoint(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 3, last.Size)
}

// afterTreeSize is a Store that runs fn after each TreeSize read.
type afterTreeSize struct {
	tlog.Store
	fn func()
}

func (s afterTreeSize) TreeSize(ctx context.Context) (int64, error) {
	n, err := s.Store.TreeSize(ctx)
	s.fn()
	return n, err
}
