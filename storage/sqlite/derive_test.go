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
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// TestDB_RebuildKeys builds keys in every state, checks that the stored
// derived table matches the receipts, wipes it and rebuilds it.
func TestDB_RebuildKeys(t *testing.T) {
	db, clock := MustOpenDB(t)
	ctx := context.Background()
	for i := range 6 {
		k := fmt.Sprintf("derive-key-%02d", i)
		req := reserveReq(k, "exec-1")
		req.Idempotent = i%2 == 0
		res := mustReserve(t, db, req)
		switch i {
		case 0:
			mustCommit(t, db, succeed(k, res.Reservation))
			mustReserve(t, db, reserveReq(k, "exec-2"))
		case 1:
			mustCommit(t, db, fail(k, res.Reservation, false))
		case 2:
			mustCommit(t, db, fail(k, res.Reservation, true))
			req.Attempt = i64(2)
			mustReserve(t, db, req)
		}
	}
	clock.Advance(time.Minute)
	_, err := db.Resolve(ctx, ledger.ResolveRequest{IdempotencyKey: "derive-key-03", Outcome: chain.OutcomeSucceeded, Note: "ok"})
	require.NoError(t, err)
	mustReserve(t, db, reserveReq("derive-key-04", "exec-9")) // takeover

	w, _ := db.Store.Pools()
	drift := func() int {
		rows, err := w.QueryContext(ctx, sqlite.SQLKeysDrift)
		require.NoError(t, err)
		defer rows.Close()
		n := 0
		for rows.Next() {
			n++
		}
		require.NoError(t, rows.Err())
		return n
	}
	assert.Zero(t, drift(), "the writer keeps keys equal to what the receipts say")

	_, err = w.ExecContext(ctx, `UPDATE keys SET final_seq = 0 WHERE idempotency_key = 'derive-key-00'`)
	require.NoError(t, err)
	assert.Equal(t, 2, drift(), "a damaged row shows up both ways")

	_, err = w.ExecContext(ctx, `DELETE FROM keys`)
	require.NoError(t, err)
	n, err := db.RebuildKeys(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(6), n)
	assert.Zero(t, drift())
	v, err := db.GetKey(ctx, "derive-key-00")
	require.NoError(t, err)
	assert.Equal(t, ledger.StateSucceeded, v.State)
}
