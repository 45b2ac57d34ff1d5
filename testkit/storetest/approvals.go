package storetest

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
)

// RunApprovals runs the cases of SPEC §13 that depend on the driver's
// transaction: the policy in force across batches and restarts of the domain,
// a key's history with this batch's appends, recent outcomes, asked
// inputs off the chain, and the wake-up of a reserve waiting for an
// answer.
func RunApprovals(t *testing.T, f Factory) {
	t.Run("AskApproveConsume", func(t *testing.T) { testApprovalConsume(t, f) })
	t.Run("CoveredRetryAndReinvocation", func(t *testing.T) { testApprovalCovered(t, f) })
	t.Run("DenyOncePerPolicy", func(t *testing.T) { testApprovalDeny(t, f) })
	t.Run("RepeatGuard", func(t *testing.T) { testApprovalRepeat(t, f) })
	t.Run("InputKeptAndDeleted", func(t *testing.T) { testApprovalInput(t, f) })
	t.Run("InputErasedWithTheKey", func(t *testing.T) { testApprovalInputErased(t, f) })
	t.Run("WaiterConsumes", func(t *testing.T) { testApprovalWait(t, f) })
	t.Run("PolicyPerNamespace", func(t *testing.T) { testApprovalNamespaces(t, f) })
	t.Run("RepeatedFailuresAudit", func(t *testing.T) { testApprovalRepeatAudit(t, f) })
	t.Run("OpenKeys", func(t *testing.T) { testApprovalOpenKeys(t, f) })
	t.Run("Fingerprints", func(t *testing.T) { testApprovalFingerprints(t, f) })
	t.Run("Owners", func(t *testing.T) { testApprovalOwners(t, f) })
	t.Run("PolicyText", func(t *testing.T) { testApprovalPolicyText(t, f) })
	t.Run("AskOutlivesPolicy", func(t *testing.T) { testApprovalAskOutlivesPolicy(t, f) })
	t.Run("KeyStates", func(t *testing.T) { testApprovalKeyStates(t, f) })
}

// testApprovalKeyStates: a key's view follows its ask (issue 44): pending
// is awaiting_approval, approved and not consumed is approved, an ask of
// a key that never ran that ended unused is approval_expired, and the
// next reserve asks again.
func testApprovalKeyStates(t *testing.T, f Factory) {
	clock, n := openGated(t, f)
	r := testkit.MustReserve(t, n, charge("charge-0009", "exec-1"))
	assert.Equal(t, ledger.StateAwaitingApproval, keyView(t, n, "charge-0009").State)
	answer(t, n, r.Ask.Seq, ledger.DecisionApprove)
	assert.Equal(t, ledger.StateApproved, keyView(t, n, "charge-0009").State)
	clock.Advance(61 * time.Second)
	assert.Equal(t, ledger.StateApprovalExpired, keyView(t, n, "charge-0009").State)
	again := testkit.MustReserve(t, n, charge("charge-0009", "exec-1"))
	require.Equal(t, ledger.StatusApprovalRequired, again.Status, "an unused approval past the expiry asks again")
	assert.Equal(t, ledger.StateAwaitingApproval, keyView(t, n, "charge-0009").State)
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

// charge is gateReq for the tool payments.charge, which gatePolicy
// gates behind an approval.
func charge(key, exec string) ledger.ReserveRequest { return gateReq(key, exec, "payments.charge") }

// openGated is openDefault with gatePolicy set on the default namespace.
func openGated(t *testing.T, f Factory) (*testkit.Clock, *ledger.Namespace) {
	t.Helper()
	_, clock, n := openDefault(t, f)
	setPolicy(t, n, gatePolicy)
	return clock, n
}

// askApproved reserves r, which a policy gates, and approves its ask; it
// returns the asking reserve's result.
func askApproved(t *testing.T, n *ledger.Namespace, r ledger.ReserveRequest) *ledger.ReserveResult {
	t.Helper()
	a := testkit.MustReserve(t, n, r)
	answer(t, n, a.Ask.Seq, ledger.DecisionApprove)
	return a
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
	_, n := openGated(t, f)
	r := testkit.MustReserve(t, n, charge("charge-0001", "exec-1"))
	require.Equal(t, ledger.StatusApprovalRequired, r.Status)
	again := testkit.MustReserve(t, n, charge("charge-0001", "exec-1"))
	assert.Equal(t, r.Ask.Seq, again.Ask.Seq, "one pending ask per key")
	kv := keyView(t, n, "charge-0001")
	assert.Equal(t, ledger.StateAwaitingApproval, kv.State)
	v := answer(t, n, r.Ask.Seq, ledger.DecisionApprove)
	assert.Equal(t, ledger.ApprovalApproved, v.State)
	c := testkit.MustReserve(t, n, charge("charge-0001", "exec-1"))
	require.Equal(t, ledger.StatusReserved, c.Status)
	require.NotNil(t, c.Approval)
	assert.Equal(t, v.Answer.Seq, c.Approval.Seq)
	got := receipt(t, n, c.Receipt.Seq)
	assert.Equal(t, v.Answer.Seq, got.RefSeq, "the consuming reserve names the approval")
	assert.Equal(t, ledger.ECodeInProgress, reserveCode(n, charge("charge-0001", "exec-2")), "decided by §4 first")
	testkit.MustCommit(t, n, testkit.Succeed("charge-0001", c.Reservation))
	list, _, err := n.Approvals(ctx, ledger.ApprovalConsumed, 0, 10)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, c.Receipt.Seq, list[0].Consumer.Seq)
	verifyHead(t, n)
}

