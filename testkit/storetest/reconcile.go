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
)

// RunReconcile runs the cases of SPEC §15 on a driver: a reconcile ends
// an interrupted key as a resolve does (the key's record, its expiry),
// the original call's late commit leaves the record as it was, and a
// reconcile not_applied is no failure for the repeat guard or the audit.
func RunReconcile(t *testing.T, f Factory) {
	t.Run("SucceededThenLateCommit", func(t *testing.T) { testReconcileLate(t, f, ledger.PayloadsInline) })
	t.Run("SucceededThenLateCommitCommitted", func(t *testing.T) { testReconcileLate(t, f, ledger.PayloadsCommitted) })
	t.Run("NotAppliedExempt", func(t *testing.T) { testReconcileExempt(t, f) })
	t.Run("KeyExpires", func(t *testing.T) { testReconcileExpires(t, f) })
}

const reconcilePolicy = `{"rules":[{"tool":"payments.*","reconcile":{"allow":true,"settle_ms":1000},"repeat_failure":"refuse"}]}`

// interruptedKey sets the reconcile policy on n and leaves key interrupted
// (not idempotent, a 10 ms lease); it returns the reservation.
func interruptedKey(t *testing.T, n *ledger.Namespace, clock *testkit.Clock, key, exec string) *ledger.ReserveResult {
	t.Helper()
	_, err := n.SetPolicy(context.Background(), json.RawMessage(reconcilePolicy), "")
	require.NoError(t, err)
	req := testkit.ReserveReq(key, exec)
	req.LeaseMS = i64(10)
	r := testkit.MustReserve(t, n, req)
	clock.Advance(20 * time.Millisecond)
	require.Equal(t, ledger.StateInterrupted, keyState(t, n, key))
	return r
}

func reconcileReq(key, outcome string) ledger.ReconcileRequest {
	r := ledger.ReconcileRequest{IdempotencyKey: key, Outcome: outcome,
		Evidence: json.RawMessage(`{"lookup":"payments.find","answer":{"found":` + map[bool]string{true: "true", false: "false"}[outcome == chain.OutcomeSucceeded] + `}}`)}
	if outcome == chain.OutcomeSucceeded {
		r.ExternalRef, r.Result = "re_found", json.RawMessage(`{"amount":1200}`)
	} else {
		r.Error = &ledger.FailureDetail{Code: "NOT_FOUND"}
	}
	return r
}

func mustReconcile(t *testing.T, n *ledger.Namespace, r ledger.ReconcileRequest) *ledger.ReconcileResult {
	t.Helper()
	res, err := n.Reconcile(context.Background(), r)
	require.NoError(t, err)
	return res
}

// testReconcileLate runs in a namespace of payload mode mode (SPEC §14: in
// a committed one the late commit is compared by its values, not by the
// commitments, whose salts differ).
func testReconcileLate(t *testing.T, f Factory, mode ledger.PayloadMode) {
	l, clock := open(t, f)
	require.NoError(t, l.CreateNamespace(context.Background(), "late", ledger.NamespaceSettings{Payloads: mode}))
	n := ns(t, l, "late")
	r := interruptedKey(t, n, clock, "charge-1", "exec-1")
	rec := mustReconcile(t, n, reconcileReq("charge-1", chain.OutcomeSucceeded))
	assert.Equal(t, ledger.StateSucceeded, rec.State)
	got := receipt(t, n, rec.Receipt.Seq)
	assert.Equal(t, chain.KindReconcile, got.Kind)
	assert.Equal(t, r.Receipt.Seq, got.RefSeq)
	noDrift(t, n, "charge-1")

	replay := testkit.MustReserve(t, n, testkit.ReserveReq("charge-1", "exec-2"))
	assert.Equal(t, ledger.StatusReplayed, replay.Status)
	assert.Equal(t, "re_found", replay.ExternalRef)
	assert.Equal(t, rec.Receipt.Seq, replay.Original.Seq)

	late := testkit.MustCommit(t, n, testkit.Succeed("charge-1", r.Reservation))
	require.NotNil(t, late.ReconciledEarlier)
	assert.Equal(t, rec.Receipt.Seq, late.ReconciledEarlier.Seq)
	assert.False(t, late.Replayed)
	assert.Equal(t, ledger.StateSucceeded, keyState(t, n, "charge-1"))
	noDrift(t, n, "charge-1")
	again := testkit.MustCommit(t, n, testkit.Succeed("charge-1", r.Reservation))
	assert.True(t, again.Replayed, "the same late commit appends nothing")
	assert.Equal(t, late.Receipt, again.Receipt)
	assert.Equal(t, ledger.ECodeAlreadyFinalized, commitCode(n, testkit.Fail("charge-1", r.Reservation, false)))
	replay = testkit.MustReserve(t, n, testkit.ReserveReq("charge-1", "exec-3"))
	assert.Equal(t, rec.Receipt.Seq, replay.Original.Seq, "replays still serve the reconciled outcome")
	verifyClean(t, n, 6)

	rep := audit(t, n, clock.Now)
	require.Len(t, rep.Audit.Reconciliations, 1)
	assert.Equal(t, "payments.find", rep.Audit.Reconciliations[0].Lookup)
	require.Len(t, rep.Audit.ReconcileContradicted, 1, "re_1 is not the re_found reconciled")
	assert.Equal(t, late.Receipt.Seq, rep.Audit.ReconcileContradicted[0].CommitSeq)
}

func testReconcileExempt(t *testing.T, f Factory) {
	_, clock, n := openDefault(t, f)
	interruptedKey(t, n, clock, "charge-2", "exec-1")
	_, err := n.Reconcile(context.Background(), reconcileReq("charge-2", chain.OutcomeNotApplied))
	assert.Equal(t, ledger.ECodeReconcileTooEarly, code(err))
	clock.Advance(time.Second)
	mustReconcile(t, n, reconcileReq("charge-2", chain.OutcomeNotApplied))
	// The same call under another key is no unchanged retry of a failure.
	other := testkit.MustReserve(t, n, testkit.ReserveReq("charge-3", "exec-2"))
	assert.Equal(t, ledger.StatusReserved, other.Status)
	rerun := testkit.MustReserve(t, n, testkit.ReserveReq("charge-2", "exec-3"))
	require.NotNil(t, rerun.AfterNotApplied)
	noDrift(t, n, "charge-2")
	rep := audit(t, n, clock.Now)
	assert.True(t, rep.OK, "%+v", rep.Violations)
	assert.Empty(t, rep.Audit.RepeatedFailures, "a reconcile not_applied is no failure")
}

func testReconcileExpires(t *testing.T, f Factory) {
	l, clock := open(t, f)
	n := ttlNS(t, l)
	r := interruptedKey(t, n, clock, "charge-4", "exec-1")
	rec := mustReconcile(t, n, reconcileReq("charge-4", chain.OutcomeSucceeded))
	v := keyView(t, n, "charge-4")
	assert.Equal(t, uint64(clock.Now().Add(ttl).UnixMilli()), v.ExpiresAt, "a reconciled key expires")
	clock.Advance(time.Minute)
	testkit.MustCommit(t, n, testkit.Succeed("charge-4", r.Reservation)) // the original call, late
	clock.Advance(ttl - time.Minute)
	nr := testkit.MustReserve(t, n, testkit.ReserveReq("charge-4", "exec-2"))
	require.NotNil(t, nr.Renewed, "the key's lifetime runs from the reconcile, not the late commit")
	assert.Equal(t, rec.Receipt.Seq, nr.Renewed.Seq)
	noDrift(t, n, "charge-4")
	verifyClean(t, n, 5)
}
