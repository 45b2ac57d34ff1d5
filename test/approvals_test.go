package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// approvalPolicy is the policy of SPEC §13's example with a short expiry.
const approvalPolicy = `{"rules":[
 {"tool":"payments.*","approval":"required","approvers":["role:approver"],"expires_in_ms":60000},
 {"tool":"shell.rm*","deny":true},
 {"tool":"*","repeat_failure":"refuse","repeat_window_ms":86400000}],
 "self_approval":"deny"}`

// gateFixture is a ledgerd with the approval policy and its tokens.
type gateFixture struct {
	t                           *testing.T
	l                           *Ledgerd
	clock                       *testClock
	db                          string
	admin, agent, alice, reader string
}

func (f *gateFixture) as(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

// reserve reserves key for exec as tok; extra is appended to the body.
func (f *gateFixture) reserve(tok, key, exec, tool, input, extra string) Resp {
	f.t.Helper()
	return f.l.Do("POST", "/v1/effects/reserve", fmt.Sprintf(`{"idempotency_key":%q,"execution_id":%q,"tool":%q,"effect":"external","idempotent":true,"input":%s%s}`,
		key, exec, tool, input, extra), f.as(tok)...)
}

func (f *gateFixture) answer(tok string, seq int64, decision, note string) Resp {
	f.t.Helper()
	return f.l.Do("POST", fmt.Sprintf("/v1/approvals/%d", seq), fmt.Sprintf(`{"decision":%q,"note":%q}`, decision, note), f.as(tok)...)
}

func (f *gateFixture) commit(tok, key, rsv, outcome, extra string) Resp {
	f.t.Helper()
	return f.l.Do("POST", "/v1/effects/"+key+"/commit", testkit.CommitBody(rsv, outcome, extra), f.as(tok)...)
}

// newGateFixture starts ledgerd on db with clock and the tokens ops
// (admin), agent (writer), alice (approver) and auditor (reader), made
// before it starts (a clock that stands still never re-reads them).
func newGateFixture(t *testing.T, clock *testClock, db string) *gateFixture {
	t.Helper()
	f := &gateFixture{t: t, clock: clock, db: db}
	l := clock.start(t, db) // creates the database
	require.NoError(t, l.Stop())
	f.admin = createToken(t, db, "ops", "admin")
	f.agent = createToken(t, db, "agent", "writer")
	f.alice = createToken(t, db, "alice", "approver")
	f.reader = createToken(t, db, "auditor", "reader")
	f.l = clock.start(t, db)
	require.Equal(t, 401, f.l.Do("GET", "/v1/head", "").Status)
	return f
}

func startGate(t *testing.T, db string) *gateFixture {
	f := newGateFixture(t, newTestClock(t, t0), db)
	r := f.l.Do("PUT", "/v1/namespaces/default/policy", approvalPolicy, f.as(f.agent)...)
	require.Equal(t, 403, r.Status, "a writer may not set the policy: %s", r.Raw)
	r = f.l.Do("PUT", "/v1/namespaces/default/policy", approvalPolicy, f.as(f.admin)...)
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, true, r.Body["changed"])
	again := f.l.Do("PUT", "/v1/namespaces/default/policy", approvalPolicy, f.as(f.admin)...)
	require.Equal(t, 200, again.Status, again.Raw)
	assert.Equal(t, false, again.Body["changed"], "the same policy appends nothing")
	assert.Equal(t, r.Body["seq"], again.Body["seq"])
	g := f.l.Do("GET", "/v1/namespaces/default/policy", "", f.as(f.reader)...)
	require.Equal(t, 200, g.Status, g.Raw)
	assert.Equal(t, "deny", g.Body["policy"].(map[string]any)["self_approval"])
	bad := f.l.Do("PUT", "/v1/namespaces/default/policy", `{"rules":[{"tool":"x","approval":"maybe"}]}`, f.as(f.admin)...)
	require.Equal(t, 400, bad.Status, bad.Raw)
	assert.Equal(t, "rules[0].approval", bad.Body["error"].(map[string]any)["details"].(map[string]any)["field"])
	return f
}

