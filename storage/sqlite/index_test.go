package sqlite_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// TestIndex_applyFails: when the index apply of a committed batch fails,
// the namespace answers unavailable rather than deciding from an index
// that lacks a committed receipt; once the index takes writes again, the
// next write replays what it lacked first, and the committed key is
// replayed.
func TestIndex_applyFails(t *testing.T) {
	ctx := context.Background()
	defer sqlite.SetIndexRetry(0, 0)() // retry at once
	db := ledgertest.Open(t)
	var fail atomic.Bool
	db.Store.SetIndexFault(func() error {
		if fail.Load() {
			return errors.New("disk says no")
		}
		return nil
	})
	res := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-aaaa-0001", "exec-1"))
	fail.Store(true)
	_, err := db.Commit(ctx, testkit.Succeed("key-aaaa-0001", res.Reservation))
	require.NoError(t, err, "the commit is durable: its answer stands")

	_, err = db.Reserve(ctx, testkit.ReserveReq("key-aaaa-0001", "exec-2"))
	require.ErrorIs(t, err, ledger.ErrUnavailable, "no decision from an index that lacks a committed receipt")
	_, err = db.Reserve(ctx, testkit.ReserveReq("key-bbbb-0002", "exec-3"))
	require.ErrorIs(t, err, ledger.ErrUnavailable)
	_, err = db.GetKey(ctx, "key-aaaa-0001")
	require.ErrorIs(t, err, ledger.ErrUnavailable, "no read of an outdated state either")

	fail.Store(false)
	again := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-aaaa-0001", "exec-2"))
	assert.Equal(t, ledger.StatusReplayed, again.Status)
	v, err := db.GetKey(ctx, "key-aaaa-0001")
	require.NoError(t, err)
	assert.Equal(t, ledger.StateSucceeded, v.State)
}

// TestIndex_metrics: the key index's memory and size are exported while
// a Store holds it.
func TestIndex_metrics(t *testing.T) {
	db := ledgertest.Open(t)
	ledgertest.MustReserve(t, db, testkit.ReserveReq("key-aaaa-0001", "exec-1"))
	families, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "ledger_key_index_") {
			got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	assert.Greater(t, got["ledger_key_index_memory_bytes"], 0.0)
	assert.Greater(t, got["ledger_key_index_disk_bytes"], 0.0)
}
