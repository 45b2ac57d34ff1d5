package test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestErasure_awaitingApproval (SPEC §13, §14): an erasure of a key that
// waits for its approval answers it as pending; the approver's note and
// the result of the run it then allows are erased as the key finalizes,
// are in no answer, and the verifier accepts the chain.
func TestErasure_awaitingApproval(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		l := StartLedgerd(t, db, "--default-payloads", "committed")
		r := l.Do("PUT", "/v1/namespaces/default/policy", `{"rules":[{"tool":"payments.*","approval":"required"}]}`)
		require.Equal(t, 200, r.Status, r.Raw)
		marker := randomMarker(t)
		key := "held-" + marker[:12]
		body := fmt.Sprintf(`{"idempotency_key":%q,"execution_id":"e1","tool":"payments.charge","effect":"external",
			"input":{"card":"4242"},"approval_summary":"refund %s","subjects":["person-%s"]}`, key, marker, marker)
		ask := l.Do("POST", "/v1/effects/reserve", body)
		require.Equal(t, 202, ask.Status, ask.Raw)

		e := l.Do("POST", "/v1/erasures", fmt.Sprintf(`{"subject":"person-%s","reason":"erasure request"}`, marker))
		require.Equal(t, 201, e.Status, e.Raw)
		assert.Equal(t, []any{key}, e.Body["pending"], e.Raw)

		a := l.Do("POST", fmt.Sprintf("/v1/approvals/%d", num(t, ask.Body, "approval", "seq")),
			fmt.Sprintf(`{"decision":"approve","note":"approved for %s"}`, marker))
		require.Equal(t, 201, a.Status, a.Raw)
		rr := l.Do("POST", "/v1/effects/reserve", body)
		require.Equal(t, 201, rr.Status, rr.Raw)
		c := l.Commit(t, key, fmt.Sprintf(`{"reservation":%q,"outcome":"succeeded","result":{"charged":%q},"external_ref":"ch_%s"}`,
			rr.Body["reservation"].(string), marker, marker))
		assert.NotContains(t, c.Raw, marker, "the commit's answer")

		k := l.Do("GET", "/v1/effects/"+key+"?history=true", "")
		require.Equal(t, 200, k.Status, k.Raw)
		assert.NotContains(t, k.Raw, marker, "the key's receipts")
		assert.Contains(t, k.Raw, `"erased":{`)
		all := l.Do("GET", "/v1/receipts?limit=100", "")
		require.Equal(t, 200, all.Status, all.Raw)
		assert.NotContains(t, all.Raw, marker, "the receipts")
		require.NoError(t, l.Stop())
		out, stderr, code := ledgerctl(t, "verify", "--db", db)
		require.Equal(t, 0, code, "%s%s", out, stderr)
	})
}
