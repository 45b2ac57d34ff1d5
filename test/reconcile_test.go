package test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// reconcilePolicy lets payments.* be reconciled, not_applied 60 s past the
// lease (SPEC §15).
const reconcilePolicy = `{"rules":[{"tool":"payments.*","reconcile":{"allow":true,"settle_ms":60000}}]}`

// evidence is a reconcile's evidence: a lookup by the key, and its answer.
func evidence(applied bool) string {
	return fmt.Sprintf(`"evidence":{"lookup":"payments.find_charge","answer":{"applied":%t,"by":"idempotency key"}}`, applied)
}

// TestLedgerd_reconcile drives SPEC §15 through the real binaries on both
// drivers: an interrupted charge reconciled as succeeded replays without
// running; one reconciled as not_applied runs once after settle_ms; every
// refusal; a reconcile never recorded (ledgerd killed) leaves the key
// interrupted until the next try; the original call's late commit is
// appended and listed as contradicted; ledgerctl verify is clean.
func TestLedgerd_reconcile(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testReconcile)
}

func testReconcile(t *testing.T, db string) {
	clock := newPastClock(t) // leases end for the offline verifier too
	l := clock.start(t, db)
	admin := createToken(t, db, "ops", "admin")
	agent := createToken(t, db, "agent", "writer")
	other := createToken(t, db, "other-agent", "writer")
	require.Eventually(t, func() bool { return l.Do("GET", "/v1/head", "").Status == 401 },
		10*time.Second, 20*time.Millisecond, "a new first token is enforced within a second")
	as := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	reserve := func(key, exec, tool, extra string) Resp {
		t.Helper()
		return l.Do("POST", "/v1/effects/reserve", fmt.Sprintf(`{"idempotency_key":%q,"execution_id":%q,"tool":%q,`+
			`"effect":"external","input":{"key":%q}%s}`, key, exec, tool, key, extra), as(agent)...)
	}
	reconcile := func(key, tok, body string) Resp {
		t.Helper()
		return l.Do("POST", "/v1/effects/"+key+"/reconcile", body, as(tok)...)
	}
	found := `{"outcome":"succeeded","external_ref":"ch_42","result":{"amount":1200},` + evidence(true) + `}`
	nothing := `{"outcome":"not_applied","error":{"code":"NOT_FOUND","message":"no charge under the key"},` + evidence(false) + `}`
	requireCode := func(r Resp, status int, code string) {
		t.Helper()
		require.Equal(t, status, r.Status, r.Raw)
		require.Equal(t, code, r.Code(), r.Raw)
	}

	// Without a rule, nothing may be reconciled.
	r := reserve("mail-key-0001", "exec-0", "email.send", `,"lease_ms":10`)
	require.Equal(t, 201, r.Status, r.Raw)
	clock.advance(20 * time.Millisecond)
	requireCode(reconcile("mail-key-0001", agent, found), 403, "reconcile_not_allowed")
	p := l.Do("PUT", "/v1/namespaces/default/policy", reconcilePolicy, as(admin)...)
	require.Equal(t, 200, p.Status, p.Raw)
	requireCode(reconcile("mail-key-0001", agent, found), 403, "reconcile_not_allowed")

	// A leased key is not interrupted yet.
	r = reserve("pay-key-0000", "exec-0", "payments.charge", `,"lease_ms":600000`)
	require.Equal(t, 201, r.Status, r.Raw)
	requireCode(reconcile("pay-key-0000", agent, found), 409, "not_interrupted")

	// An interrupted charge, found by the lookup: succeeded, replayed.
	r = reserve("pay-key-0001", "exec-1", "payments.charge", `,"lease_ms":10`)
	require.Equal(t, 201, r.Status, r.Raw)
	reserveSeq := num(t, r.Body, "receipt", "seq")
	clock.advance(20 * time.Millisecond)
	requireCode(reserve("pay-key-0001", "exec-2", "payments.charge", ""), 409, "unsafe_resume")
	requireCode(reconcile("pay-key-0001", other, found), 403, "reconcile_not_allowed")
	requireCode(reconcile("pay-key-0001", agent, `{"outcome":"failed","error":{"code":"X"},`+evidence(true)+`}`), 400, "invalid_request")
	requireCode(reconcile("pay-key-0001", agent, `{"outcome":"succeeded",`+evidence(true)+`}`), 400, "invalid_request")
	requireCode(reconcile("pay-key-0001", agent, `{"outcome":"succeeded","external_ref":"ch_42"}`), 400, "invalid_request")
	requireCode(reconcile("pay-key-0001", agent, `{"outcome":"succeeded","external_ref":"ch_42","evidence":{"lookup":"x"}}`), 400, "invalid_request")
	early := reconcile("pay-key-0001", agent, nothing)
	requireCode(early, 409, "reconcile_too_early")
	assert.NotEmpty(t, early.Header.Get("Retry-After"))
	rc := reconcile("pay-key-0001", agent, found)
	require.Equal(t, 201, rc.Status, rc.Raw)
	assert.Equal(t, "reconciled", rc.Body["status"])
	assert.Equal(t, "succeeded", rc.Body["state"])
	got := l.Do("GET", fmt.Sprintf("/v1/receipts/%d", num(t, rc.Body, "receipt", "seq")), "", as(admin)...)
	require.Equal(t, 200, got.Status, got.Raw)
	assert.Equal(t, "reconcile", got.Body["kind"])
	assert.Equal(t, float64(reserveSeq), got.Body["ref_seq"], "names the interrupted reserve")
	assert.Equal(t, "exec-1", got.Body["execution_id"], "repeats the reserve's execution")
	assert.Equal(t, "agent", got.Body["actor"])
	assert.Equal(t, "ch_42", got.Body["external_ref"])
	assert.Equal(t, `{"answer":{"applied":true,"by":"idempotency key"},"lookup":"payments.find_charge"}`, got.Body["note"],
		"the evidence in RFC 8785 form")
	rp := reserve("pay-key-0001", "exec-2", "payments.charge", "")
	require.Equal(t, 200, rp.Status, rp.Raw)
	assert.Equal(t, "replayed", rp.Body["status"], "replayed without running")
	assert.Equal(t, "ch_42", rp.Body["external_ref"])
	requireCode(reconcile("pay-key-0001", agent, found), 409, "not_interrupted")

	// One the lookup did not find: not_applied after settle_ms, then it
	// runs once.
	r = l.Do("POST", "/v1/ns/default/effects/reserve", `{"idempotency_key":"pay-key-0002","execution_id":"exec-3",`+
		`"tool":"payments.charge","effect":"external","input":{"key":"pay-key-0002"},"lease_ms":10}`, as(agent)...)
	require.Equal(t, 201, r.Status, r.Raw)
	clock.advance(30 * time.Second)
	requireCode(l.Do("POST", "/v1/ns/default/effects/pay-key-0002/reconcile", nothing, as(agent)...), 409, "reconcile_too_early")
	clock.advance(31 * time.Second)
	na := l.Do("POST", "/v1/ns/default/effects/pay-key-0002/reconcile", nothing, as(agent)...)
	require.Equal(t, 201, na.Status, na.Raw)
	assert.Equal(t, "not_applied", na.Body["state"])
	rerun := reserve("pay-key-0002", "exec-4", "payments.charge", "")
	require.Equal(t, 201, rerun.Status, rerun.Raw)
	assert.Equal(t, num(t, na.Body, "receipt", "seq"), num(t, rerun.Body, "after_not_applied", "seq"))
	c := l.Do("POST", "/v1/effects/pay-key-0002/commit", testkit.CommitBody(rerun.Body["reservation"].(string), "succeeded", `,"external_ref":"ch_43"`), as(agent)...)
	require.Equal(t, 201, c.Status, c.Raw)
	requireCode(reserve("pay-key-0002", "exec-5", "payments.charge", ""), 200, "")

	// The original call lands after a not_applied: appended, flagged, the
	// key's state unchanged; the same commit again appends nothing.
	r = reserve("pay-key-0003", "exec-6", "payments.charge", `,"lease_ms":10`)
	require.Equal(t, 201, r.Status, r.Raw)
	token := r.Body["reservation"].(string)
	clock.advance(61 * time.Second)
	na = reconcile("pay-key-0003", agent, nothing)
	require.Equal(t, 201, na.Status, na.Raw)
	late := l.Do("POST", "/v1/effects/pay-key-0003/commit", testkit.CommitBody(token, "succeeded", `,"external_ref":"ch_late"`), as(agent)...)
	require.Equal(t, 201, late.Status, late.Raw)
	assert.Equal(t, true, late.Body["late"])
	earlier, ok := late.Body["reconciled_earlier"].(map[string]any)
	require.True(t, ok, late.Raw)
	assert.Equal(t, "not_applied", earlier["outcome"])
	assert.Equal(t, float64(num(t, na.Body, "receipt", "seq")), earlier["seq"])
	k := l.Do("GET", "/v1/effects/pay-key-0003", "", as(agent)...)
	assert.Equal(t, "not_applied", k.Body["state"], "the key keeps the reconciled state")
	again := l.Do("POST", "/v1/effects/pay-key-0003/commit", testkit.CommitBody(token, "succeeded", `,"external_ref":"ch_late"`), as(agent)...)
	require.Equal(t, 200, again.Status, again.Raw)
	assert.Equal(t, late.Body["receipt"], again.Body["receipt"])
	requireCode(l.Do("POST", "/v1/effects/pay-key-0003/commit", testkit.CommitBody(token, "failed", `,"error":{"code":"X"}`), as(agent)...),
		409, "already_finalized")

	// The original call lands after a not_applied and the key's rerun
	// (its token no longer the latest): appended and flagged all the same.
	r = reserve("pay-key-0006", "exec-10", "payments.charge", `,"lease_ms":10`)
	require.Equal(t, 201, r.Status, r.Raw)
	original := r.Body["reservation"].(string)
	clock.advance(61 * time.Second)
	require.Equal(t, 201, reconcile("pay-key-0006", agent, nothing).Status)
	rerun6 := reserve("pay-key-0006", "exec-11", "payments.charge", "")
	require.Equal(t, 201, rerun6.Status, rerun6.Raw)
	late6 := l.Do("POST", "/v1/effects/pay-key-0006/commit", testkit.CommitBody(original, "succeeded", `,"external_ref":"ch_twice"`), as(agent)...)
	require.Equal(t, 201, late6.Status, "the original call's commit after a rerun: %s", late6.Raw)
	require.NotNil(t, late6.Body["reconciled_earlier"], late6.Raw)
	c = l.Do("POST", "/v1/effects/pay-key-0006/commit", testkit.CommitBody(rerun6.Body["reservation"].(string), "succeeded", `,"external_ref":"ch_44"`), as(agent)...)
	require.Equal(t, 201, c.Status, "the rerun commits as usual: %s", c.Raw)
	requireCode(l.Do("POST", "/v1/effects/pay-key-0006/commit", testkit.CommitBody("rsv_"+strings.Repeat("0", 64), "succeeded", ""), as(agent)...),
		409, "stale_reservation")

	// An admin may reconcile another actor's reserve.
	r = reserve("pay-key-0004", "exec-7", "payments.charge", `,"lease_ms":10`)
	require.Equal(t, 201, r.Status, r.Raw)
	clock.advance(20 * time.Millisecond)
	require.Equal(t, 201, reconcile("pay-key-0004", admin, found).Status)

	// ledgerd killed before the reconcile arrived: the key stays
	// interrupted, and the next try reconciles it.
	r = reserve("pay-key-0005", "exec-8", "payments.charge", `,"lease_ms":10`)
	require.Equal(t, 201, r.Status, r.Raw)
	l.Kill()
	l = clock.start(t, db)
	clock.advance(20 * time.Millisecond)
	k = l.Do("GET", "/v1/effects/pay-key-0005", "", as(agent)...)
	assert.Equal(t, "interrupted", k.Body["state"], k.Raw)
	requireCode(reserve("pay-key-0005", "exec-9", "payments.charge", ""), 409, "unsafe_resume")
	require.Equal(t, 201, reconcile("pay-key-0005", agent, found).Status)

	metrics := l.Do("GET", "/metrics", "", as(admin)...).Raw
	assert.Contains(t, metrics, `ledger_reconciliations_total{outcome="succeeded"} 1`, "counted since the restart")

	// Offline: the chain verifies; the audit lists the reconciliations
	// apart from resolutions, and the contradicted one.
	out, stderr, code := ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, "%s %s", out, stderr)
	assert.Contains(t, out, "6 reconciliations, 2 reconcile contradicted")
	out, stderr, code = ledgerctl(t, "audit", "--db", db, "--json")
	require.Equal(t, 0, code, stderr)
	var audit struct {
		Reconciliations []struct {
			Key, Tool, Outcome, Lookup, Actor string
			Seq                               uint64
		} `json:"reconciliations"`
		Contradicted []struct {
			Key               string `json:"key"`
			ReconciledOutcome string `json:"reconciled_outcome"`
			Outcome           string `json:"outcome"`
			ExternalRef       string `json:"external_ref"`
			CommitSeq         uint64 `json:"commit_seq"`
		} `json:"reconcile_contradicted"`
		Resolutions []any `json:"resolutions"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &audit), out)
	require.Len(t, audit.Reconciliations, 6, out)
	assert.Equal(t, "pay-key-0001", audit.Reconciliations[0].Key)
	assert.Equal(t, "payments.find_charge", audit.Reconciliations[0].Lookup)
	assert.Equal(t, "agent", audit.Reconciliations[0].Actor)
	assert.Equal(t, "ops", audit.Reconciliations[4].Actor)
	assert.Empty(t, audit.Resolutions, "a reconcile is not a person's resolution")
	require.Len(t, audit.Contradicted, 2, out)
	assert.Equal(t, "pay-key-0003", audit.Contradicted[0].Key)
	assert.Equal(t, "not_applied", audit.Contradicted[0].ReconciledOutcome)
	assert.Equal(t, "ch_late", audit.Contradicted[0].ExternalRef)
	out, _, _ = ledgerctl(t, "audit", "--db", db)
	assert.True(t, strings.Contains(out, "Reconciliations: interrupted keys ended from a downstream's answer (6)"), out)
	assert.Contains(t, out, "Reconcile contradicted")
}

// TestLedgerd_reconcileLateAfterRerun drives SPEC §15's late commit after
// the key's rerun through the real binaries on both drivers: an
// interrupted charge reconciled not_applied after settle_ms, reserved
// again and committed by the rerun; ledgerd restarts; the original call's
// commit with its old token is then appended (201, reconciled_earlier),
// the key's state stays the rerun's, and every verifier (offline full and
// incremental, online) is clean while the audit lists the commit as
// contradicted. A late commit that agrees with the reconcile is not
// listed; the token of a reservation taken over, never reconciled, is
// still stale.
func TestLedgerd_reconcileLateAfterRerun(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testReconcileLateAfterRerun)
}

func testReconcileLateAfterRerun(t *testing.T, db string) {
	clock := newPastClock(t)
	l := clock.start(t, db)
	admin := createToken(t, db, "ops", "admin")
	agent := createToken(t, db, "agent", "writer")
	require.Eventually(t, func() bool { return l.Do("GET", "/v1/head", "").Status == 401 },
		10*time.Second, 20*time.Millisecond, "a new first token is enforced within a second")
	as := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	reserve := func(key, exec, extra string) Resp {
		t.Helper()
		return l.Do("POST", "/v1/effects/reserve", fmt.Sprintf(`{"idempotency_key":%q,"execution_id":%q,"tool":"payments.charge",`+
			`"effect":"external","input":{"key":%q}%s}`, key, exec, key, extra), as(agent)...)
	}
	commit := func(key, token, outcome, extra string) Resp {
		t.Helper()
		return l.Do("POST", "/v1/effects/"+key+"/commit", testkit.CommitBody(token, outcome, extra), as(agent)...)
	}
	nothing := `{"outcome":"not_applied","error":{"code":"NOT_FOUND","message":"no charge under the key"},` + evidence(false) + `}`
	p := l.Do("PUT", "/v1/namespaces/default/policy", reconcilePolicy, as(admin)...)
	require.Equal(t, 200, p.Status, p.Raw)

	// interrupted → reconcile not_applied after settle_ms → rerun reserve
	// and commit; the original call's token is no longer the key's.
	interruptedThenRerun := func(key, exec, rerunExec string) (original string, reconcileSeq int64, rerun Resp) {
		t.Helper()
		r := reserve(key, exec, `,"lease_ms":10`)
		require.Equal(t, 201, r.Status, r.Raw)
		clock.advance(61 * time.Second)
		na := l.Do("POST", "/v1/effects/"+key+"/reconcile", nothing, as(agent)...)
		require.Equal(t, 201, na.Status, na.Raw)
		rerun = reserve(key, rerunExec, "")
		require.Equal(t, 201, rerun.Status, rerun.Raw)
		assert.Equal(t, num(t, na.Body, "receipt", "seq"), num(t, rerun.Body, "after_not_applied", "seq"))
		return r.Body["reservation"].(string), num(t, na.Body, "receipt", "seq"), rerun
	}
	original, reconcileSeq, rerun := interruptedThenRerun("late-key-0001", "exec-1", "exec-2")
	c := commit("late-key-0001", rerun.Body["reservation"].(string), "succeeded", `,"external_ref":"ch_rerun"`)
	require.Equal(t, 201, c.Status, c.Raw)
	// A second key: the original call lands while the rerun is in flight,
	// and agrees with the reconcile.
	original2, _, rerun2 := interruptedThenRerun("late-key-0002", "exec-3", "exec-4")
	late2 := commit("late-key-0002", original2, "not_applied", `,"error":{"code":"NOT_FOUND","message":"no charge under the key"}`)
	require.Equal(t, 201, late2.Status, late2.Raw)
	require.NotNil(t, late2.Body["reconciled_earlier"], late2.Raw)
	c = commit("late-key-0002", rerun2.Body["reservation"].(string), "succeeded", `,"external_ref":"ch_rerun2"`)
	require.Equal(t, 201, c.Status, "the rerun commits as usual: %s", c.Raw)

	// A full run pins the head before the late commit.
	state := filepath.Join(t.TempDir(), "state.json")
	out, stderr, code := ledgerctl(t, "verify", "--db", db, "--state", state)
	require.Equal(t, 0, code, "%s %s", out, stderr)

	// The reconciled token survives a restart.
	l.Kill()
	l = clock.start(t, db)
	clock.advance(time.Second)
	late := commit("late-key-0001", original, "succeeded", `,"external_ref":"ch_orig"`)
	require.Equal(t, 201, late.Status, "the original call's commit after the rerun: %s", late.Raw)
	assert.Equal(t, true, late.Body["late"])
	earlier, ok := late.Body["reconciled_earlier"].(map[string]any)
	require.True(t, ok, late.Raw)
	assert.Equal(t, "not_applied", earlier["outcome"])
	assert.Equal(t, float64(reconcileSeq), earlier["seq"])
	lateSeq := num(t, late.Body, "receipt", "seq")

	// The key's state is the rerun's: succeeded with ch_rerun, replayed.
	k := l.Do("GET", "/v1/effects/late-key-0001", "", as(agent)...)
	require.Equal(t, 200, k.Status, k.Raw)
	assert.Equal(t, "succeeded", k.Body["state"], k.Raw)
	rp := reserve("late-key-0001", "exec-9", "")
	require.Equal(t, 200, rp.Status, rp.Raw)
	assert.Equal(t, "replayed", rp.Body["status"])
	assert.Equal(t, "ch_rerun", rp.Body["external_ref"], "the rerun's outcome, not the late commit's")
	// The same late commit again appends nothing; another one is refused.
	again := commit("late-key-0001", original, "succeeded", `,"external_ref":"ch_orig"`)
	require.Equal(t, 200, again.Status, again.Raw)
	assert.Equal(t, late.Body["receipt"], again.Body["receipt"])
	other := commit("late-key-0001", original, "failed", `,"error":{"code":"X"}`)
	require.Equal(t, 409, other.Status, other.Raw)
	assert.Equal(t, "already_finalized", other.Code(), other.Raw)

	// Only a reconciled reservation's token is let through: one taken
	// over, or never issued, is stale.
	r := reserve("late-key-0003", "exec-5", `,"idempotent":true,"lease_ms":10`)
	require.Equal(t, 201, r.Status, r.Raw)
	clock.advance(time.Second)
	require.Equal(t, 201, reserve("late-key-0003", "exec-6", `,"idempotent":true`).Status, "a takeover")
	stale := commit("late-key-0003", r.Body["reservation"].(string), "succeeded", `,"external_ref":"ch_x"`)
	require.Equal(t, 409, stale.Status, stale.Raw)
	assert.Equal(t, "stale_reservation", stale.Code(), stale.Raw)
	stale = commit("late-key-0001", "rsv_"+strings.Repeat("0", 64), "succeeded", "")
	require.Equal(t, 409, stale.Status, stale.Raw)
	assert.Equal(t, "stale_reservation", stale.Code(), stale.Raw)

	// Every verifier is clean, and lists the contradicted late commit.
	type report struct {
		OK    bool `json:"ok"`
		Audit struct {
			Contradicted []struct {
				Key               string `json:"key"`
				ReconcileSeq      int64  `json:"reconcile_seq"`
				ReconciledOutcome string `json:"reconciled_outcome"`
				CommitSeq         int64  `json:"commit_seq"`
				Outcome           string `json:"outcome"`
				ExternalRef       string `json:"external_ref"`
			} `json:"reconcile_contradicted"`
		} `json:"audit"`
	}
	for _, args := range [][]string{
		{"verify", "--db", db, "--json"},
		{"verify", "--db", db, "--state", state, "--incremental", "--json"},
		{"verify", "--server", l.URL, "--token", admin, "--json"},
	} {
		out, stderr, code := ledgerctl(t, args...)
		require.Equal(t, 0, code, "%v: %s %s", args, out, stderr)
		var rep report
		require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
		assert.True(t, rep.OK, "%v: %s", args, out)
		require.Len(t, rep.Audit.Contradicted, 1, "%v: only the late commit that differs: %s", args, out)
		got := rep.Audit.Contradicted[0]
		assert.Equal(t, "late-key-0001", got.Key)
		assert.Equal(t, reconcileSeq, got.ReconcileSeq)
		assert.Equal(t, "not_applied", got.ReconciledOutcome)
		assert.Equal(t, lateSeq, got.CommitSeq)
		assert.Equal(t, "succeeded", got.Outcome)
		assert.Equal(t, "ch_orig", got.ExternalRef)
	}
	out, stderr, code = ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, "%s %s", out, stderr)
	assert.Contains(t, out, "2 reconciliations, 1 reconcile contradicted")
	out, stderr, code = ledgerctl(t, "audit", "--db", db)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "Reconcile contradicted")
	assert.Contains(t, out, "late-key-0001")
}
