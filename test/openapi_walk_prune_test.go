package test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit/openapicheck"
)

// walkPrune drives POST …/prune (SPEC §16) and the 410 pruned of the
// reads it answers: on a new ledgerd g (a test clock, a signing key, an
// archive directory, a key TTL in both namespaces) each namespace gets an
// archive policy, a few finished keys and an approved ask; once the clock
// has passed the TTL and keep_ms and a checkpoint covers the head, every
// refusal of the body, then 201, 200 nothing_to_prune and already_pruned,
// then 410 on the receipt, key, portable receipt and ask pruned. On a
// (no key TTL) a prune is 409 not_prunable.
func walkPrune(t *testing.T, a *Ledgerd, observe func(string, openapicheck.Exchange), spaces []walkNS, huge string,
	expect func(Resp, int, string)) {
	t.Helper()
	clock := newTestClock(t, t0)
	key, vkey := keygen(t, t.TempDir(), "ex.test")
	g := clock.start(t, filepath.Join(t.TempDir(), "pruned.db"), "--default-key-ttl", "1m", "--signing-key", key,
		"--log-origin", "ex.test", "--checkpoint-interval", "20ms", "--archive-dir", t.TempDir(), "--prune-interval", "0")
	observeHost(t, g.URL, observe)
	require.Equal(t, 201, g.Do("POST", "/v1/namespaces", `{"name":"walk","key_ttl_ms":60000}`).Status)
	const policy = `{"rules":[{"tool":"gate.pay","approval":"required","expires_in_ms":60000}],"self_approval":"allow",` +
		`"archive":{"keep_ms":60000,"min_keep_ms":60000}}`
	gate := `{"idempotency_key":"walk-prn-gate","execution_id":"e1","tool":"gate.pay","effect":"external","input":{"n":1}}`
	asks := map[string]int64{}
	for _, n := range spaces {
		expect(g.Do("PUT", "/v1/namespaces/"+n.name+"/policy", policy), 200, "")
		appendPairs(t, g, n.v1, "walk-prn", 3)
		r := g.Do("POST", n.v1+"/effects/reserve", gate)
		expect(r, 202, "")
		asks[n.name] = num(t, r.Body, "approval", "seq")
		expect(g.Do("POST", fmt.Sprintf("%s/approvals/%d", n.v1, asks[n.name]), `{"decision":"approve"}`), 201, "")
		r = g.Do("POST", n.v1+"/effects/reserve", gate)
		expect(r, 201, "")
		expect(g.Do("POST", n.v1+"/effects/walk-prn-gate/commit", `{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded"}`), 201, "")
	}
	clock.advance(3 * time.Minute)
	for _, n := range spaces {
		waitCheckpointNS(t, g, vkey, n.name, num(t, g.Do("GET", n.v1+"/head", "").Body, "seq"))
	}
	for _, n := range spaces {
		t.Run(n.name, func(t *testing.T) {
			for _, body := range []string{`{"through":-1}`, `{"through":0}`, `{"through":1.5}`, `{"through":"1"}`, `{"x":1}`, `[]`} {
				expect(g.Do("POST", n.v1+"/prune", body), 400, "invalid_request")
			}
			expect(g.Do("POST", n.v1+"/prune", `{`), 400, "invalid_json")
			expect(g.Do("POST", n.v1+"/prune", huge), 413, "body_too_large")
			expect(g.Do("POST", n.v1+"/prune", `{}`, "Content-Type", "text/csv"), 415, "unsupported_media_type")
			expect(a.Do("POST", n.v1+"/prune", `{}`), 409, "not_prunable") // no key TTL
			r := g.Do("POST", n.v1+"/prune", `{}`)
			expect(r, 201, "")
			assert.Equal(t, "pruned", r.Body["status"])
			expect(g.Do("POST", n.v1+"/prune", `{}`), 200, "")
			r = g.Do("POST", n.v1+"/prune", `{"through":1}`)
			expect(r, 200, "")
			assert.Equal(t, "already_pruned", r.Body["status"])
			// Once the bodies are deleted (a key pruned whole can be 404
			// while its deletion batch runs: see TestPrune_endToEnd).
			require.Eventually(t, func() bool {
				ps, _ := g.Do("GET", n.v1+"/prune", "").Body["prunes"].([]any)
				return len(ps) == 1 && ps[0].(map[string]any)["deleting"] == false
			}, 60*time.Second, 10*time.Millisecond)
			for _, path := range []string{"/receipts/1", "/receipts/1/proof", "/effects/walk-prn-0000", fmt.Sprintf("/approvals/%d", asks[n.name])} {
				expect(g.Do("GET", n.v1+path, ""), 410, "pruned")
				expect(g.Do("HEAD", n.v1+path, ""), 410, "")
			}
			r = g.Do("GET", n.v1+"/prune", "")
			expect(r, 200, "")
			assert.Len(t, r.Body["prunes"], 1, r.Raw)
			r = g.Do("GET", n.v1+"/head", "")
			expect(r, 200, "")
			assert.NotNil(t, r.Body["pruned"], r.Raw)
		})
	}
}
