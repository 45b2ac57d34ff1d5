package storetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/internal/testkit"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/verify"
)

// RunApprovals runs the cases of SPEC §13 that depend on the driver's
// GateTx: the policy in force across batches and restarts of the domain,
// a key's history with this batch's appends, recent outcomes, asked
// inputs off the chain, and the wake-up of a reserve waiting for an
// answer.
func RunApprovals(t *testing.T, f Factory) {
	t.Run("AskApproveConsume", func(t *testing.T) { testApprovalConsume(t, f) })
	t.Run("CoveredRetryAndReinvocation", func(t *testing.T) { testApprovalCovered(t, f) })
	t.Run("DenyOncePerPolicy", func(t *testing.T) { testApprovalDeny(t, f) })
	t.Run("RepeatGuard", func(t *testing.T) { testApprovalRepeat(t, f) })
	t.Run("InputKeptAndDeleted", func(t *testing.T) { testApprovalInput(t, f) })
	t.Run("WaiterConsumes", func(t *testing.T) { testApprovalWait(t, f) })
	t.Run("PolicyPerNamespace", func(t *testing.T) { testApprovalNamespaces(t, f) })
	t.Run("RepeatedFailuresAudit", func(t *testing.T) { testApprovalRepeatAudit(t, f) })
	t.Run("OpenKeys", func(t *testing.T) { testApprovalOpenKeys(t, f) })
	t.Run("Fingerprints", func(t *testing.T) { testApprovalFingerprints(t, f) })
	t.Run("Owners", func(t *testing.T) { testApprovalOwners(t, f) })
	t.Run("PolicyText", func(t *testing.T) { testApprovalPolicyText(t, f) })
	t.Run("AskOutlivesPolicy", func(t *testing.T) { testApprovalAskOutlivesPolicy(t, f) })
}

const gatePolicy = `{"rules":[{"tool":"payments.*","approval":"required","expires_in_ms":60000},
	{"tool":"shell.*","deny":true},{"tool":"mail.*","repeat_failure":"refuse"}]}`

func setPolicy(t *testing.T, n *ledger.Namespace, raw string) {
	t.Helper()
	_, err := n.SetPolicy(context.Background(), json.RawMessage(raw), "ops")
	require.NoError(t, err)
}

func gateReq(key, exec, tool string) ledger.ReserveRequest {
	r := testkit.ReserveReq(key, exec)
	r.Tool, r.Effect, r.Idempotent, r.Actor = tool, chain.EffectExternal, true, "agent"
	return r
}

func answer(t *testing.T, n *ledger.Namespace, seq uint64, decision string) *ledger.ApprovalView {
	t.Helper()
	v, _, err := n.Answer(context.Background(), ledger.AnswerRequest{Seq: seq, Decision: decision, Actor: "alice",
		Role: ledger.RoleApprover, Authenticated: true})
	require.NoError(t, err)
	return v
}

func testApprovalConsume(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	n := ns(t, l, ledger.DefaultNamespace)
	setPolicy(t, n, gatePolicy)
	r := mustReserve(t, n, gateReq("charge-0001", "exec-1", "payments.charge"))
	require.Equal(t, ledger.StatusApprovalRequired, r.Status)
	again := mustReserve(t, n, gateReq("charge-0001", "exec-1", "payments.charge"))
	assert.Equal(t, r.Ask.Seq, again.Ask.Seq, "one pending ask per key")
	kv, err := n.Key(ctx, "charge-0001", false)
	require.NoError(t, err)
	assert.Equal(t, ledger.StateAwaitingApproval, kv.State)
	v := answer(t, n, r.Ask.Seq, ledger.DecisionApprove)
	assert.Equal(t, ledger.ApprovalApproved, v.State)
	c := mustReserve(t, n, gateReq("charge-0001", "exec-1", "payments.charge"))
	require.Equal(t, ledger.StatusReserved, c.Status)
	require.NotNil(t, c.Approval)
	assert.Equal(t, v.Answer.Seq, c.Approval.Seq)
	got, err := n.GetReceipt(ctx, c.Receipt.Seq)
	require.NoError(t, err)
	assert.Equal(t, v.Answer.Seq, got.RefSeq, "the consuming reserve names the approval")
	_, err = n.Reserve(ctx, gateReq("charge-0001", "exec-2", "payments.charge"))
	assert.Equal(t, ledger.ECodeInProgress, code(err), "decided by §4 first")
	mustCommit(t, n, testkit.Succeed("charge-0001", c.Reservation))
	list, _, err := n.Approvals(ctx, ledger.ApprovalConsumed, 0, 10)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, c.Receipt.Seq, list[0].Consumer.Seq)
	verifyHead(t, n)
}

