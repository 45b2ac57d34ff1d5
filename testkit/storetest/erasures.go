package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// RunOverlappingErasures: erases of overlapping keys sent at once (the
// scheduler puts them in one write group, one transaction) each claim
// only what they erased (SPEC §14): their counts add up to the receipts
// that held values, once each, and every value is gone.
func RunOverlappingErasures(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	require.NoError(t, l.CreateNamespace(ctx, "ov", ledger.NamespaceSettings{Payloads: ledger.PayloadsCommitted}))
	n := ns(t, l, "ov")
	const keys = 40
	var all []string
	var commits []uint64
	for i := range keys {
		key := fmt.Sprintf("ov-key-%04d", i)
		all = append(all, key)
		r := testkit.MustReserve(t, n, testkit.ReserveReq(key, "exec-1"))
		c := testkit.MustCommit(t, n, testkit.Succeed(key, r.Reservation))
		commits = append(commits, c.Receipt.Seq)
	}
	for round := range 3 { // the grouping is the scheduler's: try more than once
		var wg sync.WaitGroup
		counts := make([]uint64, 8)
		for i := range counts {
			wg.Go(func() {
				window := all[i*4 : min(i*4+12, keys)] // each key in up to three windows
				res, err := n.Erase(ctx, ledger.EraseRequest{Keys: window, Actor: "ops", Reason: "overlap"})
				if assert.NoError(t, err) {
					counts[i] = res.Count
				}
			})
		}
		wg.Wait()
		var sum uint64
		for _, c := range counts {
			sum += c
		}
		want := uint64(keys)
		if round > 0 {
			want = 0 // nothing left to erase
		}
		assert.Equal(t, want, sum, "round %d: the erases claim each receipt once: %v", round, counts)
	}
	for _, seq := range commits {
		r, err := n.GetReceipt(ctx, seq)
		require.NoError(t, err)
		assert.Len(t, r.Open.Erased(), 2, "receipt %d: external_ref and result erased, once", seq)
	}
}

// RunSubjectErasesApprovals: an erase by subject takes the values of the
// ask and the approval of the subject's keys (SPEC §13, §14): those of an
// ask a later reserve consumed, and those of an ask that was rejected
// (its reserve held, never reserved), with the asks' inputs.
func RunSubjectErasesApprovals(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	require.NoError(t, l.CreateNamespace(ctx, "subj", ledger.NamespaceSettings{Payloads: ledger.PayloadsCommitted}))
	n := ns(t, l, "subj")
	setPolicy(t, n, gatePolicy)
	held := func(key string) uint64 {
		req := charge(key, "exec-1")
		req.Input, req.ApprovalSummary, req.Subjects = json.RawMessage(`{"card":"4242"}`), "refund for "+key, []string{"person-7"}
		r := testkit.MustReserve(t, n, req)
		require.NotNil(t, r.Ask, key)
		return r.Ask.Seq
	}
	decide := func(seq uint64, decision string) uint64 {
		return answerAsk(t, n, seq, decision, "checked "+decision).Seq
	}
	consumedAsk := held("subj-key-0001")
	consumedApproval := decide(consumedAsk, ledger.DecisionApprove)
	req := charge("subj-key-0001", "exec-1")
	req.Input, req.Subjects = json.RawMessage(`{"card":"4242"}`), []string{"person-7"}
	r := testkit.MustReserve(t, n, req)
	require.NotNil(t, r.Approval, "the reserve consumes the approval")
	testkit.MustCommit(t, n, testkit.Succeed("subj-key-0001", r.Reservation))
	rejectedAsk := held("subj-key-0002")
	rejection := decide(rejectedAsk, ledger.DecisionReject)

	res, err := n.Erase(ctx, ledger.EraseRequest{Subject: "person-7", Actor: "ops", Reason: "request 1"})
	require.NoError(t, err)
	require.Equal(t, ledger.StatusErased, res.Status)
	for _, seq := range []uint64{consumedAsk, consumedApproval, rejectedAsk, rejection} {
		rc, err := n.GetReceipt(ctx, seq)
		require.NoError(t, err)
		assert.NotEmpty(t, rc.Open.Erased(), "receipt %d (%s): its values erased", seq, rc.Kind)
		for _, f := range chain.PayloadFields {
			if p := rc.Open.Get(f); p != nil {
				assert.NotZero(t, p.ErasedBy, "receipt %d (%s) keeps %s", seq, rc.Kind, f.Name())
			}
		}
	}
	for _, ask := range []uint64{consumedAsk, rejectedAsk} {
		v, err := n.Approval(ctx, ask, true)
		require.NoError(t, err)
		assert.Empty(t, v.Input, "the input shown to the approver of ask %d", ask)
	}
}

