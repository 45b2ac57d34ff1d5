package storetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/verify"
)

// RunNotApplied runs the cases of SPEC §4.1: an outcome that applied
// nothing leaves the key reservable.
func RunNotApplied(t *testing.T, f Factory) {
	t.Run("CommitThenReserve", func(t *testing.T) { testNotAppliedReserve(t, f) })
	t.Run("InvalidOutcome", func(t *testing.T) { testNotAppliedInvalid(t, f) })
	t.Run("SameExecutionAttempt", func(t *testing.T) { testNotAppliedAttempt(t, f) })
	t.Run("FingerprintStays", func(t *testing.T) { testNotAppliedFingerprint(t, f) })
	t.Run("ResolveInterrupted", func(t *testing.T) { testNotAppliedResolve(t, f) })
	t.Run("AdminCorrection", func(t *testing.T) { testNotAppliedCorrection(t, f) })
	t.Run("WaiterReserves", func(t *testing.T) { testNotAppliedWait(t, f) })
	t.Run("KeyExpires", func(t *testing.T) { testNotAppliedExpires(t, f) })
	t.Run("RepeatedFailures", func(t *testing.T) { testNotAppliedRepeats(t, f) })
}

func notApplied(key, token, code string) ledger.CommitRequest {
	return ledger.CommitRequest{IdempotencyKey: key, Reservation: token, Outcome: chain.OutcomeNotApplied,
		Error: &ledger.FailureDetail{Code: code, Message: "nothing was sent", Retryable: true}}
}

func keyState(t *testing.T, n *ledger.Namespace, key string) ledger.State {
	t.Helper()
	v, err := n.GetKey(context.Background(), key)
	require.NoError(t, err)
	return v.State
}

func testNotAppliedReserve(t *testing.T, f Factory) {
	_, clock, n := openDefault(t, f)
	r1 := testkit.MustReserve(t, n, testkit.ReserveReq("send-mail-1", "exec-1")) // not idempotent
	c := testkit.MustCommit(t, n, notApplied("send-mail-1", r1.Reservation, "VALIDATION"))
	assert.Equal(t, chain.OutcomeNotApplied, c.Outcome)
	again := testkit.MustCommit(t, n, notApplied("send-mail-1", r1.Reservation, "VALIDATION"))
	assert.True(t, again.Replayed, "an identical not_applied commit appends nothing")
	got := receipt(t, n, c.Receipt.Seq)
	assert.False(t, got.Retryable, "retryable is ignored on not_applied")
	assert.Equal(t, "VALIDATION", got.ErrorCode)
	assert.Equal(t, ledger.StateNotApplied, keyState(t, n, "send-mail-1"))

	second := testkit.ReserveReq("send-mail-1", "exec-2")
	second.Idempotent = true // cannot change the key's flag
	r2 := testkit.MustReserve(t, n, second)
	require.Equal(t, ledger.StatusReserved, r2.Status, "a not_applied key is reservable by any execution")
	require.NotNil(t, r2.AfterNotApplied)
	assert.Equal(t, ledger.NotAppliedRef{Seq: c.Receipt.Seq, ErrorCode: "VALIDATION"}, *r2.AfterNotApplied)
	assert.False(t, r2.Takeover || r2.Retry || r2.Renewed != nil)
	rs := receipt(t, n, r2.Receipt.Seq)
	assert.Equal(t, c.Receipt.Seq, rs.RefSeq, "the reserve names the not_applied receipt")
	assert.False(t, rs.Idempotent, "idempotent is the key's first reserve's")
	assert.Equal(t, got.InputHash, rs.InputHash)
	assert.Equal(t, ledger.ECodeStaleReservation, commitCode(n, testkit.Succeed("send-mail-1", r1.Reservation)))
	testkit.MustCommit(t, n, testkit.Succeed("send-mail-1", r2.Reservation))
	assert.Equal(t, ledger.StateSucceeded, keyState(t, n, "send-mail-1"))
	noDrift(t, n, "send-mail-1")
	verifyClean(t, n, 4)

	rep := audit(t, n, clock.Now)
	require.Len(t, rep.Audit.NotAppliedReruns, 1)
	assert.Equal(t, verify.NotAppliedRerun{Key: "send-mail-1", Tool: "payments.refund",
		NotAppliedSeq: c.Receipt.Seq, ErrorCode: "VALIDATION", Seq: r2.Receipt.Seq, ExecutionID: "exec-2",
		RecordedAt: uint64(clock.Now().UnixMilli())}, rep.Audit.NotAppliedReruns[0])
}