func testApprovalCovered(t *testing.T, f Factory) {
	_, n := openGated(t, f)
	askApproved(t, n, charge("charge-0002", "exec-1"))
	c := testkit.MustReserve(t, n, charge("charge-0002", "exec-1"))
	testkit.MustCommit(t, n, testkit.Fail("charge-0002", c.Reservation, true))
	retry := charge("charge-0002", "exec-1")
	retry.Attempt = i64(2)
	rr := testkit.MustReserve(t, n, retry)
	require.Equal(t, ledger.StatusReserved, rr.Status, "a runtime retry of the consuming execution needs no approval")
	assert.True(t, rr.Retry)
	testkit.MustCommit(t, n, testkit.Fail("charge-0002", rr.Reservation, true))
	other := testkit.MustReserve(t, n, charge("charge-0002", "exec-2"))
	require.Equal(t, ledger.StatusApprovalRequired, other.Status, "another execution asks again")
	answer(t, n, other.Ask.Seq, ledger.DecisionApprove)
	oc := testkit.MustReserve(t, n, charge("charge-0002", "exec-2"))
	require.Equal(t, ledger.StatusReserved, oc.Status, "the ask's attempt does not count for the attempt rule")
	testkit.MustCommit(t, n, testkit.Succeed("charge-0002", oc.Reservation))
	verifyHead(t, n)
}

func testApprovalDeny(t *testing.T, f Factory) {
	_, n := openGated(t, f)
	assert.Equal(t, ledger.ECodeDeniedByPolicy, reserveCode(n, gateReq("rm-key-0001", "exec-1", "shell.rm")))
	h1 := headSeq(t, n)
	assert.Equal(t, ledger.ECodeDeniedByPolicy, reserveCode(n, gateReq("rm-key-0001", "exec-2", "shell.rm")))
	h2 := headSeq(t, n)
	assert.Equal(t, h1, h2, "one deny receipt per key, fingerprint and policy")
	setPolicy(t, n, gatePolicy+" ") // the same policy: nothing appended
	h3 := headSeq(t, n)
	assert.Equal(t, h2, h3)
	setPolicy(t, n, `{"rules":[{"tool":"shell.*","deny":true}],"self_approval":"allow"}`)
	assert.Equal(t, ledger.ECodeDeniedByPolicy, reserveCode(n, gateReq("rm-key-0001", "exec-3", "shell.rm")))
	h4 := headSeq(t, n)
	assert.Equal(t, h3+2, h4, "a new policy, then a new deny")
	verifyClean(t, n, h4)
}

