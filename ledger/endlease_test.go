package ledger_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
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

// TestNamespace_EndLeasesUnderPolicy: ending a dead lease runs nothing,
// so it never asks, denies or consumes an approval. Under a policy that
// now denies the tool or holds it for approval (a call the dead execution
// made before that policy) the key is left to its lease, nothing is
// appended, and the dead reservations after it are still ended; the
// chain stays valid.
func TestNamespace_EndLeasesUnderPolicy(t *testing.T) {
	ctx := context.Background()
	db := ledgertest.Open(t)
	denied := testkit.ReserveReq("key-denied-01", "dead-1")
	denied.Tool = "mail.send"
	ledgertest.MustReserve(t, db, denied)
	held := testkit.ReserveReq("key-held-0001", "dead-2")
	held.Tool = "payments.charge"
	ledgertest.MustReserve(t, db, held)
	ledgertest.MustReserve(t, db, testkit.ReserveReq("key-free-0001", "dead-3"))
	_, err := db.SetPolicy(ctx, json.RawMessage(`{"rules":[{"tool":"mail.send","deny":true},{"tool":"payments.charge","approval":"required"}]}`), "ops")
	require.NoError(t, err)
	head := db.Head()

	ended, err := db.EndLeases(ctx, func(r *chain.Receipt) bool { return strings.HasPrefix(r.ExecutionID, "dead-") })
	require.NoError(t, err)
	assert.Equal(t, []string{"key-free-0001"}, ended)
	assert.Equal(t, head.Seq+1, db.Head().Seq, "one receipt: the free key's end; no ask, no deny")
	_, err = db.Reserve(ctx, held)
	assert.Equal(t, ledger.ECodeInProgress, ledger.ErrorCode(err), "the held key waits out its lease")
	ledgertest.VerifyChain(t, db)
}