func testNotAppliedInvalid(t *testing.T, f Factory) {
	ctx := context.Background()
	_, _, n := openDefault(t, f)
	r := testkit.MustReserve(t, n, testkit.ReserveReq("send-mail-2", "exec-1"))
	withRef := notApplied("send-mail-2", r.Reservation, "VALIDATION")
	withRef.ExternalRef = "msg-1"
	_, err := n.Commit(ctx, withRef)
	requireInvalid(t, err, "external_ref")
	noCode := notApplied("send-mail-2", r.Reservation, "")
	noCode.Error = nil
	_, err = n.Commit(ctx, noCode)
	requireInvalid(t, err, "error")
	assert.Equal(t, ledger.StateReserved, keyState(t, n, "send-mail-2"))
	verifyClean(t, n, 1)
}

// requireAfterNotApplied requires r to be a reserve after the not_applied
// outcome at seq.
func requireAfterNotApplied(t *testing.T, r *ledger.ReserveResult, seq uint64) {
	t.Helper()
	require.NotNil(t, r.AfterNotApplied)
	assert.Equal(t, seq, r.AfterNotApplied.Seq)
}

func requireInvalid(t *testing.T, err error, field string) {
	t.Helper()
	var e *ledger.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, ledger.ECodeInvalidRequest, e.Code)
	assert.Equal(t, field, e.Details["field"])
}

func testNotAppliedAttempt(t *testing.T, f Factory) {
	_, _, n := openDefault(t, f)
	r := testkit.MustReserve(t, n, testkit.ReserveReq("send-mail-3", "exec-1"))
	testkit.MustCommit(t, n, notApplied("send-mail-3", r.Reservation, "NOT_FOUND"))
	require.Equal(t, ledger.ECodeAttemptConflict, reserveCode(n, testkit.ReserveReq("send-mail-3", "exec-1")),
		"the same execution must raise its attempt")
	next := testkit.ReserveReq("send-mail-3", "exec-1")
	next.Attempt = i64(2)
	r2 := testkit.MustReserve(t, n, next)
	require.NotNil(t, r2.AfterNotApplied)
	assert.Equal(t, uint64(2), r2.Attempt)
	verifyClean(t, n, 3)
}

func testNotAppliedFingerprint(t *testing.T, f Factory) {
	_, _, n := openDefault(t, f)
	r := testkit.MustReserve(t, n, testkit.ReserveReq("send-mail-4", "exec-1"))
	testkit.MustCommit(t, n, notApplied("send-mail-4", r.Reservation, "REFUSED"))
	other := testkit.ReserveReq("send-mail-4", "exec-2")
	other.Input = json.RawMessage(`{"order":8}`)
	require.Equal(t, ledger.ECodeFingerprintMismatch, reserveCode(n, other), "the fingerprint stays the key's")
	verifyClean(t, n, 2)
}

func testNotAppliedResolve(t *testing.T, f Factory) {
	ctx := context.Background()
	_, clock, n := openDefault(t, f)
	testkit.MustReserve(t, n, leased("send-mail-5", "exec-1", 100))
	clock.Advance(time.Second)
	res, err := n.Resolve(ctx, ledger.ResolveRequest{IdempotencyKey: "send-mail-5", Outcome: chain.OutcomeNotApplied,
		Error: &ledger.FailureDetail{Code: "NOT_SENT"}, Note: "checked the outbox: nothing was sent", Actor: "ops"})
	require.NoError(t, err)
	assert.Equal(t, ledger.StateNotApplied, res.State)
	assert.Equal(t, ledger.StateNotApplied, keyState(t, n, "send-mail-5"))
	requireAfterNotApplied(t, testkit.MustReserve(t, n, testkit.ReserveReq("send-mail-5", "exec-2")), res.Receipt.Seq)
	noDrift(t, n, "send-mail-5")
	verifyClean(t, n, 3)
}

func testNotAppliedCorrection(t *testing.T, f Factory) {
	ctx := context.Background()
	_, _, n := openDefault(t, f)
	r := testkit.MustReserve(t, n, testkit.ReserveReq("send-mail-6", "exec-1"))
	failed := testkit.MustCommit(t, n, testkit.Fail("send-mail-6", r.Reservation, false))
	correct := ledger.ResolveRequest{IdempotencyKey: "send-mail-6", Outcome: chain.OutcomeNotApplied,
		Error: &ledger.FailureDetail{Code: "CARD_DECLINED"}, Note: "the bank confirms: no charge", Actor: "admin-1"}
	_, err := n.Resolve(ctx, correct)
	require.Equal(t, ledger.ECodeForbidden, code(err), "only an admin corrects a failure")
	succeeded := correct
	succeeded.Outcome, succeeded.Error, succeeded.MayCorrect = chain.OutcomeSucceeded, nil, true
	_, err = n.Resolve(ctx, succeeded)
	require.Equal(t, ledger.ECodeNotInterrupted, code(err), "a failure is corrected only to not_applied")

	correct.MayCorrect = true
	res, err := n.Resolve(ctx, correct)
	require.NoError(t, err)
	assert.Equal(t, ledger.StateNotApplied, res.State)
	got := receipt(t, n, res.Receipt.Seq)
	assert.Equal(t, chain.KindResolve, got.Kind)
	assert.Equal(t, failed.Receipt.Seq, got.RefSeq, "the correction names the failure")
	assert.Equal(t, "exec-1", got.ExecutionID)
	_, err = n.Resolve(ctx, correct)
	require.Equal(t, ledger.ECodeNotInterrupted, code(err), "a not_applied key is not corrected again")

	requireAfterNotApplied(t, testkit.MustReserve(t, n, testkit.ReserveReq("send-mail-6", "exec-2")), res.Receipt.Seq)
	noDrift(t, n, "send-mail-6")
	verifyClean(t, n, 4)
}