// TestApprovals drives SPEC §13 through the real binaries on SQLite and
// PostgreSQL: policy, deny, key_required, effect_class_mismatch, ask →
// approve → consume, covered runtime retries, a re-invocation asking
// again (after the repeat guard), rejection, expiry, self-approval, the
// wait for an answer, and kill -9 between an approval and its consumer.
func TestApprovals(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testApprovals)
}

func testApprovals(t *testing.T, db string) {
	f := startGate(t, db)
	const input = `{"amount":1200,"to":"acct_9"}`

	// Refusals before anything is asked.
	r := f.l.Do("POST", "/v1/effects/reserve", `{"execution_id":"e1","tool":"payments.charge","effect":"external","input":{}}`, f.as(f.agent)...)
	require.Equal(t, 400, r.Status, r.Raw)
	assert.Equal(t, "key_required", r.Code())
	r = f.l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"read-key-0001","execution_id":"e1","tool":"payments.lookup","effect":"read"}`, f.as(f.agent)...)
	require.Equal(t, 422, r.Status, r.Raw)
	assert.Equal(t, "effect_class_mismatch", r.Code())
	d1 := f.reserve(f.agent, "rm-key-00001", "e1", "shell.rm_rf", `{"path":"/"}`, "")
	require.Equal(t, 403, d1.Status, d1.Raw)
	assert.Equal(t, "denied_by_policy", d1.Code())
	d2 := f.reserve(f.agent, "rm-key-00001", "e2", "shell.rm_rf", `{"path":"/"}`, "")
	require.Equal(t, 403, d2.Status, d2.Raw)
	assert.Equal(t, d1.Body["error"].(map[string]any)["details"].(map[string]any)["receipt"],
		d2.Body["error"].(map[string]any)["details"].(map[string]any)["receipt"], "one deny receipt per key, fingerprint and policy")

	// Ask: 202, the same ask again, another fingerprint refused.
	a := f.reserve(f.agent, "pay-key-0001", "e1", "payments.charge", input, `,"approval_summary":"charge 12.00 to acct_9"`)
	require.Equal(t, 202, a.Status, a.Raw)
	assert.Equal(t, "approval_required", a.Body["status"])
	askSeq := num(t, a.Body, "approval", "seq")
	a2 := f.reserve(f.agent, "pay-key-0001", "e1", "payments.charge", input, "")
	require.Equal(t, 202, a2.Status, a2.Raw)
	assert.Equal(t, askSeq, num(t, a2.Body, "approval", "seq"), "a key has at most one pending ask")
	mm := f.reserve(f.agent, "pay-key-0001", "e1", "payments.charge", `{"amount":99}`, "")
	require.Equal(t, 422, mm.Status, mm.Raw)
	assert.Equal(t, "fingerprint_mismatch", mm.Code())
	k := f.l.Do("GET", "/v1/effects/pay-key-0001", "", f.as(f.reader)...)
	require.Equal(t, 200, k.Status, k.Raw)
	assert.Equal(t, "awaiting_approval", k.Body["state"])

	// Reading the asks: the input for approvers only, checked against its hash.
	list := f.l.Do("GET", "/v1/approvals?state=pending", "", f.as(f.alice)...)
	require.Equal(t, 200, list.Status, list.Raw)
	require.Len(t, list.Body["approvals"], 1, list.Raw)
	show := f.l.Do("GET", fmt.Sprintf("/v1/approvals/%d", askSeq), "", f.as(f.alice)...)
	require.Equal(t, 200, show.Status, show.Raw)
	assert.Equal(t, true, show.Body["input_verified"])
	assert.Equal(t, float64(1200), show.Body["input"].(map[string]any)["amount"])
	assert.Equal(t, "charge 12.00 to acct_9", show.Body["summary"])
	hidden := f.l.Do("GET", fmt.Sprintf("/v1/approvals/%d", askSeq), "", f.as(f.reader)...)
	require.Equal(t, 200, hidden.Status, hidden.Raw)
	assert.Nil(t, hidden.Body["input"], "a reader never sees the asked input")

	// Who may answer.
	w := f.answer(f.agent, askSeq, "approve", "")
	require.Equal(t, 403, w.Status, w.Raw)
	assert.Equal(t, "self_approval", w.Code(), "the agent's own token may not approve its ask")
	w = f.answer(f.reader, askSeq, "approve", "")
	require.Equal(t, 403, w.Status, w.Raw)
	assert.Equal(t, "forbidden", w.Code(), "a reader may not answer")
	ans := f.answer(f.alice, askSeq, "approve", "ok for acct_9")
	require.Equal(t, 201, ans.Status, ans.Raw)
	assert.Equal(t, "approved", ans.Body["state"])
	again := f.answer(f.alice, askSeq, "approve", "ok for acct_9")
	require.Equal(t, 200, again.Status, again.Raw)
	other := f.answer(f.alice, askSeq, "reject", "changed my mind")
	require.Equal(t, 409, other.Status, other.Raw)
	assert.Equal(t, "already_answered", other.Code())

	// Consumed once: the reserve names the approval; a second is in_progress.
	c := f.reserve(f.agent, "pay-key-0001", "e1", "payments.charge", input, "")
	require.Equal(t, 201, c.Status, c.Raw)
	approvalSeq := num(t, ans.Body, "answer", "seq")
	assert.Equal(t, approvalSeq, num(t, c.Body, "approval", "seq"))
	assert.Equal(t, askSeq, num(t, c.Body, "approval", "ask_seq"))
	rc := f.l.Do("GET", fmt.Sprintf("/v1/receipts/%d", num(t, c.Body, "receipt", "seq")), "", f.as(f.reader)...)
	assert.Equal(t, float64(approvalSeq), rc.Body["ref_seq"])
	ip := f.reserve(f.agent, "pay-key-0001", "e2", "payments.charge", input, "")
	require.Equal(t, 409, ip.Status, ip.Raw)
	assert.Equal(t, "in_progress", ip.Code())

	// A retryable failure: the runtime retry of that execution is covered;
	// a re-invocation (another execution) meets the repeat guard, then asks.
	cm := f.commit(f.agent, "pay-key-0001", c.Body["reservation"].(string), "failed", `,"error":{"code":"TIMEOUT","retryable":true}`)
	require.Equal(t, 201, cm.Status, cm.Raw)
	rt := f.reserve(f.agent, "pay-key-0001", "e1", "payments.charge", input, `,"attempt":2`)
	require.Equal(t, 201, rt.Status, "a runtime retry needs no new approval: %s", rt.Raw)
	assert.Nil(t, rt.Body["approval"])
	cm = f.commit(f.agent, "pay-key-0001", rt.Body["reservation"].(string), "failed", `,"error":{"code":"TIMEOUT","retryable":true}`)
	require.Equal(t, 201, cm.Status, cm.Raw)
	ur := f.reserve(f.agent, "pay-key-0001", "e2", "payments.charge", input, "")
	require.Equal(t, 409, ur.Status, ur.Raw)
	assert.Equal(t, "unchanged_retry", ur.Code())
	changed := `,"changed":{"strategy":"smaller batches"}`
	ri := f.reserve(f.agent, "pay-key-0001", "e2", "payments.charge", input, changed)
	require.Equal(t, 202, ri.Status, "a re-invocation asks again: %s", ri.Raw)
	assert.Greater(t, num(t, ri.Body, "approval", "seq"), approvalSeq)
	require.Equal(t, 201, f.answer(f.alice, num(t, ri.Body, "approval", "seq"), "approve", "smaller is fine").Status)
	rc2 := f.reserve(f.agent, "pay-key-0001", "e2", "payments.charge", input, changed)
	require.Equal(t, 201, rc2.Status, "the re-invocation consumes its own approval: %s", rc2.Raw)
	require.Equal(t, 201, f.commit(f.agent, "pay-key-0001", rc2.Body["reservation"].(string), "succeeded", "").Status)

	// Rejected stays rejected.
	rj := f.reserve(f.agent, "pay-key-0002", "e3", "payments.charge", `{"amount":5}`, "")
	require.Equal(t, 202, rj.Status, rj.Raw)
	rjAns := f.answer(f.alice, num(t, rj.Body, "approval", "seq"), "reject", "not this one")
	require.Equal(t, 201, rjAns.Status, rjAns.Raw)
	rr := f.reserve(f.agent, "pay-key-0002", "e3", "payments.charge", `{"amount":5}`, "")
	require.Equal(t, 409, rr.Status, rr.Raw)
	assert.Equal(t, "approval_rejected", rr.Code())
	assert.Equal(t, "not this one", rr.Body["error"].(map[string]any)["details"].(map[string]any)["approval"].(map[string]any)["note"])
	assert.Equal(t, "rejected", f.l.Do("GET", "/v1/effects/pay-key-0002", "", f.as(f.reader)...).Body["state"])

	// Self-approval: an admin that asked may not approve its own ask.
	sa := f.reserve(f.admin, "pay-key-0003", "e4", "payments.charge", `{"amount":6}`, "")
	require.Equal(t, 202, sa.Status, sa.Raw)
	self := f.answer(f.admin, num(t, sa.Body, "approval", "seq"), "approve", "")
	require.Equal(t, 403, self.Status, self.Raw)
	assert.Equal(t, "self_approval", self.Code())

	// Expiry: an answer after it is 410, and the next reserve asks again.
	ex := f.reserve(f.agent, "pay-key-0004", "e5", "payments.charge", `{"amount":7}`, "")
	require.Equal(t, 202, ex.Status, ex.Raw)
	f.clock.advance(61 * time.Second)
	late := f.answer(f.alice, num(t, ex.Body, "approval", "seq"), "approve", "")
	require.Equal(t, 410, late.Status, late.Raw)
	assert.Equal(t, "approval_expired", late.Code())
	ex2 := f.reserve(f.agent, "pay-key-0004", "e5", "payments.charge", `{"amount":7}`, "")
	require.Equal(t, 202, ex2.Status, ex2.Raw)
	assert.Greater(t, num(t, ex2.Body, "approval", "seq"), num(t, ex.Body, "approval", "seq"))

	// An ask that expires while a reserve waits on it: the reserve asks
	// again when its wait ends, and the expired ask cannot be answered.
	ew := f.reserve(f.agent, "pay-key-0007", "e9", "payments.charge", `{"amount":10}`, "")
	require.Equal(t, 202, ew.Status, ew.Raw)
	done := make(chan Resp, 1)
	go func() {
		done <- f.reserve(f.agent, "pay-key-0007", "e9", "payments.charge", `{"amount":10}`, `,"wait_ms":1500`)
	}()
	time.Sleep(300 * time.Millisecond)
	f.clock.advance(61 * time.Second)
	ewr := <-done
	require.Equal(t, 202, ewr.Status, ewr.Raw)
	assert.Greater(t, num(t, ewr.Body, "approval", "seq"), num(t, ew.Body, "approval", "seq"), "a new ask once the first expired")
	require.Equal(t, 410, f.answer(f.alice, num(t, ew.Body, "approval", "seq"), "approve", "").Status)

	// wait_ms: a reserve waits for the answer and consumes it.
	wa := f.reserve(f.agent, "pay-key-0005", "e6", "payments.charge", `{"amount":8}`, "")
	require.Equal(t, 202, wa.Status, wa.Raw)
	var wg sync.WaitGroup
	var waited Resp
	wg.Add(1)
	go func() {
		defer wg.Done()
		waited = f.reserve(f.agent, "pay-key-0005", "e6", "payments.charge", `{"amount":8}`, `,"wait_ms":20000`)
	}()
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, 201, f.answer(f.alice, num(t, wa.Body, "approval", "seq"), "approve", "").Status)
	wg.Wait()
	require.Equal(t, 201, waited.Status, "the waiting reserve consumes the answer: %s", waited.Raw)

	// kill -9 between the approval and its consumer: consumed once after restart.
	kk := f.reserve(f.agent, "pay-key-0006", "e7", "payments.charge", `{"amount":9}`, "")
	require.Equal(t, 202, kk.Status, kk.Raw)
	require.Equal(t, 201, f.answer(f.alice, num(t, kk.Body, "approval", "seq"), "approve", "").Status)
	f.l.Kill()
	f.l = f.clock.start(t, db)
	k1 := f.reserve(f.agent, "pay-key-0006", "e7", "payments.charge", `{"amount":9}`, "")
	require.Equal(t, 201, k1.Status, k1.Raw)
	k2 := f.reserve(f.agent, "pay-key-0006", "e8", "payments.charge", `{"amount":9}`, "")
	require.Equal(t, 409, k2.Status, k2.Raw)
	assert.Equal(t, "in_progress", k2.Code())

	// ledgerctl: the policy, the ask with its input, an approval from the command line.
	cli := func(tok string, args ...string) string {
		t.Helper()
		out, stderr, code := ledgerctl(t, append(args, "--server", f.l.URL, "--token", tok)...)
		require.Equal(t, 0, code, "%v: %s", args, stderr)
		return out
	}
	assert.Contains(t, cli(f.reader, "policy", "show", "default"), "payments.*")
	cl := f.reserve(f.agent, "pay-key-0008", "e10", "payments.charge", `{"amount":11,"to":"acct_cli"}`, "")
	require.Equal(t, 202, cl.Status, cl.Raw)
	clSeq := fmt.Sprint(num(t, cl.Body, "approval", "seq"))
	assert.Contains(t, cli(f.alice, "approvals", "list", "--state", "pending"), "pay-key-0008")
	assert.Contains(t, cli(f.alice, "approvals", "show", clSeq), "acct_cli")
	cli(f.alice, "approvals", "approve", clSeq, "--note", "from the command line")
	require.Equal(t, 201, f.reserve(f.agent, "pay-key-0008", "e10", "payments.charge", `{"amount":11,"to":"acct_cli"}`, "").Status)

	consumed := f.l.Do("GET", "/v1/approvals?state=consumed", "", f.as(f.reader)...)
	require.Equal(t, 200, consumed.Status, consumed.Raw)
	assert.Len(t, consumed.Body["approvals"], 5, consumed.Raw)

	// The verifier finds nothing wrong and lists the approvals, offline and through the server.
	for _, src := range [][]string{{"--db", db}, {"--server", f.l.URL, "--token", f.reader}} {
		out, stderr, code := ledgerctl(t, append([]string{"verify", "--json"}, src...)...)
		require.Equal(t, 0, code, "%v: %s\n%s", src[0], stderr, out)
		var rep struct {
			Audit struct {
				Approvals []map[string]any `json:"approvals"`
				Denied    []map[string]any `json:"denied"`
			} `json:"audit"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
		assert.Len(t, rep.Audit.Approvals, 11, "%v: every ask", src[0])
		assert.Len(t, rep.Audit.Denied, 1, "%v: one deny receipt", src[0])
	}
	out, stderr, code := ledgerctl(t, "audit", "--db", db)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "Approvals: each ask, its answer and the reserve that consumed it (11)")
	assert.Contains(t, out, "Denied by policy: effects the policy refused (1)")
	assert.Contains(t, out, "alice (approver)")
}