func testApprovalCovered(t *testing.T, f Factory) {
	l, _ := open(t, f)
	n := ns(t, l, ledger.DefaultNamespace)
	setPolicy(t, n, gatePolicy)
	r := mustReserve(t, n, gateReq("charge-0002", "exec-1", "payments.charge"))
	answer(t, n, r.Ask.Seq, ledger.DecisionApprove)
	c := mustReserve(t, n, gateReq("charge-0002", "exec-1", "payments.charge"))
	mustCommit(t, n, testkit.Fail("charge-0002", c.Reservation, true))
	retry := gateReq("charge-0002", "exec-1", "payments.charge")
	retry.Attempt = i64(2)
	rr := mustReserve(t, n, retry)
	require.Equal(t, ledger.StatusReserved, rr.Status, "a runtime retry of the consuming execution needs no approval")
	assert.True(t, rr.Retry)
	mustCommit(t, n, testkit.Fail("charge-0002", rr.Reservation, true))
	other := mustReserve(t, n, gateReq("charge-0002", "exec-2", "payments.charge"))
	require.Equal(t, ledger.StatusApprovalRequired, other.Status, "another execution asks again")
	answer(t, n, other.Ask.Seq, ledger.DecisionApprove)
	oc := mustReserve(t, n, gateReq("charge-0002", "exec-2", "payments.charge"))
	require.Equal(t, ledger.StatusReserved, oc.Status, "the ask's attempt does not count for the attempt rule")
	mustCommit(t, n, testkit.Succeed("charge-0002", oc.Reservation))
	verifyHead(t, n)
}

func testApprovalDeny(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	n := ns(t, l, ledger.DefaultNamespace)
	setPolicy(t, n, gatePolicy)
	_, err := n.Reserve(ctx, gateReq("rm-key-0001", "exec-1", "shell.rm"))
	assert.Equal(t, ledger.ECodeDeniedByPolicy, code(err))
	h1, err := n.Head(ctx)
	require.NoError(t, err)
	_, err = n.Reserve(ctx, gateReq("rm-key-0001", "exec-2", "shell.rm"))
	assert.Equal(t, ledger.ECodeDeniedByPolicy, code(err))
	h2, err := n.Head(ctx)
	require.NoError(t, err)
	assert.Equal(t, h1.Seq, h2.Seq, "one deny receipt per key, fingerprint and policy")
	setPolicy(t, n, gatePolicy+" ") // the same policy: nothing appended
	h3, err := n.Head(ctx)
	require.NoError(t, err)
	assert.Equal(t, h2.Seq, h3.Seq)
	setPolicy(t, n, `{"rules":[{"tool":"shell.*","deny":true}],"self_approval":"allow"}`)
	_, err = n.Reserve(ctx, gateReq("rm-key-0001", "exec-3", "shell.rm"))
	assert.Equal(t, ledger.ECodeDeniedByPolicy, code(err))
	h4, err := n.Head(ctx)
	require.NoError(t, err)
	assert.Equal(t, h3.Seq+2, h4.Seq, "a new policy, then a new deny")
	verifyClean(t, n, h4.Seq)
}

func testApprovalRepeat(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	n := ns(t, l, ledger.DefaultNamespace)
	setPolicy(t, n, gatePolicy)
	r := mustReserve(t, n, gateReq("mail-0001", "exec-1", "mail.send"))
	mustCommit(t, n, testkit.Fail("mail-0001", r.Reservation, true))
	_, err := n.Reserve(ctx, gateReq("mail-0002", "exec-2", "mail.send"))
	assert.Equal(t, ledger.ECodeUnchangedRetry, code(err), "the same call by another execution, unchanged")
	same := gateReq("mail-0003", "exec-1", "mail.send")
	assert.Equal(t, ledger.StatusReserved, mustReserve(t, n, same).Status, "the execution that failed may repeat")
	changed := gateReq("mail-0004", "exec-3", "mail.send")
	changed.Changed = &ledger.Changed{Strategy: "another relay"}
	assert.Equal(t, ledger.StatusReserved, mustReserve(t, n, changed).Status, "a changed strategy passes")
}

