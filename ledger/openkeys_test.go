package ledger_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// flakyStore is a store whose OpenKeys fails while fail is set.
type flakyStore struct {
	ledger.Store
	fail atomic.Bool
}

func (s *flakyStore) OpenKeys(ctx context.Context) ([]ledger.OpenKeyCount, error) {
	if s.fail.Load() {
		return nil, errors.New("database gone")
	}
	return s.Store.OpenKeys(ctx)
}

// gatherKeysWaiting returns the ledger_keys_waiting series of the default
// registry as "namespace/state/idempotent" → value, or nil when none.
func gatherKeysWaiting(t *testing.T) map[string]float64 {
	t.Helper()
	fams, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != "ledger_keys_waiting" {
			continue
		}
		out := map[string]float64{}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			out[l["namespace"]+"/"+l["state"]+"/"+l["idempotent"]] = m.GetGauge().GetValue()
		}
		return out
	}
	return nil
}

// TestLedger_keysWaitingGauge: ledger_keys_waiting has four series per
// namespace, zeros included; a count serves scrapes for OpenKeysMaxAge of
// the ledger's clock; a failed count serves the last one; a closed
// ledger exports nothing.
func TestLedger_keysWaitingGauge(t *testing.T) {
	ctx := context.Background()
	clock := testkit.NewClock()
	st, err := sqlite.OpenStore(ctx, filepath.Join(t.TempDir(), "ledger.db"),
		sqlite.Options{Now: clock.Now, Logger: ledgertest.Quiet}, false)
	require.NoError(t, err)
	store := &flakyStore{Store: st}
	l := ledger.New(store, ledger.Config{Now: clock.Now, Logger: ledgertest.Quiet})
	defer func() { _ = l.Close() }()
	zeros := func(ns ...string) map[string]float64 {
		out := map[string]float64{}
		for _, n := range ns {
			for _, s := range []string{"reserved", "interrupted"} {
				out[n+"/"+s+"/false"], out[n+"/"+s+"/true"] = 0, 0
			}
		}
		return out
	}
	require.Equal(t, zeros("default"), gatherKeysWaiting(t))

	n, err := l.Default(ctx)
	require.NoError(t, err)
	r := testkit.ReserveReq(key, "exec-1")
	r.LeaseMS = i64(1000)
	_, err = n.Reserve(ctx, r)
	require.NoError(t, err)
	require.NoError(t, l.CreateNamespace(ctx, "payments", ledger.NamespaceSettings{}))
	require.Equal(t, zeros("default"), gatherKeysWaiting(t), "the count of a moment ago is served")

	clock.Advance(ledger.OpenKeysMaxAge)
	want := zeros("default", "payments")
	want["default/interrupted/false"] = 1
	require.Equal(t, want, gatherKeysWaiting(t), "counted again, on the ledger's clock")

	store.fail.Store(true)
	_, err = n.Resolve(ctx, ledger.ResolveRequest{IdempotencyKey: key, Outcome: "succeeded", Note: "checked", Actor: "ops"})
	require.NoError(t, err)
	clock.Advance(ledger.OpenKeysMaxAge)
	require.Equal(t, want, gatherKeysWaiting(t), "a failed count serves the last one")
	store.fail.Store(false)
	require.Equal(t, zeros("default", "payments"), gatherKeysWaiting(t), "and the next scrape counts again")

	require.NoError(t, l.Close())
	require.Nil(t, gatherKeysWaiting(t), "a closed ledger exports nothing")
}
