package test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// auditPayloads is what the audit shows of payload values (SPEC §14):
// the approvers' notes and the operators' resolutions.
type auditPayloads struct {
	Approvals []struct {
		AskSeq uint64 `json:"ask_seq"`
		Answer *struct {
			Seq    uint64            `json:"seq"`
			Note   string            `json:"note"`
			Erased map[string]uint64 `json:"erased"`
		} `json:"answer"`
	} `json:"approvals"`
	Resolutions []struct {
		Key    string            `json:"key"`
		Note   string            `json:"note"`
		Erased map[string]uint64 `json:"erased"`
	} `json:"resolutions"`
}

// TestAudit_committedValues (SPEC §14): in a committed namespace the
// audit — GET /v1/audit and ledgerctl audit --db — shows an approver's
// note and an operator's resolution note as their values, never their
// commitments; once erased by key, as "" with "erased": {"note": seq},
// never the value and never a commitment.
func TestAudit_committedValues(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		clock := newPastClock(t) // the lease ended for ledgerctl too
		l := clock.start(t, db, "--default-payloads", "committed")
		r := l.Do("PUT", "/v1/namespaces/default/policy", `{"rules":[{"tool":"payments.*","approval":"required"}]}`)
		require.Equal(t, 200, r.Status, r.Raw)
		marker := randomMarker(t)
		held := "held-" + marker[:12]
		body := fmt.Sprintf(`{"idempotency_key":%q,"execution_id":"e1","tool":"payments.charge","effect":"external",
			"input":{"card":"4242"},"approval_summary":"refund %s"}`, held, marker)
		ask := l.Do("POST", "/v1/effects/reserve", body)
		require.Equal(t, 202, ask.Status, ask.Raw)
		approveNote := "approved for " + marker
		a := l.Do("POST", fmt.Sprintf("/v1/approvals/%d", num(t, ask.Body, "approval", "seq")),
			fmt.Sprintf(`{"decision":"approve","note":%q}`, approveNote))
		require.Equal(t, 201, a.Status, a.Raw)
		rr := l.Do("POST", "/v1/effects/reserve", body)
		require.Equal(t, 201, rr.Status, rr.Raw)
		l.Commit(t, held, fmt.Sprintf(`{"reservation":%q,"outcome":"succeeded","result":{"charged":%q},"external_ref":"ch_%s"}`,
			rr.Body["reservation"].(string), marker, marker))

		lost := "lost-" + marker[:12]
		r = l.Do("POST", "/v1/effects/reserve", fmt.Sprintf(`{"idempotency_key":%q,"execution_id":"e2","tool":"mail.send","effect":"external","lease_ms":10}`, lost))
		require.Equal(t, 201, r.Status, r.Raw)
		clock.advance(20 * time.Millisecond) // the lease ends: interrupted
		resolveNote := "no mail to " + marker
		r = l.Do("POST", "/v1/effects/"+lost+"/resolve", fmt.Sprintf(`{"outcome":"failed","error":{"code":"NOT_SENT","message":"bounced %s"},"note":%q}`,
			marker, resolveNote))
		require.Equal(t, 201, r.Status, r.Raw)

		audits := func() map[string]string {
			t.Helper()
			got := l.Do("GET", "/v1/audit", "")
			require.Equal(t, 200, got.Status, got.Raw)
			out, stderr, code := ledgerctl(t, "audit", "--db", db, "--json")
			require.Equal(t, 0, code, "%s%s", out, stderr)
			return map[string]string{"GET /v1/audit": got.Raw, "ledgerctl audit --db": out}
		}
		for src, raw := range audits() {
			var got auditPayloads
			require.NoError(t, json.Unmarshal([]byte(raw), &got), raw)
			assert.NotContains(t, raw, `"pc1:`, "%s shows no commitment", src)
			require.Len(t, got.Approvals, 1, src)
			require.NotNil(t, got.Approvals[0].Answer, src)
			assert.Equal(t, approveNote, got.Approvals[0].Answer.Note, src)
			assert.Nil(t, got.Approvals[0].Answer.Erased, src)
			require.Len(t, got.Resolutions, 1, src)
			assert.Equal(t, resolveNote, got.Resolutions[0].Note, src)
			assert.Nil(t, got.Resolutions[0].Erased, src)
		}

		e := l.Do("POST", "/v1/erasures", fmt.Sprintf(`{"keys":[%q,%q],"reason":"erasure request"}`, held, lost))
		require.Equal(t, 201, e.Status, e.Raw)
		eraseSeq := uint64(num(t, e.Body, "receipt", "seq"))
		for src, raw := range audits() {
			var got auditPayloads
			require.NoError(t, json.Unmarshal([]byte(raw), &got), raw)
			assert.NotContains(t, raw, marker, "%s shows no erased value", src)
			assert.NotContains(t, raw, `"pc1:`, "%s shows no commitment", src)
			require.Len(t, got.Approvals, 1, src)
			require.NotNil(t, got.Approvals[0].Answer, src)
			assert.Equal(t, "", got.Approvals[0].Answer.Note, src)
			assert.Equal(t, map[string]uint64{"note": eraseSeq}, got.Approvals[0].Answer.Erased, src)
			require.Len(t, got.Resolutions, 1, src)
			assert.Equal(t, "", got.Resolutions[0].Note, src)
			assert.Equal(t, map[string]uint64{"note": eraseSeq}, got.Resolutions[0].Erased, src)
			assert.True(t, strings.Contains(raw, `"erasures":[{`), "%s lists the erasure", src)
		}
		out, stderr, code := ledgerctl(t, "audit", "--db", db)
		require.Equal(t, 0, code, "%s%s", out, stderr)
		assert.Equal(t, 2, strings.Count(out, fmt.Sprintf("(erased by %d)", eraseSeq)), "the table marks the two notes: %s", out)
		assert.NotContains(t, out, marker)
		assert.NotContains(t, out, "pc1:")
		require.NoError(t, l.Stop())
		out, stderr, code = ledgerctl(t, "verify", "--db", db)
		require.Equal(t, 0, code, "%s%s", out, stderr)
	})
}
