package ledger_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/internal/ledgertest"
	"github.com/effect-ledger/effect-ledger/internal/testkit"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// TestNamespace_EndLeases: only a reservation the predicate calls dead,
// still holding its lease and with no outcome, is ended; the key is then
// interrupted (unsafe_resume for a tool that is not idempotent), by a
// reserve of the same execution naming it, with the shortest lease. A
// second call ends nothing more.
func TestNamespace_EndLeases(t *testing.T) {
	ctx := context.Background()
	db := ledgertest.Open(t)
	dead := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-dead-0001", "dead-1"))
	ledgertest.MustReserve(t, db, testkit.ReserveReq("key-live-0001", "live-1"))
	done := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-done-0001", "dead-2"))
	ledgertest.MustCommit(t, db, testkit.Succeed("key-done-0001", done.Reservation))
	isDead := func(r *chain.Receipt) bool { return strings.HasPrefix(r.ExecutionID, "dead-") }

	ended, err := db.EndLeases(ctx, isDead)
	require.NoError(t, err)
	assert.Equal(t, []string{"key-dead-0001"}, ended)
	again, err := db.EndLeases(ctx, isDead)
	require.NoError(t, err)
	assert.Empty(t, again)

	v, err := db.Key(ctx, "key-dead-0001", false)
	require.NoError(t, err)
	last := v.Receipts[len(v.Receipts)-1]
	assert.Equal(t, chain.KindReserve, last.Kind)
	assert.Equal(t, "dead-1", last.ExecutionID)
	assert.Equal(t, uint64(2), last.Attempt)
	assert.Equal(t, dead.Receipt.Seq, last.RefSeq)
	assert.Equal(t, uint64(ledger.MinLeaseMS), last.LeaseExpiresAt-last.RecordedAt)

	db.Clock.Advance(time.Second)
	_, err = db.Reserve(ctx, testkit.ReserveReq("key-dead-0001", "other-1"))
	assert.Equal(t, ledger.ECodeUnsafeResume, ledger.ErrorCode(err))
	_, err = db.Reserve(ctx, testkit.ReserveReq("key-live-0001", "other-1"))
	assert.Equal(t, ledger.ECodeInProgress, ledger.ErrorCode(err), "a live reservation is not ended")
}