func testApprovalInput(t *testing.T, f Factory) {
	ctx := context.Background()
	l, clock := open(t, f)
	n := ns(t, l, ledger.DefaultNamespace)
	setPolicy(t, n, gatePolicy)
	noInput := gateReq("charge-0003", "exec-1", "payments.charge")
	noInput.Input, noInput.InputHash = nil, "sha256:00"
	_, err := n.Reserve(ctx, noInput)
	assert.Equal(t, ledger.ECodeInvalidRequest, code(err), "an ask needs the input")
	r := mustReserve(t, n, gateReq("charge-0003", "exec-1", "payments.charge"))
	v, err := n.Approval(ctx, r.Ask.Seq, true)
	require.NoError(t, err)
	assert.JSONEq(t, `{"order":7}`, v.Input)
	answer(t, n, r.Ask.Seq, ledger.DecisionReject)
	clock.Advance(ledger.DefaultApprovalInputRetention + time.Minute)
	v, err = n.Approval(ctx, r.Ask.Seq, true)
	require.NoError(t, err)
	assert.Empty(t, v.Input, "deleted after the answer plus the retention")
	_, err = n.Reserve(ctx, gateReq("charge-0003", "exec-1", "payments.charge"))
	assert.Equal(t, ledger.ECodeApprovalRejected, code(err))
}

func testApprovalWait(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	n := ns(t, l, ledger.DefaultNamespace)
	setPolicy(t, n, gatePolicy)
	r := mustReserve(t, n, gateReq("charge-0004", "exec-1", "payments.charge"))
	done := make(chan *ledger.ReserveResult, 1)
	go func() {
		w := gateReq("charge-0004", "exec-1", "payments.charge")
		w.WaitMS = i64(10_000)
		res, err := n.Reserve(ctx, w)
		assert.NoError(t, err)
		done <- res
	}()
	time.Sleep(50 * time.Millisecond)
	answer(t, n, r.Ask.Seq, ledger.DecisionApprove)
	select {
	case res := <-done:
		require.NotNil(t, res)
		assert.Equal(t, ledger.StatusReserved, res.Status, "the answer wakes the waiting reserve")
	case <-time.After(8 * time.Second):
		t.Fatal("the waiting reserve was not woken by the answer")
	}
}

func testApprovalNamespaces(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	require.NoError(t, l.CreateNamespace(ctx, "gated", 0))
	g := ns(t, l, "gated")
	setPolicy(t, g, gatePolicy)
	d := ns(t, l, ledger.DefaultNamespace)
	assert.Equal(t, ledger.StatusReserved, mustReserve(t, d, gateReq("charge-0005", "exec-1", "payments.charge")).Status,
		"another namespace's policy does not apply")
	assert.Equal(t, ledger.StatusApprovalRequired, mustReserve(t, g, gateReq("charge-0005", "exec-1", "payments.charge")).Status)
	p, seq, err := g.Policy(ctx)
	require.NoError(t, err)
	assert.NotZero(t, seq)
	assert.Len(t, p.Rules, 3)
	_, seq, err = d.Policy(ctx)
	require.NoError(t, err)
	assert.Zero(t, seq)
}

// testApprovalRepeatAudit: a key whose first reserve consumed an approval
// is a first reserve for the audit's repeated failures (its approval's
// ask named nothing), as for a key reserved without one.
func testApprovalRepeatAudit(t *testing.T, f Factory) {
	ctx := context.Background()
	l, clock := open(t, f)
	n := ns(t, l, ledger.DefaultNamespace)
	setPolicy(t, n, `{"rules":[{"tool":"payments.*","approval":"required"}]}`)
	run := func(key, exec string) *ledger.ReserveResult {
		a := mustReserve(t, n, gateReq(key, exec, "payments.charge"))
		answer(t, n, a.Ask.Seq, ledger.DecisionApprove)
		return mustReserve(t, n, gateReq(key, exec, "payments.charge"))
	}
	first := run("charge-0010", "exec-1")
	c := mustCommit(t, n, testkit.Fail("charge-0010", first.Reservation, false))
	second := run("charge-0011", "exec-2")
	verifyHead(t, n)
	rep, err := verify.New(auditDB(t, n), verify.Opts{Now: clock.Now}).Check(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Audit.RepeatedFailures, 1)
	rf := rep.Audit.RepeatedFailures[0]
	assert.Equal(t, []string{"charge-0010", "charge-0011"}, rf.Keys)
	assert.Equal(t, []uint64{c.Receipt.Seq, second.Receipt.Seq}, rf.Seqs)
}

