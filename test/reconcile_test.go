package test

import (
	"encoding/json"
	"fmt"
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