// TestApprovals_replicasRaceToConsume: two ledgerd replicas of one
// PostgreSQL database race to consume one approval, many times over:
// exactly one reserve consumes it, the others are in_progress (SPEC §13:
// decided by §4 first, never a second run), and the verifier agrees.
func TestApprovals_replicasRaceToConsume(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	a, b := startReplicas(t, url)
	r := a.Do("PUT", "/v1/namespaces/default/policy", `{"rules":[{"tool":"payments.*","approval":"required"}]}`)
	require.Equal(t, 200, r.Status, r.Raw)
	for round := range 5 {
		key := fmt.Sprintf("race-key-%04d", round)
		body := fmt.Sprintf(`{"idempotency_key":%q,"execution_id":"e1","tool":"payments.charge","effect":"external","input":{"n":%d}}`, key, round)
		ask := b.Do("POST", "/v1/effects/reserve", body)
		require.Equal(t, 202, ask.Status, ask.Raw)
		require.Equal(t, 201, a.Do("POST", fmt.Sprintf("/v1/approvals/%d", num(t, ask.Body, "approval", "seq")), `{"decision":"approve"}`).Status)
		var wg sync.WaitGroup
		codes := make([]int, 16)
		for i := range codes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := a
				if i%2 == 1 {
					l = b
				}
				codes[i] = l.Do("POST", "/v1/effects/reserve", body).Status
			}()
		}
		wg.Wait()
		won := 0
		for _, c := range codes {
			switch c {
			case 201:
				won++
			case 409:
			default:
				t.Errorf("round %d: status %d", round, c)
			}
		}
		assert.Equal(t, 1, won, "round %d: one reserve consumes the approval: %v", round, codes)
	}
	verified(t, url)
}