// testApprovalOpenKeys: a takeover held for approval leaves the
// interrupted key open (ledger_keys_waiting) until a reserve or an outcome
// moves it: the gate's receipts end no reservation.
func testApprovalOpenKeys(t *testing.T, f Factory) {
	l, clock := open(t, f)
	n := ns(t, l, ledger.DefaultNamespace)
	first := gateReq("charge-0020", "exec-1", "payments.charge")
	first.LeaseMS = i64(1000)
	mustReserve(t, n, first) // before the policy: reserved at once
	setPolicy(t, n, gatePolicy)
	clock.Advance(1500 * time.Millisecond)
	require.Equal(t, map[string]int{"default/interrupted/idempotent": 1}, OpenKeys(t, l.Store()))
	a := mustReserve(t, n, gateReq("charge-0020", "exec-2", "payments.charge"))
	require.Equal(t, ledger.StatusApprovalRequired, a.Status, "a takeover by another execution asks")
	require.Equal(t, map[string]int{"default/interrupted/idempotent": 1}, OpenKeys(t, l.Store()),
		"the ask leaves the interrupted reservation open")
	answer(t, n, a.Ask.Seq, ledger.DecisionApprove)
	require.Equal(t, map[string]int{"default/interrupted/idempotent": 1}, OpenKeys(t, l.Store()), "so does the answer")
	tk := mustReserve(t, n, gateReq("charge-0020", "exec-2", "payments.charge"))
	require.True(t, tk.Takeover)
	require.Equal(t, map[string]int{"default/reserved/idempotent": 1}, OpenKeys(t, l.Store()))
}

// testApprovalFingerprints: the first ask fixes a new key's fingerprint
// and idempotent, pending, expired or approved (SPEC §2.1): a consuming
// reserve without input records the asked input's hash, an ask for an
// existing key carries the key's values, a later request with another
// input is a fingerprint mismatch; the chain verifies clean.
func testApprovalFingerprints(t *testing.T, f Factory) {
	ctx := context.Background()
	l, clock := open(t, f)
	n := ns(t, l, ledger.DefaultNamespace)
	setPolicy(t, n, gatePolicy)
	a := mustReserve(t, n, gateReq("charge-0030", "exec-1", "payments.charge"))
	answer(t, n, a.Ask.Seq, ledger.DecisionApprove)
	bare := gateReq("charge-0030", "exec-1", "payments.charge")
	bare.Input, bare.Idempotent = nil, false
	c := mustReserve(t, n, bare)
	require.Equal(t, ledger.StatusReserved, c.Status)
	got, err := n.GetReceipt(ctx, c.Receipt.Seq)
	require.NoError(t, err)
	ask, err := n.GetReceipt(ctx, a.Ask.Seq)
	require.NoError(t, err)
	assert.Equal(t, ask.InputHash, got.InputHash, "the reserve carries the asked input's hash")
	assert.True(t, got.Idempotent, "and the ask's idempotent")
	mustCommit(t, n, testkit.Succeed("charge-0030", c.Reservation))
	assert.Equal(t, ledger.StatusReplayed, mustReserve(t, n, gateReq("charge-0030", "exec-2", "payments.charge")).Status)

	// An expired ask still fixes the fingerprint.
	e := mustReserve(t, n, gateReq("charge-0031", "exec-1", "payments.charge"))
	require.Equal(t, ledger.StatusApprovalRequired, e.Status)
	clock.Advance(61 * time.Second)
	other := gateReq("charge-0031", "exec-1", "payments.charge")
	other.Input = json.RawMessage(`{"order":99}`)
	_, err = n.Reserve(ctx, other)
	assert.Equal(t, ledger.ECodeFingerprintMismatch, code(err))

	// A takeover asked by another execution carries the key's idempotent.
	first := gateReq("charge-0032", "exec-1", "payments.charge")
	first.LeaseMS = i64(1000)
	fa := mustReserve(t, n, first)
	answer(t, n, fa.Ask.Seq, ledger.DecisionApprove)
	mustReserve(t, n, first)
	clock.Advance(2 * time.Second)
	take := gateReq("charge-0032", "exec-2", "payments.charge")
	take.Idempotent = false
	ta := mustReserve(t, n, take)
	require.Equal(t, ledger.StatusApprovalRequired, ta.Status)
	tr, err := n.GetReceipt(ctx, ta.Ask.Seq)
	require.NoError(t, err)
	assert.True(t, tr.Idempotent, "the ask carries the key's idempotent")
	verifyHead(t, n)
}