// RunRetentionSparesPendingAsks: a retention sweep (SPEC §14) leaves the
// ask of a key still waiting for its approver, an approval not yet
// consumed, and both once consumed by a generation still in flight,
// whatever their age; once the key is final, they go.
func RunRetentionSparesPendingAsks(t *testing.T, f Factory) {
	ctx := context.Background()
	l, clock := open(t, f)
	require.NoError(t, l.CreateNamespace(ctx, "ret", ledger.NamespaceSettings{Payloads: ledger.PayloadsCommitted}))
	n := ns(t, l, "ret")
	setPolicy(t, n, `{"retention":{"payloads_ms":60000},"rules":[{"tool":"payments.*","approval":"required","expires_in_ms":86400000}]}`)
	req := charge("ret-key-0001", "exec-1")
	req.Input, req.ApprovalSummary = json.RawMessage(`{"card":"4242"}`), "a refund"
	r := testkit.MustReserve(t, n, req)
	require.NotNil(t, r.Ask)
	kept := func(seq uint64) bool {
		rc, err := n.GetReceipt(ctx, seq)
		require.NoError(t, err)
		return len(rc.Open.Erased()) == 0
	}
	sweep := func() {
		clock.Advance(2 * 60_000 * time.Millisecond)
		_, err := n.Sweep(ctx)
		require.NoError(t, err)
	}
	sweep()
	assert.True(t, kept(r.Ask.Seq), "an ask waiting for its approver keeps its summary")
	answer := answerAsk(t, n, r.Ask.Seq, ledger.DecisionApprove, "fine")
	sweep()
	assert.True(t, kept(r.Ask.Seq), "approved, not consumed: the ask stays")
	assert.True(t, kept(answer.Seq), "approved, not consumed: the approval stays")
	c := testkit.MustReserve(t, n, req)
	require.NotNil(t, c.Approval)
	sweep()
	assert.True(t, kept(r.Ask.Seq), "consumed by the generation in flight: the ask stays")
	assert.True(t, kept(answer.Seq), "consumed by the generation in flight: the approval stays")
	testkit.MustCommit(t, n, testkit.Succeed("ret-key-0001", c.Reservation))
	sweep()
	assert.False(t, kept(r.Ask.Seq), "the key is final: its ask goes")
	assert.False(t, kept(answer.Seq), "and its approval")
}