// gatedLedgerd starts ledgerd on db with a policy that sends every
// payments.* call in namespace default to a person.
func gatedLedgerd(t *testing.T, db string) *Ledgerd {
	t.Helper()
	l := StartLedgerd(t, db)
	policy := filepath.Join(t.TempDir(), "policy.json")
	require.NoError(t, os.WriteFile(policy, []byte(`{"rules":[{"tool":"payments.*","approval":"required","expires_in_ms":600000}]}`), 0o600))
	_, stderr, code := ledgerctl(t, "policy", "set", "--server", l.URL, "default", policy)
	require.Equal(t, 0, code, stderr)
	return l
}

// TestGoClient_approvalRequiredNamesThePage: a call the policy sends to
// a person gives the Go client's ApprovalRequiredError the ask's seq, its
// expiry and the page where a person answers it (<base>/ui/#approvals/SEQ,
// as ledger-mcp names it), as fields and in its message.
func TestGoClient_approvalRequiredNamesThePage(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		l := gatedLedgerd(t, db)
		c, err := client.New(l.URL)
		require.NoError(t, err)
		_, err = c.Reserve(context.Background(), client.ReserveRequest{Key: "charge-order-0001", ExecutionID: "exec-1",
			Tool: "payments.charge", Class: client.ClassExternal, Input: json.RawMessage(`{"amount":1200}`)})
		var are *client.ApprovalRequiredError
		require.ErrorAs(t, err, &are)
		require.NotZero(t, are.Seq)
		assert.False(t, are.ExpiresAt.IsZero())
		page := fmt.Sprintf("%s/ui/#approvals/%d", l.URL, are.Seq)
		assert.Equal(t, page, are.URL)
		for _, want := range []string{fmt.Sprintf("ask %d", are.Seq), "expires " + are.ExpiresAt.UTC().Format(time.RFC3339), page} {
			assert.Contains(t, err.Error(), want)
		}
		r := l.Do("GET", fmt.Sprintf("/v1/approvals/%d", are.Seq), "")
		assert.Equal(t, 200, r.Status, "the seq names the ask: %s", r.Raw)

		// The command the message names answers the ask; the call then runs.
		answer := fmt.Sprintf("ledgerctl approvals approve %d --server %s", are.Seq, l.URL)
		require.Contains(t, err.Error(), "(or: "+answer+")")
		_, stderr, code := ledgerctl(t, strings.Fields(answer)[1:]...)
		require.Equal(t, 0, code, stderr)
		rsv, err := c.Reserve(context.Background(), client.ReserveRequest{Key: "charge-order-0001", ExecutionID: "exec-1",
			Tool: "payments.charge", Class: client.ClassExternal, Input: json.RawMessage(`{"amount":1200}`)})
		require.NoError(t, err)
		assert.Equal(t, &client.ApprovalUse{Seq: are.Seq + 1, AskSeq: are.Seq}, rsv.Approval)
	})
}
