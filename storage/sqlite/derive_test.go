package sqlite_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// TestStore_RebuildIndex builds keys in every state, checks that the key
// index's records match the receipts, and rebuilds the index.
func TestStore_RebuildIndex(t *testing.T) {
	db := ledgertest.Open(t)
	clock := db.Clock
	ctx := context.Background()
	for i := range 6 {
		k := fmt.Sprintf("derive-key-%02d", i)
		req := testkit.ReserveReq(k, "exec-1")
		req.Idempotent = i%2 == 0
		res := ledgertest.MustReserve(t, db, req)
		switch i {
		case 0:
			ledgertest.MustCommit(t, db, testkit.Succeed(k, res.Reservation))
			ledgertest.MustReserve(t, db, testkit.ReserveReq(k, "exec-2"))
		case 1:
			ledgertest.MustCommit(t, db, testkit.Fail(k, res.Reservation, false))
		case 2:
			ledgertest.MustCommit(t, db, testkit.Fail(k, res.Reservation, true))
			req.Attempt = i64(2)
			ledgertest.MustReserve(t, db, req)
		}
	}
	clock.Advance(time.Minute)
	_, err := db.Resolve(ctx, ledger.ResolveRequest{IdempotencyKey: "derive-key-03", Outcome: chain.OutcomeSucceeded, Note: "ok"})
	require.NoError(t, err)
	ledgertest.MustReserve(t, db, testkit.ReserveReq("derive-key-04", "exec-9")) // takeover

	before := indexRecords(t, db)
	require.Len(t, before, 6)
	for _, k := range before {
		drift, err := mainChain(t, db).KeyDrift(ctx, k.Key)
		require.NoError(t, err)
		assert.Empty(t, drift, "the writer's records are what the receipts say")
	}
	require.NoError(t, db.RebuildIndex(ctx))
	assert.Equal(t, before, indexRecords(t, db), "a rebuild derives the records the writer wrote")
	v, err := db.GetKey(ctx, "derive-key-00")
	require.NoError(t, err)
	assert.Equal(t, ledger.StateSucceeded, v.State)
	assert.Len(t, v.Receipts, 3, "reserve, commit, replay")
}

// mainChain is the default namespace of db's store.
func mainChain(t *testing.T, db *ledgertest.DB) ledger.Chain {
	t.Helper()
	c, err := db.Store.Chain(context.Background(), ledger.DefaultNamespace)
	require.NoError(t, err)
	return c
}

// indexRecords lists the key records of the default namespace's index.
func indexRecords(t *testing.T, db *ledgertest.DB) []ledger.KeyRecord {
	t.Helper()
	var out []ledger.KeyRecord
	require.NoError(t, mainChain(t, db).Keys(context.Background(), func(k *ledger.KeyRecord) error {
		out = append(out, *k)
		return nil
	}))
	return out
}