func testApprovalRepeat(t *testing.T, f Factory) {
	_, n := openGated(t, f)
	r := testkit.MustReserve(t, n, gateReq("mail-0001", "exec-1", "mail.send"))
	testkit.MustCommit(t, n, testkit.Fail("mail-0001", r.Reservation, true))
	assert.Equal(t, ledger.ECodeUnchangedRetry, reserveCode(n, gateReq("mail-0002", "exec-2", "mail.send")),
		"the same call by another execution, unchanged")
	same := gateReq("mail-0003", "exec-1", "mail.send")
	assert.Equal(t, ledger.StatusReserved, testkit.MustReserve(t, n, same).Status, "the execution that failed may repeat")
	changed := gateReq("mail-0004", "exec-3", "mail.send")
	changed.Changed = &ledger.Changed{Strategy: "another relay"}
	assert.Equal(t, ledger.StatusReserved, testkit.MustReserve(t, n, changed).Status, "a changed strategy passes")
}

func testApprovalInput(t *testing.T, f Factory) {
	ctx := context.Background()
	clock, n := openGated(t, f)
	noInput := charge("charge-0003", "exec-1")
	noInput.Input, noInput.InputHash = nil, "sha256:"+strings.Repeat("0", 64)
	assert.Equal(t, ledger.ECodeInvalidRequest, reserveCode(n, noInput), "an ask needs the input")
	r := testkit.MustReserve(t, n, charge("charge-0003", "exec-1"))
	v, err := n.Approval(ctx, r.Ask.Seq, true)
	require.NoError(t, err)
	assert.JSONEq(t, `{"order":7}`, v.Input)
	answer(t, n, r.Ask.Seq, ledger.DecisionReject)
	clock.Advance(ledger.DefaultApprovalInputRetention + time.Minute)
	v, err = n.Approval(ctx, r.Ask.Seq, true)
	require.NoError(t, err)
	assert.Empty(t, v.Input, "deleted after the answer plus the retention")
	assert.Equal(t, ledger.ECodeApprovalRejected, reserveCode(n, charge("charge-0003", "exec-1")))
}