// RunEraseAwaitingApproval: an erase that selects a key waiting for its
// approval (awaiting_approval, or approved and not consumed yet) lists
// it as pending (SPEC §14), and the receipts its approval and run add
// later — the approver's note, the commit's values — are erased in the
// transaction that finalizes the key. A rejected ask leaves nothing
// pending.
func RunEraseAwaitingApproval(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	require.NoError(t, l.CreateNamespace(ctx, "await", ledger.NamespaceSettings{Payloads: ledger.PayloadsCommitted}))
	n := ns(t, l, "await")
	setPolicy(t, n, gatePolicy)
	answer := func(seq uint64, decision string) uint64 {
		return answerAsk(t, n, seq, decision, "note of "+decision).Seq
	}
	allErased := func(seq uint64) {
		t.Helper()
		rc, err := n.GetReceipt(ctx, seq)
		require.NoError(t, err)
		assert.NotEmpty(t, rc.Open.Erased(), "receipt %d (%s): its values erased", seq, rc.Kind)
		for _, f := range chain.PayloadFields {
			if p := rc.Open.Get(f); p != nil {
				assert.NotZero(t, p.ErasedBy, "receipt %d (%s) keeps %s", seq, rc.Kind, f.Name())
			}
		}
	}
	for _, tc := range []struct {
		name           string
		approvedBefore bool
		bySubject      bool
	}{{"unanswered, by key", false, false}, {"approved, by key", true, false}, {"unanswered, by subject", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			key := fmt.Sprintf("await-key-%t-%t", tc.approvedBefore, tc.bySubject)
			subject := "person-" + key
			req := charge(key, "exec-1")
			req.Input, req.ApprovalSummary, req.Subjects = json.RawMessage(`{"card":"4242"}`), "refund for "+key, []string{subject}
			held := testkit.MustReserve(t, n, req)
			require.NotNil(t, held.Ask)
			var approval uint64
			if tc.approvedBefore {
				approval = answer(held.Ask.Seq, ledger.DecisionApprove)
			}
			er := ledger.EraseRequest{Keys: []string{key}, Actor: "ops", Reason: "request"}
			if tc.bySubject {
				er = ledger.EraseRequest{Subject: subject, Actor: "ops", Reason: "request"}
			}
			res, err := n.Erase(ctx, er)
			require.NoError(t, err)
			assert.Equal(t, []string{key}, res.Pending, "the key waits for its approval: pending")
			if !tc.approvedBefore {
				approval = answer(held.Ask.Seq, ledger.DecisionApprove)
			}
			r := testkit.MustReserve(t, n, req)
			require.NotNil(t, r.Approval, "the reserve consumes the approval")
			c := testkit.MustCommit(t, n, testkit.Succeed(key, r.Reservation))
			for _, seq := range []uint64{held.Ask.Seq, approval, c.Receipt.Seq} {
				allErased(seq)
			}
			rc, err := n.GetReceipt(ctx, r.Receipt.Seq)
			require.NoError(t, err)
			for _, f := range chain.PayloadFields {
				if p := rc.Open.Get(f); p != nil {
					assert.NotZero(t, p.ErasedBy, "the reserve keeps %s", f.Name())
				}
			}
		})
	}
	t.Run("rejected", func(t *testing.T) {
		key := "await-key-rejected"
		req := charge(key, "exec-1")
		req.ApprovalSummary = "refund for " + key
		held := testkit.MustReserve(t, n, req)
		require.NotNil(t, held.Ask)
		answer(held.Ask.Seq, ledger.DecisionReject)
		res, err := n.Erase(ctx, ledger.EraseRequest{Keys: []string{key}, Actor: "ops", Reason: "request"})
		require.NoError(t, err)
		assert.Empty(t, res.Pending, "a rejected ask is final")
	})
}

// RunRetentionPagesPastKept: a retention sweep (SPEC §14) pages past the
// values it keeps whatever their number — here more erase receipts'
// reasons than one sweep may erase receipts (Config.MaxSweep) — and
// erases the expired values behind them.
func RunRetentionPagesPastKept(t *testing.T, f Factory) {
	ctx := context.Background()
	clock := testkit.NewClock()
	l := ledger.New(f(t, clock.Now), ledger.Config{Now: clock.Now, MaxSweep: 3})
	t.Cleanup(func() { _ = l.Close() })
	require.NoError(t, l.CreateNamespace(ctx, "pages", ledger.NamespaceSettings{Payloads: ledger.PayloadsCommitted}))
	n := ns(t, l, "pages")
	commit := func(key string) uint64 {
		r := testkit.MustReserve(t, n, testkit.ReserveReq(key, "exec-1"))
		return testkit.MustCommit(t, n, testkit.Succeed(key, r.Reservation)).Receipt.Seq
	}
	for i := range 5 {
		key := fmt.Sprintf("pages-erased-%d", i)
		commit(key)
		_, err := n.Erase(ctx, ledger.EraseRequest{Keys: []string{key}, Actor: "ops", Reason: "request " + key})
		require.NoError(t, err)
	}
	late := []uint64{commit("pages-late-0001"), commit("pages-late-0002")}
	setPolicy(t, n, `{"retention":{"payloads_ms":60000}}`)
	clock.Advance(2 * 60_000 * time.Millisecond)
	res, err := n.Sweep(ctx)
	require.NoError(t, err)
	require.NotNil(t, res, "the sweep finds the expired values behind five kept reasons")
	assert.Equal(t, uint64(2), res.Count)
	assert.False(t, res.More)
	for _, seq := range late {
		rc, err := n.GetReceipt(ctx, seq)
		require.NoError(t, err)
		assert.NotEmpty(t, rc.Open.Erased(), "receipt %d", seq)
	}
}