func testNotAppliedWait(t *testing.T, f Factory) {
	l, _, n := openDefault(t, f)
	r := testkit.MustReserve(t, n, testkit.ReserveReq("send-mail-7", "e1"))
	done := reserveWaiting(t, n, testkit.ReserveReq("send-mail-7", "e2"), 20_000)
	require.Eventually(t, func() bool { return l.Waiting() == 1 }, 5*time.Second, 5*time.Millisecond)
	c := testkit.MustCommit(t, n, notApplied("send-mail-7", r.Reservation, "REFUSED"))
	res := woken(t, done, 10*time.Second, "the not_applied commit")
	require.Equal(t, ledger.StatusReserved, res.Status, "the waiter is decided again: reserved")
	requireAfterNotApplied(t, res, c.Receipt.Seq)
}

func testNotAppliedExpires(t *testing.T, f Factory) {
	l, clock := open(t, f)
	n := ttlNS(t, l)
	r := testkit.MustReserve(t, n, testkit.ReserveReq("nightly-mail", "exec-1"))
	c := testkit.MustCommit(t, n, notApplied("nightly-mail", r.Reservation, "REFUSED"))
	v := keyView(t, n, "nightly-mail")
	assert.Equal(t, ledger.StateNotApplied, v.State)
	assert.Equal(t, uint64(clock.Now().Add(ttl).UnixMilli()), v.ExpiresAt, "a not_applied key is finalized: it expires")

	clock.Advance(ttl)
	other := testkit.ReserveReq("nightly-mail", "exec-2")
	other.Input = json.RawMessage(`{"order":8}`)
	nr := testkit.MustReserve(t, n, other)
	require.NotNil(t, nr.Renewed, "after expiry a reserve starts a new generation")
	assert.Nil(t, nr.AfterNotApplied)
	assert.Equal(t, c.Receipt.Seq, nr.Renewed.Seq)
	noDrift(t, n, "nightly-mail")
	verifyClean(t, n, 3)
}

// testNotAppliedRepeats: the driver's repeated-failures query counts a
// not_applied like a failure, and a rerun of the same key by another
// execution as a repeat, but not one by the same execution, nor after a
// not_applied whose code says nothing was attempted.
func testNotAppliedRepeats(t *testing.T, f Factory) {
	_, clock, n := openDefault(t, f)
	r := testkit.MustReserve(t, n, testkit.ReserveReq("send-mail-8", "exec-1"))
	c1 := testkit.MustCommit(t, n, notApplied("send-mail-8", r.Reservation, "REFUSED"))
	same := testkit.ReserveReq("send-mail-8", "exec-1")
	same.Attempt = i64(2)
	r = testkit.MustReserve(t, n, same)
	testkit.MustCommit(t, n, notApplied("send-mail-8", r.Reservation, "REFUSED"))
	rerun := testkit.MustReserve(t, n, testkit.ReserveReq("send-mail-8", "exec-2"))
	other := testkit.MustReserve(t, n, testkit.ReserveReq("send-mail-9", "exec-3"))
	asks := testkit.ReserveReq("send-mail-10", "exec-4")
	asks.Input = json.RawMessage(`{"order":8}`)
	r = testkit.MustReserve(t, n, asks)
	testkit.MustCommit(t, n, notApplied("send-mail-10", r.Reservation, ledger.CodeInputRequired))
	asks.ExecutionID = "exec-5"
	testkit.MustReserve(t, n, asks)
	verifyClean(t, n, 9)

	rep := audit(t, n, clock.Now)
	require.Len(t, rep.Audit.RepeatedFailures, 1)
	rf := rep.Audit.RepeatedFailures[0]
	assert.Equal(t, "REFUSED", rf.ErrorCode)
	assert.Equal(t, []string{"send-mail-8", "send-mail-9"}, rf.Keys, "each key once; every run in executions and seqs")
	assert.Equal(t, []string{"exec-1", "exec-2", "exec-3"}, rf.Executions)
	assert.Equal(t, []uint64{c1.Receipt.Seq, rerun.Receipt.Seq, other.Receipt.Seq}, rf.Seqs)
	assert.Len(t, rep.Audit.NotAppliedReruns, 3)
}