// testApprovalInputErased: an erase of a key (SPEC §14) takes the input
// its approver was shown with its values, though the ask precedes the
// reserve that consumed it, and before the input's own deadline.
func testApprovalInputErased(t *testing.T, f Factory) {
	ctx := context.Background()
	_, n := openGated(t, f)
	a := askApproved(t, n, charge("charge-0010", "exec-1"))
	r := testkit.MustReserve(t, n, charge("charge-0010", "exec-1"))
	require.Equal(t, ledger.StatusReserved, r.Status)
	testkit.MustCommit(t, n, testkit.Succeed("charge-0010", r.Reservation))
	v, err := n.Approval(ctx, a.Ask.Seq, true)
	require.NoError(t, err)
	require.JSONEq(t, `{"order":7}`, v.Input)
	res, err := n.Erase(ctx, ledger.EraseRequest{Keys: []string{"charge-0010"}, Reason: "erasure request", Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, ledger.StatusErased, res.Status)
	v, err = n.Approval(ctx, a.Ask.Seq, true)
	require.NoError(t, err)
	assert.Empty(t, v.Input, "erased with the key")
}

func testApprovalWait(t *testing.T, f Factory) {
	_, n := openGated(t, f)
	r := testkit.MustReserve(t, n, charge("charge-0004", "exec-1"))
	done := reserveWaiting(t, n, charge("charge-0004", "exec-1"), 10_000)
	time.Sleep(50 * time.Millisecond)
	answer(t, n, r.Ask.Seq, ledger.DecisionApprove)
	res := woken(t, done, 8*time.Second, "the answer")
	assert.Equal(t, ledger.StatusReserved, res.Status, "the answer wakes the waiting reserve")
}

func testApprovalNamespaces(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	require.NoError(t, l.CreateNamespace(ctx, "gated", ledger.NamespaceSettings{}))
	g := ns(t, l, "gated")
	setPolicy(t, g, gatePolicy)
	d := ns(t, l, ledger.DefaultNamespace)
	assert.Equal(t, ledger.StatusReserved, testkit.MustReserve(t, d, charge("charge-0005", "exec-1")).Status,
		"another namespace's policy does not apply")
	assert.Equal(t, ledger.StatusApprovalRequired, testkit.MustReserve(t, g, charge("charge-0005", "exec-1")).Status)
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
	_, clock, n := openDefault(t, f)
	setPolicy(t, n, `{"rules":[{"tool":"payments.*","approval":"required"}]}`)
	run := func(key, exec string) *ledger.ReserveResult {
		askApproved(t, n, charge(key, exec))
		return testkit.MustReserve(t, n, charge(key, exec))
	}
	first := run("charge-0010", "exec-1")
	c := testkit.MustCommit(t, n, testkit.Fail("charge-0010", first.Reservation, false))
	second := run("charge-0011", "exec-2")
	verifyHead(t, n)
	rep := audit(t, n, clock.Now)
	require.Len(t, rep.Audit.RepeatedFailures, 1)
	rf := rep.Audit.RepeatedFailures[0]
	assert.Equal(t, []string{"charge-0010", "charge-0011"}, rf.Keys)
	assert.Equal(t, []uint64{c.Receipt.Seq, second.Receipt.Seq}, rf.Seqs)
}

// testApprovalOpenKeys: a takeover held for approval leaves the
// interrupted key open (ledger_keys_waiting) until a reserve or an outcome
// moves it: the gate's receipts end no reservation.
func testApprovalOpenKeys(t *testing.T, f Factory) {
	l, clock, n := openDefault(t, f)
	first := charge("charge-0020", "exec-1")
	first.LeaseMS = i64(1000)
	testkit.MustReserve(t, n, first) // before the policy: reserved at once
	setPolicy(t, n, gatePolicy)
	clock.Advance(1500 * time.Millisecond)
	require.Equal(t, map[string]int{"default/interrupted/idempotent": 1}, OpenKeys(t, l.Store()))
	a := testkit.MustReserve(t, n, charge("charge-0020", "exec-2"))
	require.Equal(t, ledger.StatusApprovalRequired, a.Status, "a takeover by another execution asks")
	require.Equal(t, map[string]int{"default/interrupted/idempotent": 1}, OpenKeys(t, l.Store()),
		"the ask leaves the interrupted reservation open")
	answer(t, n, a.Ask.Seq, ledger.DecisionApprove)
	require.Equal(t, map[string]int{"default/interrupted/idempotent": 1}, OpenKeys(t, l.Store()), "so does the answer")
	tk := testkit.MustReserve(t, n, charge("charge-0020", "exec-2"))
	require.True(t, tk.Takeover)
	require.Equal(t, map[string]int{"default/reserved/idempotent": 1}, OpenKeys(t, l.Store()))
}

// testApprovalFingerprints: the first ask fixes a new key's fingerprint
// and idempotent, pending, expired or approved (SPEC §2.1): a consuming
// reserve without input records the asked input's hash, an ask for an
// existing key carries the key's values, a later request with another
// input is a fingerprint mismatch; the chain verifies clean.
func testApprovalFingerprints(t *testing.T, f Factory) {
	clock, n := openGated(t, f)
	a := askApproved(t, n, charge("charge-0030", "exec-1"))
	bare := charge("charge-0030", "exec-1")
	bare.Input, bare.Idempotent = nil, false
	c := testkit.MustReserve(t, n, bare)
	require.Equal(t, ledger.StatusReserved, c.Status)
	got := receipt(t, n, c.Receipt.Seq)
	ask := receipt(t, n, a.Ask.Seq)
	assert.Equal(t, ask.InputHash, got.InputHash, "the reserve carries the asked input's hash")
	assert.True(t, got.Idempotent, "and the ask's idempotent")
	testkit.MustCommit(t, n, testkit.Succeed("charge-0030", c.Reservation))
	assert.Equal(t, ledger.StatusReplayed, testkit.MustReserve(t, n, charge("charge-0030", "exec-2")).Status)

	// An expired ask still fixes the fingerprint.
	e := testkit.MustReserve(t, n, charge("charge-0031", "exec-1"))
	require.Equal(t, ledger.StatusApprovalRequired, e.Status)
	clock.Advance(61 * time.Second)
	other := charge("charge-0031", "exec-1")
	other.Input = json.RawMessage(`{"order":99}`)
	assert.Equal(t, ledger.ECodeFingerprintMismatch, reserveCode(n, other))

	// A takeover asked by another execution carries the key's idempotent.
	first := charge("charge-0032", "exec-1")
	first.LeaseMS = i64(1000)
	askApproved(t, n, first)
	testkit.MustReserve(t, n, first)
	clock.Advance(2 * time.Second)
	take := charge("charge-0032", "exec-2")
	take.Idempotent = false
	ta := testkit.MustReserve(t, n, take)
	require.Equal(t, ledger.StatusApprovalRequired, ta.Status)
	tr := receipt(t, n, ta.Ask.Seq)
	assert.True(t, tr.Idempotent, "the ask carries the key's idempotent")
	verifyHead(t, n)
}

// testApprovalOwners: an approval is its asker's. Another principal
// meanwhile gets the same ask, not a new one, and cannot consume it;
// nor can it run the consumer's execution as a covered runtime retry.
func testApprovalOwners(t *testing.T, f Factory) {
	_, n := openGated(t, f)
	a := askApproved(t, n, charge("charge-0040", "exec-1"))
	intruder := charge("charge-0040", "exec-9")
	intruder.Actor = "mallory"
	b := testkit.MustReserve(t, n, intruder)
	require.Equal(t, ledger.StatusApprovalRequired, b.Status)
	assert.Equal(t, a.Ask.Seq, b.Ask.Seq, "the approved ask stays the key's one ask")
	c := testkit.MustReserve(t, n, charge("charge-0040", "exec-1"))
	require.Equal(t, ledger.StatusReserved, c.Status, "its asker consumes it")
	testkit.MustCommit(t, n, testkit.Fail("charge-0040", c.Reservation, true))
	spoof := charge("charge-0040", "exec-1")
	spoof.Actor, spoof.Attempt = "mallory", i64(2)
	s := testkit.MustReserve(t, n, spoof)
	assert.Equal(t, ledger.StatusApprovalRequired, s.Status, "another principal reusing the execution id asks")
	verifyHead(t, n)
}

// testApprovalPolicyText: the policy served is the policy recorded: an
// empty approvers list sets nothing, so the next rule's approvers apply,
// before and after the policy is read back from the chain.
func testApprovalPolicyText(t *testing.T, f Factory) {
	ctx := context.Background()
	_, _, n := openDefault(t, f)
	setPolicy(t, n, `{"rules":[{"tool":"pay.*","approval":"required","approvers":[]},{"tool":"*","approvers":["carol"]}]}`)
	p, _, err := n.Policy(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"carol"}, p.GateFor("pay.x", chain.EffectExternal).Approvers)
	a := testkit.MustReserve(t, n, gateReq("pay-key-0050", "exec-1", "pay.x"))
	_, _, err = n.Answer(ctx, ledger.AnswerRequest{Seq: a.Ask.Seq, Decision: ledger.DecisionApprove, Actor: "alice",
		Role: ledger.RoleApprover, Authenticated: true})
	assert.Equal(t, ledger.ECodeForbidden, code(err), "alice is not carol")
	// Denies: one per key, fingerprint and policy, whatever the order.
	setPolicy(t, n, `{"rules":[{"tool":"shell.*","deny":true}]}`)
	h0 := headSeq(t, n)
	for _, in := range []string{`{"p":1}`, `{"p":1}`, `{"p":2}`, `{"p":1}`, `{"p":2}`} {
		r := gateReq("rm-key-0050", "exec-1", "shell.rm")
		r.Input = json.RawMessage(in)
		assert.Equal(t, ledger.ECodeDeniedByPolicy, reserveCode(n, r))
	}
	h1 := headSeq(t, n)
	assert.Equal(t, h0+2, h1, "two fingerprints, two denies")
}

// testApprovalAskOutlivesPolicy: a key asked under a policy keeps the
// fingerprint its ask fixed after the policy stops gating its tool.
func testApprovalAskOutlivesPolicy(t *testing.T, f Factory) {
	_, n := openGated(t, f)
	require.Equal(t, ledger.StatusApprovalRequired, testkit.MustReserve(t, n, charge("charge-0060", "exec-1")).Status)
	setPolicy(t, n, `{"rules":[{"tool":"mail.*","repeat_failure":"refuse"}]}`)
	other := charge("charge-0060", "exec-1")
	other.Input = json.RawMessage(`{"order":61}`)
	assert.Equal(t, ledger.ECodeFingerprintMismatch, reserveCode(n, other), "the ask fixed the fingerprint")
	assert.Equal(t, ledger.StatusReserved, testkit.MustReserve(t, n, charge("charge-0060", "exec-1")).Status,
		"no rule gates it now")
	assert.Equal(t, ledger.StatusReserved, testkit.MustReserve(t, n, charge("charge-0061", "exec-1")).Status)
}
