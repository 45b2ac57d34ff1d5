package test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLedgerd_notApplied drives SPEC §4.1 through the real binaries: a
// commit not_applied, a rerun by another execution, an interrupted key
// resolved as not_applied with ledgerctl, an admin's correction of a
// failure (and a writer's refused one), then verify and audit offline.
func TestLedgerd_notApplied(t *testing.T) {
	t.Parallel()
	clock := newPastClock(t) // leases end for the offline verifier too
	l := clock.start(t, filepath.Join(t.TempDir(), "ledger.db"))
	admin := createToken(t, l.DB, "ops", "admin")
	writer := createToken(t, l.DB, "agent", "writer")
	require.Eventually(t, func() bool { return l.Do("GET", "/v1/head", "").Status == 401 },
		10*time.Second, 20*time.Millisecond, "a new first token is enforced within a second")
	as := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	reserve := func(key, exec string, extra string) Resp {
		t.Helper()
		return l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"`+exec+
			`","tool":"email.send","effect":"external","input":{"to":"a@b.c"}`+extra+`}`, as(writer)...)
	}
	seqOf := func(r Resp, member string) float64 {
		t.Helper()
		m, ok := r.Body[member].(map[string]any)
		require.True(t, ok, "%s: %s", member, r.Raw)
		return m["seq"].(float64)
	}

	// A commit not_applied, then a rerun by another execution.
	r := reserve("mail-key-0001", "exec-1", "")
	require.Equal(t, 201, r.Status, r.Raw)
	tok := r.Body["reservation"].(string)
	bad := l.Do("POST", "/v1/effects/mail-key-0001/commit", `{"reservation":"`+tok+
		`","outcome":"not_applied","external_ref":"msg_1","error":{"code":"INVALID_ADDRESS"}}`, as(writer)...)
	require.Equal(t, 400, bad.Status, bad.Raw)
	assert.Equal(t, "invalid_request", bad.Code())
	assert.Equal(t, "external_ref", bad.Body["error"].(map[string]any)["details"].(map[string]any)["field"])
	c := l.Do("POST", "/v1/effects/mail-key-0001/commit", `{"reservation":"`+tok+
		`","outcome":"not_applied","error":{"code":"INVALID_ADDRESS","message":"no such mailbox"}}`, as(writer)...)
	require.Equal(t, 201, c.Status, c.Raw)
	assert.Equal(t, "not_applied", c.Body["outcome"])
	k := l.Do("GET", "/v1/effects/mail-key-0001", "", as(writer)...)
	assert.Equal(t, "not_applied", k.Body["state"], k.Raw)
	r2 := reserve("mail-key-0001", "exec-2", "")
	require.Equal(t, 201, r2.Status, r2.Raw)
	assert.Equal(t, "reserved", r2.Body["status"])
	assert.Equal(t, seqOf(c, "receipt"), seqOf(r2, "after_not_applied"))
	assert.Equal(t, "INVALID_ADDRESS", r2.Body["after_not_applied"].(map[string]any)["error_code"])
	rc := l.Do("GET", fmt.Sprintf("/v1/receipts/%d", int(seqOf(r2, "receipt"))), "", as(admin)...)
	assert.Equal(t, seqOf(c, "receipt"), rc.Body["ref_seq"], "the rerun names the not_applied receipt")

	// An interrupted key resolved as not_applied with ledgerctl.
	r = reserve("mail-key-0002", "exec-3", `,"lease_ms":10`)
	require.Equal(t, 201, r.Status, r.Raw)
	clock.advance(20 * time.Millisecond)
	out, stderr, code := ledgerctl(t, "resolve", "mail-key-0002", "--server", l.URL, "--token", admin,
		"--outcome", "not_applied", "--error-code", "NOT_SENT", "--note", "nothing in the outbox")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "now not_applied")
	out, stderr, code = ledgerctl(t, "show", "mail-key-0002", "--server", l.URL, "--token", admin)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "state      not_applied")
	assert.Contains(t, out, "not_applied error=NOT_SENT")

	// An admin corrects a failure to not_applied; a writer may not.
	r = reserve("mail-key-0003", "exec-4", "")
	require.Equal(t, 201, r.Status, r.Raw)
	f := l.Do("POST", "/v1/effects/mail-key-0003/commit", `{"reservation":"`+r.Body["reservation"].(string)+
		`","outcome":"failed","error":{"code":"SMTP_ERROR"}}`, as(writer)...)
	require.Equal(t, 201, f.Status, f.Raw)
	correct := `{"outcome":"not_applied","error":{"code":"SMTP_ERROR"},"note":"the relay log shows nothing was sent"}`
	w := l.Do("POST", "/v1/effects/mail-key-0003/resolve", correct, as(writer)...)
	assert.Equal(t, 403, w.Status, w.Raw)
	assert.Equal(t, "forbidden", w.Code())
	s := l.Do("POST", "/v1/effects/mail-key-0003/resolve", `{"outcome":"succeeded","note":"sent after all"}`, as(admin)...)
	assert.Equal(t, 409, s.Status, s.Raw)
	assert.Equal(t, "not_interrupted", s.Code())
	a := l.Do("POST", "/v1/effects/mail-key-0003/resolve", correct, as(admin)...)
	require.Equal(t, 201, a.Status, a.Raw)
	assert.Equal(t, "not_applied", a.Body["state"])
	rc = l.Do("GET", fmt.Sprintf("/v1/receipts/%d", int(seqOf(a, "receipt"))), "", as(admin)...)
	assert.Equal(t, seqOf(f, "receipt"), rc.Body["ref_seq"], "the correction names the failure")
	r3 := reserve("mail-key-0003", "exec-5", "")
	require.Equal(t, 201, r3.Status, r3.Raw)
	assert.Equal(t, seqOf(a, "receipt"), seqOf(r3, "after_not_applied"))

	// Offline: the chain verifies, and the audit lists the reruns.
	out, stderr, code = ledgerctl(t, "verify", "--db", l.DB)
	require.Equal(t, 0, code, "%s %s", out, stderr)
	assert.Contains(t, out, "2 not-applied reruns")
	out, stderr, code = ledgerctl(t, "audit", "--db", l.DB, "--json")
	require.Equal(t, 0, code, stderr)
	var audit struct {
		Reruns []struct {
			Key           string `json:"key"`
			NotAppliedSeq uint64 `json:"not_applied_seq"`
			ErrorCode     string `json:"error_code"`
			Seq           uint64 `json:"seq"`
			ExecutionID   string `json:"execution_id"`
		} `json:"not_applied_reruns"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &audit), out)
	require.Len(t, audit.Reruns, 2, out)
	assert.Equal(t, "mail-key-0001", audit.Reruns[0].Key)
	assert.Equal(t, uint64(seqOf(c, "receipt")), audit.Reruns[0].NotAppliedSeq)
	assert.Equal(t, "INVALID_ADDRESS", audit.Reruns[0].ErrorCode)
	assert.Equal(t, uint64(seqOf(r2, "receipt")), audit.Reruns[0].Seq)
	assert.Equal(t, "exec-2", audit.Reruns[0].ExecutionID)
	assert.Equal(t, "mail-key-0003", audit.Reruns[1].Key)
	assert.Equal(t, "exec-5", audit.Reruns[1].ExecutionID)
	out, stderr, code = ledgerctl(t, "audit", "--db", l.DB)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "Not-applied reruns")
}