// RunPendingMarksMerge: a second erase of a key in flight, of fewer
// fields, adds to the first one's mark and never narrows it; an ask
// marked pending and then rejected has its rejection's note erased at
// once, and leaves no mark (SPEC §13, §14).
func RunPendingMarksMerge(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	require.NoError(t, l.CreateNamespace(ctx, "merge", ledger.NamespaceSettings{Payloads: ledger.PayloadsCommitted}))
	n := ns(t, l, "merge")
	setPolicy(t, n, gatePolicy)
	erase := func(key string, fields ...string) *ledger.EraseResult {
		set, err := chain.ParseFieldSet(fields)
		require.NoError(t, err)
		res, err := n.Erase(ctx, ledger.EraseRequest{Keys: []string{key}, Fields: set, Actor: "ops", Reason: "request"})
		require.NoError(t, err)
		return res
	}
	free := testkit.ReserveReq("merge-key-0001", "exec-1")
	free.Tool = "mail.send" // not held by the policy
	r := testkit.MustReserve(t, n, free)
	require.NotEmpty(t, r.Reservation)
	assert.Equal(t, []string{"merge-key-0001"}, erase("merge-key-0001").Pending)
	assert.Equal(t, []string{"merge-key-0001"}, erase("merge-key-0001", "note").Pending)
	c := testkit.MustCommit(t, n, testkit.Succeed("merge-key-0001", r.Reservation))
	rc, err := n.GetReceipt(ctx, c.Receipt.Seq)
	require.NoError(t, err)
	assert.Len(t, rc.Open.Erased(), 2, "external_ref and result erased: the narrower erase did not replace the first")

	req := charge("merge-key-0002", "exec-1")
	req.ApprovalSummary = "a refund"
	held := testkit.MustReserve(t, n, req)
	require.NotNil(t, held.Ask)
	assert.Equal(t, []string{"merge-key-0002"}, erase("merge-key-0002").Pending)
	rejection := answerAsk(t, n, held.Ask.Seq, ledger.DecisionReject, "no, says alice")
	assert.Empty(t, rejection.Value(chain.FieldNote), "the answer shows the note erased")
	rc, err = n.GetReceipt(ctx, rejection.Seq)
	require.NoError(t, err)
	assert.NotEmpty(t, rc.Open.Erased(), "the rejection's note is erased at once")
	exp, err := n.ExportErasures(ctx)
	require.NoError(t, err)
	assert.Empty(t, exp.Pending, "a rejected key is final: no mark stays")
}

// answerAsk records alice's answer (an approver) with note to the ask at
// seq, and returns the approval receipt as answered.
func answerAsk(t *testing.T, n *ledger.Namespace, seq uint64, decision, note string) *chain.Receipt {
	t.Helper()
	v, _, err := n.Answer(context.Background(), ledger.AnswerRequest{Seq: seq, Decision: decision, Note: note,
		Actor: "alice", Role: ledger.RoleApprover, Authenticated: true})
	require.NoError(t, err)
	return v.Answer
}