// testApprovalOwners: an approval is its asker's. Another principal
// meanwhile gets the same ask, not a new one, and cannot consume it;
// nor can it run the consumer's execution as a covered runtime retry.
func testApprovalOwners(t *testing.T, f Factory) {
	l, _ := open(t, f)
	n := ns(t, l, ledger.DefaultNamespace)
	setPolicy(t, n, gatePolicy)
	a := mustReserve(t, n, gateReq("charge-0040", "exec-1", "payments.charge"))
	answer(t, n, a.Ask.Seq, ledger.DecisionApprove)
	intruder := gateReq("charge-0040", "exec-9", "payments.charge")
	intruder.Actor = "mallory"
	b := mustReserve(t, n, intruder)
	require.Equal(t, ledger.StatusApprovalRequired, b.Status)
	assert.Equal(t, a.Ask.Seq, b.Ask.Seq, "the approved ask stays the key's one ask")
	c := mustReserve(t, n, gateReq("charge-0040", "exec-1", "payments.charge"))
	require.Equal(t, ledger.StatusReserved, c.Status, "its asker consumes it")
	mustCommit(t, n, testkit.Fail("charge-0040", c.Reservation, true))
	spoof := gateReq("charge-0040", "exec-1", "payments.charge")
	spoof.Actor, spoof.Attempt = "mallory", i64(2)
	s := mustReserve(t, n, spoof)
	assert.Equal(t, ledger.StatusApprovalRequired, s.Status, "another principal reusing the execution id asks")
	verifyHead(t, n)
}

// testApprovalPolicyText: the policy served is the policy recorded: an
// empty approvers list sets nothing, so the next rule's approvers apply,
// before and after the policy is read back from the chain.
func testApprovalPolicyText(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	n := ns(t, l, ledger.DefaultNamespace)
	setPolicy(t, n, `{"rules":[{"tool":"pay.*","approval":"required","approvers":[]},{"tool":"*","approvers":["carol"]}]}`)
	p, _, err := n.Policy(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"carol"}, p.GateFor("pay.x", chain.EffectExternal).Approvers)
	a := mustReserve(t, n, gateReq("pay-key-0050", "exec-1", "pay.x"))
	_, _, err = n.Answer(ctx, ledger.AnswerRequest{Seq: a.Ask.Seq, Decision: ledger.DecisionApprove, Actor: "alice",
		Role: ledger.RoleApprover, Authenticated: true})
	assert.Equal(t, ledger.ECodeForbidden, code(err), "alice is not carol")
	// Denies: one per key, fingerprint and policy, whatever the order.
	setPolicy(t, n, `{"rules":[{"tool":"shell.*","deny":true}]}`)
	h0, err := n.Head(ctx)
	require.NoError(t, err)
	for _, in := range []string{`{"p":1}`, `{"p":1}`, `{"p":2}`, `{"p":1}`, `{"p":2}`} {
		r := gateReq("rm-key-0050", "exec-1", "shell.rm")
		r.Input = json.RawMessage(in)
		_, err := n.Reserve(ctx, r)
		assert.Equal(t, ledger.ECodeDeniedByPolicy, code(err))
	}
	h1, err := n.Head(ctx)
	require.NoError(t, err)
	assert.Equal(t, h0.Seq+2, h1.Seq, "two fingerprints, two denies")
}

// testApprovalAskOutlivesPolicy: a key asked under a policy keeps the
// fingerprint its ask fixed after the policy stops gating its tool.
func testApprovalAskOutlivesPolicy(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	n := ns(t, l, ledger.DefaultNamespace)
	setPolicy(t, n, gatePolicy)
	require.Equal(t, ledger.StatusApprovalRequired, mustReserve(t, n, gateReq("charge-0060", "exec-1", "payments.charge")).Status)
	setPolicy(t, n, `{"rules":[{"tool":"mail.*","repeat_failure":"refuse"}]}`)
	other := gateReq("charge-0060", "exec-1", "payments.charge")
	other.Input = json.RawMessage(`{"order":61}`)
	_, err := n.Reserve(ctx, other)
	assert.Equal(t, ledger.ECodeFingerprintMismatch, code(err), "the ask fixed the fingerprint")
	assert.Equal(t, ledger.StatusReserved, mustReserve(t, n, gateReq("charge-0060", "exec-1", "payments.charge")).Status,
		"no rule gates it now")
	assert.Equal(t, ledger.StatusReserved, mustReserve(t, n, gateReq("charge-0061", "exec-1", "payments.charge")).Status)
}
