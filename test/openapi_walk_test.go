package test

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit/openapicheck"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// TestOpenAPI_EveryRoute drives every operation of api/openapi.yaml
// through the real ledgerd, once for each status the document declares
// for it (except 500 and 503, which need a broken server: the disk test
// covers 503), and every error code of the contract. The checking
// transport validates each request and response against the document; the
// coverage check at the end fails for any declared status or error code
// no request produced, so a route or code added to the document needs a
// case here. The namespaced routes (SPEC §7) are driven by the same cases
// in a namespace "walk" created on every server: each case runs once in
// the default namespace through the unprefixed routes and once through
// /v1/ns/walk/… and /log/walk/….
func TestOpenAPI_EveryRoute(t *testing.T) {
	t.Parallel()
	cov := newCoverage()
	spaces := []walkNS{{name: "default", v1: "/v1", log: "/log/default"}, {name: "walk", v1: "/v1/ns/walk", log: "/log/walk"}}

	// A: open (no tokens), verifying in the background.
	// Each runs on a test clock, moved past leases and the token-existence
	// re-read instead of waiting them out.
	aClock := newPastClock(t)
	// Its namespaces keep their payloads committed (SPEC §14); B's inline.
	a := aClock.start(t, filepath.Join(t.TempDir(), "open.db"), "--verify-every", "1h", "--default-payloads", "committed")
	observeHost(t, a.URL, cov.observe)
	// B: tokens, /metrics needs a reader.
	clock := newWallClock(t)                                                                                     // B, C and D's
	b := clock.start(t, filepath.Join(t.TempDir(), "auth.db"), "--metrics-auth", "--default-payloads", "inline") // B keeps its payloads inline
	observeHost(t, b.URL, cov.observe)
	tok := map[string]string{}
	for _, role := range []string{"reader", "writer", "admin"} {
		out, stderr, code := ledgerctl(t, "token", "create", "--db", b.DB, "--role", role, "--name", "walk-"+role)
		require.Equal(t, 0, code, stderr)
		tok[role] = "Bearer " + strings.TrimSpace(out)
	}
	// C: one token, one request a millennium.
	c := clock.start(t, filepath.Join(t.TempDir(), "rate.db"), "--rate-limit", "0.000001", "--rate-burst", "1")
	observeHost(t, c.URL, cov.observe)
	// D: signs checkpoints with a key from ledgerctl keygen, public log.
	logDir := t.TempDir()
	d, vkey, _ := startSignedEnv(t, logDir, []string{clock.env()}, "--public-log")
	observeHost(t, d.URL, cov.observe)
	// The namespace "walk" on every server: through the open API on A, C
	// and D (no tokens yet), with an admin token on B.
	for _, l := range []*Ledgerd{a, c, d} {
		body := `{"name":"walk"}`
		if l == a {
			body = `{"name":"walk","payloads":"committed"}`
		}
		r := l.Do("POST", "/v1/namespaces", body)
		require.Equal(t, 201, r.Status, r.Raw)
	}
	r := b.Do("POST", "/v1/namespaces", `{"name":"walk","payloads":"inline"}`, "Authorization", tok["admin"])
	require.Equal(t, 201, r.Status, r.Raw)
	// A token of B limited to the namespace walk.
	out, stderr, code := ledgerctl(t, "token", "create", "--db", b.DB, "--role", "admin", "--name", "walk-scoped", "--namespace", "walk")
	require.Equal(t, 0, code, stderr)
	tok["scoped"] = "Bearer " + strings.TrimSpace(out)
	out, stderr, code = ledgerctl(t, "token", "create", "--db", c.DB, "--role", "admin", "--name", "walk-rate")
	require.Equal(t, 0, code, stderr)
	rateTok := "Bearer " + strings.TrimSpace(out)
	clock.advance(time.Second) // past the token-existence re-read
	require.Eventually(t, func() bool {
		return b.Do("GET", "/v1/head", "").Status == 401 && c.Do("GET", "/v1/head", "").Status == 401
	}, 60*time.Second, 5*time.Millisecond, "auth turns on once a token exists")

	expect := func(r Resp, status int, code string) {
		t.Helper()
		assert.Equal(t, status, r.Status, r.Raw)
		if code != "" {
			assert.Equal(t, code, r.Code(), r.Raw)
		}
	}
	res := func(r Resp) string { v, _ := r.Body["reservation"].(string); return v }
	rsv := func(key, exec string, attempt int, idempotent bool, extra string) string {
		return `{"idempotency_key":"` + key + `","execution_id":"` + exec + `","attempt":` + itoa(attempt) +
			`,"tool":"walk.tool","effect":"write","idempotent":` + boolStr(idempotent) + `,"input":{"n":1}` + extra + `}`
	}
	huge := `{"execution_id":"` + strings.Repeat("x", 1<<20) + `"}`

	t.Run("reserve", func(t *testing.T) {
		for _, n := range spaces {
			t.Run(n.name, func(t *testing.T) {
				r := a.Do("POST", n.v1+"/effects/reserve", rsv("walk-key-0001", "e1", 1, true, ""))
				expect(r, 201, "")
				k1 := res(r)
				expect(a.Do("POST", n.v1+"/effects/walk-key-0001/commit", `{"reservation":"`+k1+`","outcome":"succeeded","external_ref":"ref-1","result":{"ok":true}}`), 201, "")
				r = a.Do("POST", n.v1+"/effects/reserve", rsv("walk-key-0001", "e2", 1, true, ""))
				expect(r, 200, "")
				assert.Equal(t, "replayed", r.Body["status"])
				assert.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
				r = a.Do("POST", n.v1+"/effects/reserve", `{"execution_id":"e","tool":"search.web","effect":"read"}`)
				expect(r, 200, "")
				assert.Equal(t, "not_recorded", r.Body["status"])
				assert.Empty(t, r.Header.Get("Idempotent-Replayed"))

				r = a.Do("POST", n.v1+"/effects/reserve", `{"execution_id":"e","tool":"walk.tool","effect":"write"}`, "Idempotency-Key", `"walk-hdr-0001"`)
				expect(r, 201, "")
				assert.Equal(t, "walk-hdr-0001", r.Body["idempotency_key"])
				expect(a.Do("POST", n.v1+"/effects/reserve", rsv("walk-key-0002", "e", 1, false, ""), "Idempotency-Key", "walk-hdr-0002"), 400, "invalid_request")

				expect(a.Do("POST", n.v1+"/effects/reserve", `{`), 400, "invalid_json")
				expect(a.Do("POST", n.v1+"/effects/reserve", `{"execution_id":"e","effect":"write"}`), 400, "invalid_request")
				expect(a.Do("POST", n.v1+"/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","color":"red"}`), 400, "invalid_request")
				expect(a.Do("POST", n.v1+"/effects/reserve", rsv("bad key 0001", "e", 1, false, "")), 400, "invalid_key")
				expect(a.Do("POST", n.v1+"/effects/reserve", huge), 413, "body_too_large")
				expect(a.Do("POST", n.v1+"/effects/reserve", rsv("walk-key-0003", "e", 1, false, ""), "Content-Type", "text/plain"), 415, "unsupported_media_type")
				expect(a.Do("POST", n.v1+"/effects/reserve", strings.Replace(rsv("walk-key-0001", "e3", 1, true, ""), "walk.tool", "other.tool", 1)), 422, "fingerprint_mismatch")

				expect(a.Do("POST", n.v1+"/effects/reserve", rsv("walk-busy-0001", "e1", 1, true, "")), 201, "")
				r = a.Do("POST", n.v1+"/effects/reserve", rsv("walk-busy-0001", "e2", 1, true, ""))
				expect(r, 409, "in_progress")
				assert.NotEmpty(t, r.Header.Get("Retry-After"))

				expect(a.Do("POST", n.v1+"/effects/reserve", rsv("walk-intr-0001", "e1", 1, false, `,"lease_ms":10`)), 201, "")
				expect(a.Do("POST", n.v1+"/effects/reserve", rsv("walk-take-0001", "e1", 1, true, `,"lease_ms":10`)), 201, "")
				expect(a.Do("POST", n.v1+"/effects/reserve", rsv("walk-left-0001", "e1", 1, false, `,"lease_ms":10`)), 201, "") // left interrupted
				// The three leases end.
				aClock.advance(20 * time.Millisecond)
				expect(a.Do("POST", n.v1+"/effects/reserve", rsv("walk-intr-0001", "e2", 1, false, "")), 409, "unsafe_resume")
				r = a.Do("POST", n.v1+"/effects/reserve", rsv("walk-take-0001", "e2", 1, true, ""))
				expect(r, 201, "")
				assert.Equal(t, true, r.Body["takeover"])

				r = a.Do("POST", n.v1+"/effects/reserve", rsv("walk-fail-0001", "e1", 1, true, ""))
				expect(a.Do("POST", n.v1+"/effects/walk-fail-0001/commit", `{"reservation":"`+res(r)+`","outcome":"failed","error":{"code":"DENIED"}}`), 201, "")
				expect(a.Do("POST", n.v1+"/effects/reserve", rsv("walk-fail-0001", "e1", 2, true, "")), 409, "retry_not_allowed")
				r = a.Do("POST", n.v1+"/effects/reserve", rsv("walk-flaky-0001", "e1", 1, true, ""))
				expect(a.Do("POST", n.v1+"/effects/walk-flaky-0001/commit", `{"reservation":"`+res(r)+`","outcome":"failed","error":{"code":"TIMEOUT","retryable":true}}`), 201, "")
				expect(a.Do("POST", n.v1+"/effects/reserve", rsv("walk-flaky-0001", "e1", 1, true, "")), 409, "attempt_conflict")
				r = a.Do("POST", n.v1+"/effects/reserve", rsv("walk-flaky-0001", "e1", 2, true, ""))
				expect(r, 201, "")
				assert.Equal(t, true, r.Body["retry"])
			})
		}
	})

	t.Run("reserve/wait_ms", func(t *testing.T) {
		for _, n := range spaces {
			t.Run(n.name, func(t *testing.T) {
				r := a.Do("POST", n.v1+"/effects/reserve", rsv("walk-wait-0001", "e1", 1, true, ""))
				expect(r, 201, "")
				token := res(r)
				waiting := asyncPost(a.URL+n.v1+"/effects/reserve", rsv("walk-wait-0001", "e2", 1, true, `,"wait_ms":10000`))
				require.Eventually(t, func() bool { return a.metric("ledger_reserve_waiting") == 1 }, 60*time.Second, 5*time.Millisecond,
					"the second reserve waits")
				start := time.Now()
				expect(a.Do("POST", n.v1+"/effects/walk-wait-0001/commit", `{"reservation":"`+token+`","outcome":"succeeded"}`), 201, "")
				w := <-waiting
				require.NoError(t, w.err)
				r = Resp{Status: w.status, Body: map[string]any{}, Raw: string(w.body)}
				require.NoError(t, json.Unmarshal(w.body, &r.Body), "%s", w.body)
				expect(r, 200, "")
				assert.Equal(t, "replayed", r.Body["status"], "woken by the commit")
				assert.Less(t, time.Since(start), 5*time.Second)

				expect(a.Do("POST", n.v1+"/effects/reserve", rsv("walk-wait-0002", "e1", 1, true, "")), 201, "")
				r = a.Do("POST", n.v1+"/effects/reserve", rsv("walk-wait-0002", "e2", 1, true, `,"wait_ms":100`))
				expect(r, 409, "in_progress")
				expect(a.Do("POST", n.v1+"/effects/reserve", rsv("walk-wait-0003", "e1", 1, true, `,"wait_ms":60001`)), 400, "invalid_request")
			})
		}
	})

	t.Run("commit", func(t *testing.T) {
		for _, n := range spaces {
			t.Run(n.name, func(t *testing.T) {
				r := a.Do("POST", n.v1+"/effects/reserve", rsv("walk-cmt-0001", "e1", 1, true, ""))
				body := `{"reservation":"` + res(r) + `","outcome":"succeeded","external_ref":"ch_1","result":{"a":[1,2]}}`
				expect(a.Do("POST", n.v1+"/effects/walk-cmt-0001/commit", body), 201, "")
				r = a.Do("POST", n.v1+"/effects/walk-cmt-0001/commit", body)
				expect(r, 200, "")
				assert.Equal(t, "true", r.Header.Get("Idempotent-Replayed"))
				expect(a.Do("POST", n.v1+"/effects/walk-cmt-0001/commit", strings.Replace(body, "ch_1", "ch_2", 1)), 409, "already_finalized")
				stale := "rsv_" + strings.Repeat("0", 64) // well-formed, never issued
				expect(a.Do("POST", n.v1+"/effects/walk-busy-0001/commit", `{"reservation":"`+stale+`","outcome":"succeeded"}`), 409, "stale_reservation")
				expect(a.Do("POST", n.v1+"/effects/walk-busy-0001/commit", `{"reservation":"rsv_stale","outcome":"succeeded"}`), 400, "invalid_request")
				expect(a.Do("POST", n.v1+"/effects/walk-none-0001/commit", `{"reservation":"rsv_x","outcome":"succeeded"}`), 404, "unknown_key")
				expect(a.Do("POST", n.v1+"/effects/bad%20key-0001/commit", `{"reservation":"rsv_x","outcome":"succeeded"}`), 400, "invalid_key")
				expect(a.Do("POST", n.v1+"/effects/walk-cmt-0001/commit", `{"reservation":"rsv_x","outcome":"maybe"}`), 400, "invalid_request")
				expect(a.Do("POST", n.v1+"/effects/walk-cmt-0001/commit", `{"reservation":"rsv_x"} trailing`), 400, "invalid_json")
				expect(a.Do("POST", n.v1+"/effects/walk-cmt-0001/commit", huge), 413, "body_too_large")
				expect(a.Do("POST", n.v1+"/effects/walk-cmt-0001/commit", body, "Content-Type", "application/xml"), 415, "unsupported_media_type")
			})
		}
	})

	t.Run("resolve", func(t *testing.T) {
		for _, n := range spaces {
			t.Run(n.name, func(t *testing.T) {
				resolve := `{"outcome":"failed","error":{"code":"NOT_SENT","message":"checked"},"note":"checked the provider"}`
				r := a.Do("POST", n.v1+"/effects/walk-intr-0001/resolve", resolve)
				expect(r, 201, "")
				assert.Equal(t, "failed", r.Body["state"])
				expect(a.Do("POST", n.v1+"/effects/walk-intr-0001/resolve", resolve), 409, "not_interrupted")
				expect(a.Do("POST", n.v1+"/effects/walk-none-0001/resolve", resolve), 404, "unknown_key")
				expect(a.Do("POST", n.v1+"/effects/walk-key-0001/resolve", `{"outcome":"succeeded"}`), 400, "invalid_request")
				expect(a.Do("POST", n.v1+"/effects/walk-key-0001/resolve", huge), 413, "body_too_large")
				expect(a.Do("POST", n.v1+"/effects/walk-key-0001/resolve", resolve, "Content-Type", "text/csv"), 415, "unsupported_media_type")
			})
		}
	})

	t.Run("read", func(t *testing.T) {
		for _, n := range spaces {
			t.Run(n.name, func(t *testing.T) {
				r := a.Do("GET", n.v1+"/effects/walk-key-0001", "")
				expect(r, 200, "")
				assert.Equal(t, "succeeded", r.Body["state"])
				expect(a.Do("HEAD", n.v1+"/effects/walk-key-0001", ""), 200, "")
				expect(a.Do("GET", n.v1+"/effects/walk-none-0001", ""), 404, "unknown_key")
				expect(a.Do("GET", n.v1+"/effects/bad%20key-0001", ""), 400, "invalid_key")

				r = a.Do("GET", n.v1+"/receipts?after=1&limit=2&tool=walk.tool", "")
				expect(r, 200, "")
				assert.NotNil(t, r.Body["next_after"])
				r = a.Do("GET", n.v1+"/receipts?key=walk-key-0001&kind=replay&execution_id=e2", "")
				expect(r, 200, "")
				assert.Nil(t, r.Body["next_after"])
				expect(a.Do("HEAD", n.v1+"/receipts", ""), 200, "")
				expect(a.Do("GET", n.v1+"/receipts?limit=5000", ""), 400, "invalid_request")
				expect(a.Do("GET", n.v1+"/receipts?after=-1", ""), 400, "invalid_request")
				expect(a.Do("GET", n.v1+"/receipts?color=red", ""), 400, "invalid_request")

				expect(a.Do("GET", n.v1+"/receipts/1", ""), 200, "")
				expect(a.Do("HEAD", n.v1+"/receipts/1", ""), 200, "")
				expect(a.Do("GET", n.v1+"/receipts/999999", ""), 404, "unknown_receipt")
				expect(a.Do("GET", n.v1+"/receipts/abc", ""), 404, "unknown_receipt")

				expect(a.Do("GET", n.v1+"/head", ""), 200, "")
				expect(a.Do("HEAD", n.v1+"/head", ""), 200, "")

				r = a.Do("GET", n.v1+"/mcp/state-key", "")
				expect(r, 200, "")
				assert.Len(t, r.Body["key"], 64)
				assert.Equal(t, r.Body["key"], a.Do("GET", n.v1+"/mcp/state-key", "").Body["key"], "the same key each time")
				r = a.Do("GET", n.v1+"/derivation-key", "")
				expect(r, 200, "")
				assert.Len(t, r.Body["key"], 64)
				assert.Equal(t, "committed", r.Body["payloads"])

				r = a.Do("GET", n.v1+"/audit", "")
				expect(r, 200, "")
				assert.Equal(t, "0", r.Header.Get("Ledger-Violations"))
				for _, member := range []string{"runtime_retries", "re_invocations", "duplicate_effects", "repeated_failures", "interrupted", "failed", "resolutions"} {
					assert.NotEmpty(t, r.Body[member], "the walk produced %s", member)
				}
				expect(a.Do("GET", n.v1+"/audit?since=10&tool=walk.tool", ""), 200, "")
				expect(a.Do("GET", n.v1+"/audit?since=24h", ""), 200, "")
				expect(a.Do("HEAD", n.v1+"/audit", ""), 200, "")
				expect(a.Do("GET", n.v1+"/audit?since=yesterday", ""), 400, "invalid_request")
				expect(a.Do("GET", n.v1+"/audit?color=red", ""), 400, "invalid_request")
			})
		}

		require.Eventually(t, func() bool {
			r := a.Do("GET", "/v1/verification", "")
			return r.Status == 200 && r.Body["ran"] == true
		}, 60*time.Second, 50*time.Millisecond, "the first periodic run finishes")
		r := a.Do("GET", "/v1/verification", "")
		assert.Equal(t, true, r.Body["enabled"])
		assert.Equal(t, true, r.Body["ok"], r.Raw)
		expect(b.Do("GET", "/v1/verification", "", "Authorization", tok["reader"]), 200, "") // off: enabled false
		expect(a.Do("HEAD", "/v1/verification", ""), 200, "")
	})

	t.Run("log", func(t *testing.T) {
		for _, n := range spaces {
			t.Run(n.name, func(t *testing.T) {
				// A signs nothing: no checkpoint, nothing to prove against.
				expect(a.Do("GET", n.log+"/checkpoint", ""), 404, "not_checkpointed")
				expect(a.Do("HEAD", n.log+"/checkpoint", ""), 404, "")
				expect(a.Do("GET", n.v1+"/receipts/1/proof", ""), 404, "not_checkpointed")
				expect(a.Do("GET", n.v1+"/proof/inclusion?seq=1", ""), 400, "invalid_request")
				expect(a.Do("GET", n.v1+"/proof/consistency?from=0", ""), 400, "invalid_request")

				// D: a checkpoint of one leaf, then one of 257 (a full tile and a
				// partial one at each level it reaches).
				appendNS(t, d, n.v1, "walk-log", 1)
				_, c1 := waitCheckpointNS(t, d, vkey, n.name, 1)
				require.Equal(t, int64(1), c1.Size)
				appendNS(t, d, n.v1, "walk-logb", 256)
				note, c2 := waitCheckpointNS(t, d, vkey, n.name, 257)
				require.Equal(t, int64(257), c2.Size)

				r := d.Do("GET", n.log+"/checkpoint", "")
				expect(r, 200, "")
				assert.Equal(t, note, r.Raw)
				assert.Equal(t, "no-cache", r.Header.Get("Cache-Control"))
				expect(d.Do("HEAD", n.log+"/checkpoint", ""), 200, "")
				for _, tile := range []struct {
					path string
					size int
					full bool
				}{
					{"tile/0/000", 256 * 32, true},
					{"tile/0/001.p/1", 32, false},
					{"tile/1/000.p/1", 32, false},
					{"tile/entries/000", 256 * 34, true},
					{"tile/entries/001.p/1", 34, false},
				} {
					r := d.Do("GET", n.log+"/"+tile.path, "")
					expect(r, 200, "")
					assert.Len(t, r.Raw, tile.size, tile.path)
					assert.Equal(t, "application/octet-stream", r.Header.Get("Content-Type"), tile.path)
					if tile.full {
						assert.Equal(t, "public, max-age=31536000, immutable", r.Header.Get("Cache-Control"), tile.path)
					} else {
						assert.Equal(t, "no-cache", r.Header.Get("Cache-Control"), tile.path)
					}
					expect(d.Do("HEAD", n.log+"/"+tile.path, ""), 200, "")
				}
				for _, path := range []string{"tile/0/002", "tile/0/001.p/2", "tile/0/001", "tile/9/000", "tile/0/abc", "tile/entries/x001/000"} {
					expect(d.Do("GET", n.log+"/"+path, ""), 404, "not_found")
				}
				expect(d.Do("HEAD", n.log+"/tile/0/002", ""), 404, "")

				r = d.Do("GET", n.v1+"/proof/inclusion?seq=1", "")
				expect(r, 200, "")
				assert.Equal(t, float64(257), r.Body["tree_size"])
				assert.Len(t, r.Body["hashes"], 9)
				r = d.Do("GET", n.v1+"/proof/inclusion?seq=1&size=1", "")
				expect(r, 200, "")
				assert.Equal(t, []any{}, r.Body["hashes"], "a tree of one leaf")
				expect(d.Do("HEAD", n.v1+"/proof/inclusion?seq=257&size=257", ""), 200, "")
				expect(d.Do("GET", n.v1+"/proof/inclusion?seq=258", ""), 404, "unknown_receipt")
				for _, q := range []string{"", "?seq=0", "?seq=x", "?seq=1&seq=2", "?seq=1&size=0", "?seq=1&size=258", "?seq=257&size=1"} {
					expect(d.Do("GET", n.v1+"/proof/inclusion"+q, ""), 400, "invalid_request")
				}

				r = d.Do("GET", n.v1+"/proof/consistency?from=1&to=257", "")
				expect(r, 200, "")
				assert.Equal(t, hex.EncodeToString(c1.Root[:]), r.Body["root_from"])
				assert.NotEmpty(t, r.Body["hashes"])
				r = d.Do("GET", n.v1+"/proof/consistency?from=0", "")
				expect(r, 200, "")
				assert.Equal(t, []any{}, r.Body["hashes"], "from the empty tree")
				expect(d.Do("HEAD", n.v1+"/proof/consistency?from=257", ""), 200, "")
				for _, q := range []string{"", "?from=-1", "?from=258", "?from=1&to=0", "?from=1&to=258"} {
					expect(d.Do("GET", n.v1+"/proof/consistency"+q, ""), 400, "invalid_request")
				}

				r = d.Do("GET", n.v1+"/receipts/1/proof", "")
				expect(r, 200, "")
				assert.Equal(t, note, r.Body["checkpoint"], "against the latest checkpoint")
				file := filepath.Join(logDir, "receipt-1-"+n.name+".json")
				require.NoError(t, os.WriteFile(file, []byte(r.Raw), 0o600))
				out, stderr, code := ledgerctl(t, "check-proof", file, "--vkey", vkey, "--namespace", n.name)
				assert.Equal(t, 0, code, "the portable receipt the document describes verifies offline: %s", stderr)
				assert.Contains(t, out, "ex.test/"+n.name, "the origin names the namespace")
				expect(d.Do("HEAD", n.v1+"/receipts/257/proof", ""), 200, "")
				expect(d.Do("GET", n.v1+"/receipts/258/proof", ""), 404, "unknown_receipt")
				expect(d.Do("GET", n.v1+"/receipts/0/proof", ""), 404, "unknown_receipt")
				expect(d.Do("GET", n.v1+"/receipts/abc/proof", ""), 404, "unknown_receipt")
				expect(d.Do("GET", n.v1+"/receipts/1/proof?erased_by=true", ""), 200, "") // nothing erased: no erased_by
				expect(d.Do("GET", n.v1+"/receipts/1/proof?erased_by=maybe", ""), 400, "invalid_request")
				expect(d.Do("GET", n.v1+"/receipts/1/proof?size=1", ""), 400, "invalid_request")

				for _, path := range []string{n.log + "/checkpoint", n.log + "/tile/0/000", n.v1 + "/proof/inclusion", n.v1 + "/proof/consistency", n.v1 + "/receipts/1/proof"} {
					r := d.Do("POST", path, "")
					expect(r, 405, "method_not_allowed")
					assert.Equal(t, "GET, HEAD", r.Header.Get("Allow"), path)
				}
			})
		}

		// Tokens exist: --public-log keeps the checkpoint and tiles open;
		// the JSON proofs still need a reader.
		out, stderr, code := ledgerctl(t, "token", "create", "--db", d.DB, "--role", "reader", "--name", "walk-log")
		require.Equal(t, 0, code, stderr)
		reader := "Bearer " + strings.TrimSpace(out)
		clock.advance(time.Second) // past the token-existence re-read
		require.Eventually(t, func() bool { return d.Do("GET", "/v1/head", "").Status == 401 }, 60*time.Second, 5*time.Millisecond)
		for _, n := range spaces {
			expect(d.Do("GET", n.log+"/checkpoint", ""), 200, "")
			expect(d.Do("GET", n.log+"/tile/0/000", ""), 200, "")
			for _, path := range []string{"/proof/inclusion?seq=1", "/proof/consistency?from=0", "/receipts/1/proof"} {
				expect(d.Do("GET", n.v1+path, ""), 401, "unauthorized")
				expect(d.Do("GET", n.v1+path, "", "Authorization", reader), 200, "")
			}
			// erased_by discloses which receipts were erased together: admins only.
			expect(d.Do("GET", n.v1+"/receipts/1/proof?erased_by=true", "", "Authorization", reader), 403, "forbidden")
		}
	})

	t.Run("operations", func(t *testing.T) {
		r := a.Do("GET", "/v1/openapi.json", "")
		expect(r, 200, "")
		assert.Equal(t, "3.1.0", r.Body["openapi"])
		etag := r.Header.Get("ETag")
		require.NotEmpty(t, etag)
		expect(a.Do("GET", "/v1/openapi.json", "", "If-None-Match", etag), 304, "")
		expect(a.Do("HEAD", "/v1/openapi.json", ""), 200, "")
		expect(b.Do("GET", "/v1/openapi.json", ""), 200, "") // public even with tokens

		expect(a.Do("GET", "/healthz", ""), 200, "")
		expect(a.Do("HEAD", "/healthz", ""), 200, "")
		expect(a.Do("GET", "/readyz", ""), 200, "")
		expect(a.Do("HEAD", "/readyz", ""), 200, "")
		expect(a.Do("GET", "/metrics", ""), 200, "")
		expect(a.Do("HEAD", "/metrics", ""), 200, "")
		r = a.Do("GET", "/ui/", "")
		expect(r, 200, "")
		assert.True(t, strings.HasPrefix(r.Header.Get("Content-Type"), "text/html"), r.Header.Get("Content-Type"))
		expect(a.Do("GET", "/ui/", "", "If-None-Match", r.Header.Get("ETag")), 304, "")
		expect(a.Do("HEAD", "/ui/", ""), 200, "")
		r = a.Do("GET", "/ui", "") // the client follows the 301; both legs are checked
		expect(r, 200, "")
		expect(a.Do("HEAD", "/ui", ""), 200, "")
		for _, f := range []string{"style.css", "app.js", "favicon.svg", "index.html"} {
			r = a.Do("GET", "/ui/"+f, "")
			expect(r, 200, "")
			expect(a.Do("GET", "/ui/"+f, "", "If-None-Match", r.Header.Get("ETag")), 304, "")
			expect(a.Do("HEAD", "/ui/"+f, ""), 200, "")
		}
		expect(a.Do("GET", "/ui/no-such-file.txt", ""), 404, "not_found")

		expect(a.Do("GET", "/v1/head", "", "X-Padding", strings.Repeat("p", 100<<10)), 431, "headers_too_large")
		x := rawExchange(t, a, "POST", "/v1/effects/reserve", "Transfer-Encoding: gzip\r\nContent-Type: application/json\r\n")
		assert.Equal(t, 501, x.Resp.StatusCode, "%s", x.RespBody)
		op, err := openAPIDoc.Check(context.Background(), x)
		assert.NoError(t, err)
		cov.observe(op, x)

		expect(a.Do("GET", "/v2/anything", ""), 404, "not_found")
		expect(a.Do("GET", "/v1/effects/a/b/c", ""), 404, "not_found")
		for _, m := range []struct{ method, path, allow string }{
			{"GET", "/v1/effects/reserve", "POST"},
			{"DELETE", "/v1/head", "GET, HEAD"},
			{"PUT", "/v1/effects/walk-key-0001/commit", "POST"},
			{"POST", "/v1/effects/walk-key-0001", "GET, HEAD"},
			{"POST", "/v1/openapi.json", "GET, HEAD"},
			{"GET", "/v1/ns/walk/effects/reserve", "POST"},
			{"DELETE", "/v1/ns/walk/head", "GET, HEAD"},
			{"PUT", "/v1/ns/walk/effects/walk-key-0001/commit", "POST"},
			{"POST", "/v1/ns/walk/effects/walk-key-0001", "GET, HEAD"},
			{"PUT", "/v1/namespaces", "GET, HEAD, POST"},
			{"DELETE", "/log/walk/checkpoint", "GET, HEAD"},
		} {
			r := a.Do(m.method, m.path, "")
			expect(r, 405, "method_not_allowed")
			assert.Equal(t, m.allow, r.Header.Get("Allow"), "%s %s", m.method, m.path)
		}
	})

	t.Run("auth", func(t *testing.T) {
		for _, n := range spaces {
			t.Run(n.name, func(t *testing.T) {
				reserveBody := rsv("walk-auth-0001", "e1", 1, true, "")
				r := b.Do("POST", n.v1+"/effects/reserve", reserveBody, "Authorization", tok["writer"])
				expect(r, 201, "")
				ops := []struct {
					method, path, body, wrongRole string
				}{
					{"POST", n.v1 + "/effects/reserve", reserveBody, "reader"},
					{"POST", n.v1 + "/effects/walk-auth-0001/commit", `{"reservation":"` + res(r) + `","outcome":"succeeded"}`, "reader"},
					{"POST", n.v1 + "/effects/walk-auth-0001/resolve", `{"outcome":"succeeded","note":"n"}`, "writer"},
					{"POST", n.v1 + "/effects/walk-auth-0001/reconcile", walkReconciled, "reader"},
					{"GET", n.v1 + "/effects/walk-auth-0001", "", ""}, // a writer reads its keys
					{"GET", n.v1 + "/receipts", "", "writer"},
					{"GET", n.v1 + "/receipts/1", "", "writer"},
					{"GET", n.v1 + "/head", "", ""}, // and the head
					{"GET", n.v1 + "/mcp/state-key", "", "reader"},
					{"GET", n.v1 + "/derivation-key", "", "reader"},
					{"POST", n.v1 + "/erasures", `{"keys":["walk-auth-0001"]}`, "writer"},
					{"GET", n.v1 + "/erasures/1", "", ""},
					{"GET", n.v1 + "/erasures", "", "reader"}, // an admin's: which receipts went together
					{"GET", n.v1 + "/prune", "", "reader"},    // an admin's: it scans the chain
					{"POST", n.v1 + "/prune", `{}`, "writer"},
					{"POST", n.v1 + "/signing-keys", `{"vkey":"x"}`, "writer"},
					{"GET", n.v1 + "/signing-keys", "", "writer"},
					{"GET", n.v1 + "/audit", "", "writer"},
					{"GET", n.log + "/checkpoint", "", "writer"}, // without --public-log
					{"GET", n.log + "/tile/0/000", "", "writer"},
					{"GET", n.v1 + "/proof/inclusion?seq=1", "", "writer"},
					{"GET", n.v1 + "/proof/consistency?from=0", "", "writer"},
					{"GET", n.v1 + "/receipts/1/proof", "", "writer"},
				}
				if n.name == "default" {
					ops = append(ops, []struct{ method, path, body, wrongRole string }{
						{"GET", "/metrics", "", "writer"},
						{"GET", "/v1/verification", "", "writer"},
					}...)
				}
				for _, op := range ops {
					r := b.Do(op.method, op.path, op.body)
					expect(r, 401, "unauthorized")
					assert.True(t, strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Bearer"), "%s %s", op.method, op.path)
					expect(b.Do(op.method, op.path, op.body, "Authorization", "Bearer elt_wrong"), 401, "unauthorized")
					if op.wrongRole != "" {
						expect(b.Do(op.method, op.path, op.body, "Authorization", tok[op.wrongRole]), 403, "forbidden")
					}
				}
				expect(b.Do("POST", n.v1+"/effects/walk-auth-0001/commit", `{"reservation":"`+res(r)+`","outcome":"succeeded"}`, "Authorization", tok["writer"]), 201, "")
				expect(b.Do("GET", n.v1+"/effects/walk-auth-0001", "", "Authorization", tok["reader"]), 200, "")
				expect(b.Do("GET", n.v1+"/effects/walk-auth-0001", "", "Authorization", tok["writer"]), 200, "")
				expect(b.Do("GET", n.v1+"/head", "", "Authorization", tok["writer"]), 200, "")
				expect(b.Do("GET", n.v1+"/head", "", "Authorization", tok["admin"]), 200, "")
				kw := b.Do("GET", n.v1+"/mcp/state-key", "", "Authorization", tok["writer"])
				expect(kw, 200, "")
				ka := b.Do("GET", n.v1+"/mcp/state-key", "", "Authorization", tok["admin"])
				expect(ka, 200, "")
				assert.NotEqual(t, kw.Body["key"], ka.Body["key"], "each token its own key")
				dw := b.Do("GET", n.v1+"/derivation-key", "", "Authorization", tok["writer"])
				expect(dw, 200, "")
				assert.Equal(t, dw.Body["key"], b.Do("GET", n.v1+"/derivation-key", "", "Authorization", tok["admin"]).Body["key"],
					"one key per namespace, whoever asks")
			})
		}
		expect(b.Do("GET", "/metrics", "", "Authorization", tok["reader"]), 200, "")
		expect(b.Do("GET", "/healthz", ""), 200, "")
		expect(b.Do("GET", "/readyz", ""), 200, "")
	})

	t.Run("namespaces", func(t *testing.T) {
		r := a.Do("POST", "/v1/namespaces", `{"name":"walk-b.2_x"}`)
		expect(r, 201, "")
		assert.Equal(t, "walk-b.2_x", r.Body["name"])
		assert.Equal(t, map[string]any{"seq": float64(0), "hash": strings.Repeat("0", 64)}, r.Body["head"], "a new chain")
		expect(a.Do("POST", "/v1/namespaces", `{"name":"walk"}`), 409, "namespace_exists")
		expect(a.Do("POST", "/v1/namespaces", `{"name":"default"}`), 409, "namespace_exists")
		// E: holds one namespace at most, so the default fills it.
		e := StartLedgerd(t, filepath.Join(t.TempDir(), "full.db"), "--max-namespaces", "1")
		observeHost(t, e.URL, cov.observe)
		expect(e.Do("POST", "/v1/namespaces", `{"name":"one-more"}`), 507, "namespace_limit")
		for _, bad := range []string{`{"name":"A!"}`, `{"name":""}`, `{"name":"` + strings.Repeat("a", 65) + `"}`,
			`{"name":"a/b"}`, `{}`, `{"name":1}`, `{"name":"x","color":"red"}`} {
			expect(a.Do("POST", "/v1/namespaces", bad), 400, "invalid_request")
		}
		expect(a.Do("POST", "/v1/namespaces", `{"name":"walk"} trailing`), 400, "invalid_json")
		expect(a.Do("POST", "/v1/namespaces", huge), 413, "body_too_large")
		expect(a.Do("POST", "/v1/namespaces", `{"name":"x"}`, "Content-Type", "text/plain"), 415, "unsupported_media_type")
		r = a.Do("GET", "/v1/namespaces", "")
		expect(r, 200, "")
		heads := map[string]float64{}
		for _, v := range r.Body["namespaces"].([]any) {
			ns := v.(map[string]any)
			heads[ns["name"].(string)] = ns["head"].(map[string]any)["seq"].(float64)
		}
		assert.Equal(t, []string{"default", "walk", "walk-b.2_x"}, slices.Sorted(maps.Keys(heads)))
		assert.Equal(t, heads["default"], heads["walk"], "the same walk in two namespaces: two chains of the same length")
		assert.Positive(t, heads["walk"])
		assert.Zero(t, heads["walk-b.2_x"])
		expect(a.Do("HEAD", "/v1/namespaces", ""), 200, "")

		// An unknown namespace is 404 and a name outside the alphabet 400
		// on every namespaced route, before anything else is looked at.
		bad := []string{"Bad!", strings.Repeat("a", 65), "a%2Fb"}
		for _, op := range nsRoutes {
			expect(a.Do(op.method, "/v1/ns/nope"+op.path, op.body), 404, "unknown_namespace")
			for _, name := range bad {
				expect(a.Do(op.method, "/v1/ns/"+name+op.path, op.body), 400, "invalid_request")
			}
			if op.method == "GET" {
				expect(a.Do("HEAD", "/v1/ns/nope"+op.path, ""), 404, "")
				expect(a.Do("HEAD", "/v1/ns/Bad!"+op.path, ""), 400, "")
			}
		}
		for _, path := range []string{"/checkpoint", "/tile/0/000"} {
			expect(a.Do("GET", "/log/nope"+path, ""), 404, "unknown_namespace")
			expect(a.Do("HEAD", "/log/nope"+path, ""), 404, "")
			for _, name := range bad {
				expect(a.Do("GET", "/log/"+name+path, ""), 400, "invalid_request")
			}
		}
		expect(a.Do("GET", "/v1/ns//head", ""), 404, "not_found")
		expect(a.Do("GET", "/v1/ns/nope/mcp/state-key", ""), 404, "unknown_namespace")
		expect(a.Do("GET", "/v1/ns/nope/derivation-key", ""), 404, "unknown_namespace")
		for _, name := range bad {
			expect(a.Do("GET", "/v1/ns/"+name+"/mcp/state-key", ""), 400, "invalid_request")
			expect(a.Do("GET", "/v1/ns/"+name+"/derivation-key", ""), 400, "invalid_request")
		}

		// B has tokens: creating needs an admin, listing a reader.
		expect(b.Do("POST", "/v1/namespaces", `{"name":"walk-b"}`), 401, "unauthorized")
		expect(b.Do("POST", "/v1/namespaces", `{"name":"walk-b"}`, "Authorization", tok["reader"]), 403, "forbidden")
		expect(b.Do("POST", "/v1/namespaces", `{"name":"walk-b"}`, "Authorization", tok["writer"]), 403, "forbidden")
		expect(b.Do("GET", "/v1/namespaces", ""), 401, "unauthorized")
		expect(b.Do("GET", "/v1/namespaces", "", "Authorization", tok["writer"]), 403, "forbidden")
		list := func(token string) []string {
			r := b.Do("GET", "/v1/namespaces", "", "Authorization", token)
			expect(r, 200, "")
			var names []string
			for _, v := range r.Body["namespaces"].([]any) {
				names = append(names, v.(map[string]any)["name"].(string))
			}
			return names
		}
		assert.Equal(t, []string{"default", "walk"}, list(tok["reader"]))
		assert.Equal(t, []string{"walk"}, list(tok["scoped"]), "a token limited to namespaces sees only those")

		// The token limited to walk: 403 on every other namespace, existing
		// or not, through either route form, decided before any lookup.
		expect(b.Do("GET", "/v1/ns/walk/head", "", "Authorization", tok["scoped"]), 200, "")
		expect(b.Do("GET", "/v1/ns/walk/effects/walk-none-0001", "", "Authorization", tok["scoped"]), 404, "unknown_key")
		for _, op := range nsRoutes {
			for _, prefix := range []string{"/v1", "/v1/ns/default", "/v1/ns/nope"} {
				r := b.Do(op.method, prefix+op.path, op.body, "Authorization", tok["scoped"])
				expect(r, 403, "forbidden")
				if strings.Contains(op.path, "walk-auth-0001") {
					other := b.Do(op.method, prefix+strings.ReplaceAll(op.path, "walk-auth-0001", "walk-none-0001"), op.body, "Authorization", tok["scoped"])
					assert.Equal(t, r.Raw, other.Raw, "the same answer for a key that exists and one that does not")
				}
			}
			existing := b.Do(op.method, "/v1/ns/default"+op.path, op.body, "Authorization", tok["scoped"])
			missing := b.Do(op.method, "/v1/ns/nope"+op.path, op.body, "Authorization", tok["scoped"])
			assert.Equal(t, existing.Raw, strings.ReplaceAll(missing.Raw, "nope", "default"),
				"the same answer for a namespace that exists and one that does not")
		}
		for _, path := range []string{"/log/default/checkpoint", "/log/nope/checkpoint", "/log/default/tile/0/000"} {
			expect(b.Do("GET", path, "", "Authorization", tok["scoped"]), 403, "forbidden")
		}
		expect(b.Do("GET", "/log/Bad!/checkpoint", "", "Authorization", tok["scoped"]), 400, "invalid_request")
		expect(b.Do("GET", "/v1/ns/walk/mcp/state-key", "", "Authorization", tok["scoped"]), 200, "")
		for _, path := range []string{"/v1/mcp/state-key", "/v1/ns/default/mcp/state-key", "/v1/ns/nope/mcp/state-key"} {
			expect(b.Do("GET", path, "", "Authorization", tok["scoped"]), 403, "forbidden")
		}
	})

	t.Run("reconcile", func(t *testing.T) {
		walkReconcile(t, a, aClock, spaces, huge, expect)
	})

	t.Run("erasures", func(t *testing.T) {
		walkErase(t, a, b, tok, spaces, huge, expect)
	})

	t.Run("prune status", func(t *testing.T) {
		// F: the default namespace has a key TTL, so it can prune (SPEC §16).
		f := StartLedgerd(t, filepath.Join(t.TempDir(), "aged.db"), "--default-key-ttl", "24h")
		observeHost(t, f.URL, cov.observe)
		for _, path := range []string{"/v1/prune", "/v1/ns/default/prune"} {
			r := f.Do("GET", path, "")
			expect(r, 200, "")
			assert.Nil(t, r.Body["archive"], path)
			assert.NotNil(t, r.Body["watermark"], path)
			expect(f.Do("HEAD", path, ""), 200, "")
		}
		for _, n := range spaces {
			expect(a.Do("GET", n.v1+"/prune", ""), 409, "not_prunable") // no key TTL
		}
		// F has no --archive-dir: a prune is refused even with a policy.
		expect(f.Do("PUT", "/v1/namespaces/default/policy", `{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`), 200, "")
		r := f.Do("POST", "/v1/prune", `{}`)
		expect(r, 409, "not_prunable")
		assert.Equal(t, "no_archive_dir", r.Body["error"].(map[string]any)["details"].(map[string]any)["reason"], r.Raw)
	})

	t.Run("prune", func(t *testing.T) {
		walkPrune(t, a, cov.observe, spaces, huge, expect)
	})

	t.Run("signing keys", func(t *testing.T) {
		walkSigningKeys(t, d, vkey, spaces, huge, expect)
	})

	t.Run("approvals", func(t *testing.T) {
		walkApprovals(t, a, b, aClock, spaces, tok, huge, expect)
	})

	t.Run("rate", func(t *testing.T) {
		expect(c.Do("GET", "/v1/head", "", "Authorization", rateTok), 200, "") // the one request of the burst
		ops := []struct{ method, path, body string }{
			{"GET", "/v1/verification", ""},
			{"POST", "/v1/namespaces", `{"name":"walk-rate"}`},
			{"GET", "/v1/namespaces", ""},
		}
		for _, n := range spaces {
			ops = append(ops, []struct{ method, path, body string }{
				{"POST", n.v1 + "/effects/reserve", rsv("walk-rate-0001", "e1", 1, true, "")},
				{"POST", n.v1 + "/effects/walk-rate-0001/commit", `{"reservation":"rsv_x","outcome":"succeeded"}`},
				{"POST", n.v1 + "/effects/walk-rate-0001/resolve", `{"outcome":"succeeded","note":"n"}`},
				{"POST", n.v1 + "/effects/walk-rate-0001/reconcile", walkReconciled},
				{"GET", n.v1 + "/effects/walk-rate-0001", ""},
				{"GET", n.v1 + "/receipts", ""},
				{"GET", n.v1 + "/receipts/1", ""},
				{"GET", n.v1 + "/head", ""},
				{"GET", n.v1 + "/mcp/state-key", ""},
				{"GET", n.v1 + "/derivation-key", ""},
				{"POST", n.v1 + "/erasures", `{"keys":["walk-rate-0001"]}`},
				{"GET", n.v1 + "/erasures/1", ""},
				{"GET", n.v1 + "/erasures", ""},
				{"GET", n.v1 + "/prune", ""},
				{"POST", n.v1 + "/prune", `{}`},
				{"POST", n.v1 + "/signing-keys", `{"vkey":"x"}`},
				{"GET", n.v1 + "/signing-keys", ""},
				{"GET", n.v1 + "/audit", ""},
				{"GET", n.log + "/checkpoint", ""},
				{"GET", n.log + "/tile/0/000", ""},
				{"GET", n.v1 + "/proof/inclusion?seq=1", ""},
				{"GET", n.v1 + "/proof/consistency?from=0", ""},
				{"GET", n.v1 + "/receipts/1/proof", ""},
				{"GET", n.v1 + "/approvals", ""},
				{"GET", n.v1 + "/approvals/1", ""},
				{"POST", n.v1 + "/approvals/1", `{"decision":"approve"}`},
				{"POST", n.v1 + "/approvals/1/mcp-client", `{"decision":"approve","client":"c"}`},
				{"GET", "/v1/namespaces/" + n.name + "/policy", ""},
				{"PUT", "/v1/namespaces/" + n.name + "/policy", `{}`},
			}...)
		}
		for _, op := range ops {
			r := c.Do(op.method, op.path, op.body, "Authorization", rateTok)
			expect(r, 429, "rate_limited")
			assert.NotEmpty(t, r.Header.Get("Retry-After"), "%s %s", op.method, op.path)
		}
	})

	if t.Failed() {
		return // the coverage below would only repeat what failed
	}
	assert.Empty(t, cov.missing(openAPIDoc, map[int]bool{500: true, 503: true}),
		"declared statuses no request produced")
	// integrity_error and storage_corrupt need a damaged database:
	// TestHardening4_replayIntegrity and TestHardening4_corruptPage.
	assert.Empty(t, cov.missingCodes(openAPIDoc, map[string]bool{"internal": true, "unavailable": true,
		"integrity_error": true, "storage_corrupt": true}),
		"error codes no request produced")
}

// walkNS is a namespace the walk drives: its name, the prefix of its /v1
// routes and of its log's routes.
type walkNS struct{ name, v1, log string }

// nsRoutes are the routes bound to one namespace, as suffixes of /v1 (the
// namespace default) or /v1/ns/NS.
var nsRoutes = []struct{ method, path, body string }{
	{"POST", "/effects/reserve", `{"idempotency_key":"walk-auth-0001","execution_id":"e1","tool":"walk.tool","effect":"write"}`},
	{"POST", "/effects/walk-auth-0001/commit", `{"reservation":"rsv_x","outcome":"succeeded"}`},
	{"POST", "/effects/walk-auth-0001/resolve", `{"outcome":"succeeded","note":"n"}`},
	{"POST", "/effects/walk-auth-0001/reconcile", walkReconciled},
	{"POST", "/erasures", `{"keys":["walk-auth-0001"]}`},
	{"GET", "/erasures/1", ""},
	{"GET", "/erasures", ""},
	{"GET", "/prune", ""},
	{"POST", "/prune", `{}`},
	{"POST", "/signing-keys", `{"vkey":"x"}`},
	{"GET", "/signing-keys", ""},
	{"GET", "/effects/walk-auth-0001", ""},
	{"GET", "/receipts", ""},
	{"GET", "/receipts/1", ""},
	{"GET", "/head", ""},
	{"GET", "/audit", ""},
	{"GET", "/proof/inclusion?seq=1", ""},
	{"GET", "/proof/consistency?from=0", ""},
	{"GET", "/receipts/1/proof", ""},
}

// appendNS appends n reserve receipts with keys prefix-0… through the
// routes under v1 (/v1 or /v1/ns/NS). Up to bulkAppend of them go in key
// order; more go from several clients at once (in batches, as a loaded
// ledger writes them), in no particular order.
func appendNS(t *testing.T, l *Ledgerd, v1, prefix string, n int) {
	t.Helper()
	body := func(i int) string {
		return fmt.Sprintf(`{"idempotency_key":"%s-%04d","execution_id":"exec-%s","tool":"mail.send","effect":"write"}`, prefix, i, prefix)
	}
	if n <= bulkAppend {
		for i := range n {
			r := l.Do("POST", v1+"/effects/reserve", body(i))
			require.Equal(t, 201, r.Status, r.Raw)
		}
		return
	}
	const clients = 8
	errs := make(chan error, clients)
	for c := range clients {
		go func() {
			for i := c; i < n; i += clients {
				status, b, err := rawPost(l.URL+v1+"/effects/reserve", body(i))
				if err == nil && status != 201 {
					err = fmt.Errorf("reserve %d: %d %s", i, status, b)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range clients {
		require.NoError(t, <-errs)
	}
}

// bulkAppend is how many receipts appendNS appends one after another.
const bulkAppend = 32

// waitCheckpointNS waits until the served checkpoint of namespace ns has
// at least size leaves and returns its note.
func waitCheckpointNS(t *testing.T, l *Ledgerd, vkey, ns string, size int64) (string, tlog.Checkpoint) {
	t.Helper()
	v, err := tlog.NewVerifier(vkey)
	require.NoError(t, err)
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := l.Do("GET", "/log/"+ns+"/checkpoint", "")
		if r.Status == 200 {
			c, err := tlog.OpenCheckpoint([]byte(r.Raw), v, ns)
			require.NoError(t, err, r.Raw)
			if c.Size >= size {
				return r.Raw, c
			}
		} else {
			require.Equal(t, "not_checkpointed", r.Code(), r.Raw)
		}
		require.True(t, time.Now().Before(deadline), "no checkpoint of size %d of %s in 60s:\n%s", size, ns, l.Logs())
		time.Sleep(20 * time.Millisecond)
	}
}

// rawExchange sends a request over a bare connection, for what an HTTP
// client will not send, and returns it with the response read back.
func rawExchange(t *testing.T, l *Ledgerd, method, path, headers string) openapicheck.Exchange {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(l.URL, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: ledgerd\r\n%sConnection: close\r\n\r\n", method, path, headers)
	require.NoError(t, err)
	req := httptest.NewRequest(method, l.URL+path, nil)
	res, err := http.ReadResponse(bufio.NewReader(conn), req)
	require.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	res.Body.Close()
	return openapicheck.Exchange{Req: req, Resp: res, RespBody: body}
}

// walkApprovals drives every status and error code of SPEC §13's routes
// in both namespace forms: on a (no tokens) the gate's decisions and the
// answers, on b (tokens) authentication, roles and self-approval.
func walkApprovals(t *testing.T, a, b *Ledgerd, aClock *testClock, spaces []walkNS, tok map[string]string, huge string,
	expect func(Resp, int, string)) {
	t.Helper()
	const pol = `{"rules":[{"tool":"gate.pay*","approval":"required","expires_in_ms":60000},
		{"tool":"gate.mcp","approval":"required","approvers":["mcp-client"],"expires_in_ms":60000},
		{"tool":"gate.rm*","deny":true},{"tool":"gate.flaky","repeat_failure":"refuse"}],"self_approval":"allow"}`
	gate := func(key, exec, tool string) string {
		return `{"idempotency_key":"` + key + `","execution_id":"` + exec + `","tool":"` + tool +
			`","effect":"external","idempotent":true,"input":{"n":1}}`
	}
	for _, n := range spaces {
		t.Run(n.name, func(t *testing.T) {
			policy := "/v1/namespaces/" + n.name + "/policy"
			expect(a.Do("PUT", policy, pol), 200, "")
			expect(a.Do("GET", policy, ""), 200, "")
			expect(a.Do("HEAD", policy, ""), 200, "")
			expect(a.Do("PUT", policy, `{"rules":[{"tool":"x","approval":"maybe"}]}`), 400, "invalid_request")
			expect(a.Do("PUT", policy, huge), 413, "body_too_large")
			expect(a.Do("PUT", policy, pol, "Content-Type", "text/plain"), 415, "unsupported_media_type")
			expect(a.Do("PUT", "/v1/namespaces/nope/policy", pol), 404, "unknown_namespace")
			expect(a.Do("GET", "/v1/namespaces/nope/policy", ""), 404, "unknown_namespace")
			expect(a.Do("GET", "/v1/namespaces/A!/policy", ""), 400, "invalid_request")

			rsv := func(body string) Resp { return a.Do("POST", n.v1+"/effects/reserve", body) }
			expect(rsv(`{"execution_id":"e","tool":"gate.pay","effect":"external","input":{}}`), 400, "key_required")
			expect(rsv(`{"execution_id":"e","tool":"gate.pay","effect":"read"}`), 422, "effect_class_mismatch")
			expect(rsv(gate("walk-rm-0001", "e1", "gate.rm")), 403, "denied_by_policy")
			r := rsv(gate("walk-pay-0001", "e1", "gate.pay"))
			expect(r, 202, "")
			seq := itoa(int(num(t, r.Body, "approval", "seq")))
			for _, q := range []string{"", "?state=pending", "?state=consumed&limit=5"} {
				expect(a.Do("GET", n.v1+"/approvals"+q, ""), 200, "")
			}
			expect(a.Do("GET", n.v1+"/approvals?state=bogus", ""), 400, "invalid_request")
			expect(a.Do("HEAD", n.v1+"/approvals", ""), 200, "")
			expect(a.Do("GET", n.v1+"/approvals/"+seq, ""), 200, "")
			expect(a.Do("HEAD", n.v1+"/approvals/"+seq, ""), 200, "")
			expect(a.Do("GET", n.v1+"/approvals/999999", ""), 404, "unknown_approval")
			answer := func(seq, body string, hdr ...string) Resp {
				return a.Do("POST", n.v1+"/approvals/"+seq, body, hdr...)
			}
			expect(answer(seq, `{"decision":"maybe"}`), 400, "invalid_request")
			expect(answer(seq, huge), 413, "body_too_large")
			expect(answer(seq, `{"decision":"approve"}`, "Content-Type", "text/plain"), 415, "unsupported_media_type")
			expect(answer("999999", `{"decision":"approve"}`), 404, "unknown_approval")
			expect(answer(seq+"/mcp-client", `{"decision":"approve","client":"walk"}`), 403, "forbidden")
			expect(answer(seq, `{"decision":"approve","note":"ok"}`), 201, "")
			expect(answer(seq, `{"decision":"approve","note":"ok"}`), 200, "")
			expect(answer(seq, `{"decision":"reject"}`), 409, "already_answered")
			expect(rsv(gate("walk-pay-0001", "e1", "gate.pay")), 201, "")

			r = rsv(gate("walk-pay-0002", "e1", "gate.pay"))
			expect(r, 202, "")
			expect(answer(itoa(int(num(t, r.Body, "approval", "seq"))), `{"decision":"reject","note":"no"}`), 201, "")
			expect(rsv(gate("walk-pay-0002", "e1", "gate.pay")), 409, "approval_rejected")

			r = rsv(gate("walk-gflaky-0001", "e1", "gate.flaky"))
			expect(r, 201, "")
			rs, _ := r.Body["reservation"].(string)
			expect(a.Do("POST", n.v1+"/effects/walk-gflaky-0001/commit", `{"reservation":"`+rs+`","outcome":"failed","error":{"code":"TIMEOUT","retryable":true}}`), 201, "")
			expect(rsv(gate("walk-gflaky-0002", "e2", "gate.flaky")), 409, "unchanged_retry")

			r = rsv(gate("walk-mcp-0001", "e1", "gate.mcp"))
			expect(r, 202, "")
			mcp := itoa(int(num(t, r.Body, "approval", "seq"))) + "/mcp-client"
			expect(answer(mcp, `{"decision":"approve"}`), 400, "invalid_request")
			expect(answer(mcp, huge), 413, "body_too_large")
			expect(answer(mcp, `{"decision":"approve","client":"walk"}`, "Content-Type", "text/plain"), 415, "unsupported_media_type")
			expect(answer("999999/mcp-client", `{"decision":"approve","client":"walk"}`), 404, "unknown_approval")
			expect(answer(mcp, `{"decision":"approve","client":"walk"}`), 201, "")
			expect(answer(mcp, `{"decision":"approve","client":"walk"}`), 200, "")
			expect(answer(mcp, `{"decision":"reject","client":"walk"}`), 409, "already_answered")

			late := rsv(gate("walk-pay-0003", "e1", "gate.pay"))
			expect(late, 202, "")
			lateMCP := rsv(gate("walk-mcp-0002", "e1", "gate.mcp"))
			expect(lateMCP, 202, "")
			aClock.advance(61 * time.Second)
			expect(answer(itoa(int(num(t, late.Body, "approval", "seq"))), `{"decision":"approve"}`), 410, "approval_expired")
			expect(answer(itoa(int(num(t, lateMCP.Body, "approval", "seq")))+"/mcp-client", `{"decision":"approve","client":"walk"}`), 410, "approval_expired")

			if n.name != "default" {
				expect(a.Do("GET", "/v1/ns/nope/approvals", ""), 404, "unknown_namespace")
				expect(a.Do("GET", "/v1/ns/A!/approvals", ""), 400, "invalid_request")
				expect(a.Do("GET", "/v1/ns/nope/approvals/1", ""), 404, "unknown_namespace")
				expect(a.Do("GET", "/v1/ns/A!/approvals/1", ""), 400, "invalid_request")
			}

			// b: tokens. The admin that asks may not approve its own ask.
			expect(b.Do("PUT", policy, `{"rules":[{"tool":"gate.pay","approval":"required"}]}`, "Authorization", tok["admin"]), 200, "")
			r = b.Do("POST", n.v1+"/effects/reserve", gate("walk-self-0001", "e1", "gate.pay"), "Authorization", tok["admin"])
			expect(r, 202, "")
			seq = itoa(int(num(t, r.Body, "approval", "seq")))
			expect(b.Do("POST", n.v1+"/approvals/"+seq, `{"decision":"approve"}`, "Authorization", tok["admin"]), 403, "self_approval")
			for _, op := range []struct{ method, path, body, wrongRole string }{
				{"GET", n.v1 + "/approvals", "", "writer"},
				{"GET", n.v1 + "/approvals/" + seq, "", "writer"},
				{"POST", n.v1 + "/approvals/" + seq, `{"decision":"approve"}`, "writer"},
				{"POST", n.v1 + "/approvals/" + seq + "/mcp-client", `{"decision":"approve","client":"c"}`, "reader"},
				{"GET", policy, "", ""}, // a writer reads the gate it works behind
				{"PUT", policy, `{}`, "writer"},
			} {
				expect(b.Do(op.method, op.path, op.body), 401, "unauthorized")
				if op.wrongRole != "" {
					expect(b.Do(op.method, op.path, op.body, "Authorization", tok[op.wrongRole]), 403, "forbidden")
				}
			}
			expect(b.Do("GET", policy, "", "Authorization", tok["writer"]), 200, "")
			if n.name == "default" { // the scoped token may use walk only
				expect(b.Do("GET", policy, "", "Authorization", tok["scoped"]), 403, "forbidden")
			}
		})
	}
}

// walkReconciled is a reconcile body: a lookup found the effect.
const walkReconciled = `{"outcome":"succeeded","external_ref":"ch_1","evidence":{"lookup":"walk.find","answer":{"applied":true}}}`

// walkReconcile drives POST …/reconcile (SPEC §15) on the open ledger a:
// no rule, then a rule for walk.rec*; a leased, an early and an unknown
// key; a reconcile, and the original call's late commit after it.
func walkReconcile(t *testing.T, a *Ledgerd, aClock *testClock, spaces []walkNS, huge string, expect func(Resp, int, string)) {
	t.Helper()
	rsv := func(key, lease string) string {
		return `{"idempotency_key":"` + key + `","execution_id":"e1","tool":"walk.rec","effect":"external","input":{"k":"` + key + `"},"lease_ms":` + lease + `}`
	}
	notApplied := `{"outcome":"not_applied","error":{"code":"NOT_FOUND"},"evidence":{"lookup":"walk.find","answer":{"applied":false}}}`
	for _, n := range spaces {
		t.Run(n.name, func(t *testing.T) {
			r := a.Do("POST", n.v1+"/effects/reserve", rsv("walk-rec-0001", "10"))
			expect(r, 201, "")
			token, _ := r.Body["reservation"].(string)
			expect(a.Do("POST", n.v1+"/effects/reserve", rsv("walk-rec-0002", "10")), 201, "")
			expect(a.Do("POST", n.v1+"/effects/reserve", rsv("walk-rec-0003", "600000")), 201, "")
			aClock.advance(20 * time.Millisecond)
			expect(a.Do("POST", n.v1+"/effects/walk-rec-0001/reconcile", walkReconciled), 403, "reconcile_not_allowed")
			expect(a.Do("PUT", "/v1/namespaces/"+n.name+"/policy", `{"rules":[{"tool":"walk.rec*","reconcile":{"allow":true}}]}`), 200, "")
			expect(a.Do("POST", n.v1+"/effects/walk-rec-0003/reconcile", walkReconciled), 409, "not_interrupted")
			r = a.Do("POST", n.v1+"/effects/walk-rec-0002/reconcile", notApplied)
			expect(r, 409, "reconcile_too_early")
			assert.NotEmpty(t, r.Header.Get("Retry-After"))
			expect(a.Do("POST", n.v1+"/effects/walk-none-0001/reconcile", walkReconciled), 404, "unknown_key")
			expect(a.Do("POST", n.v1+"/effects/walk-rec-0001/reconcile", `{"outcome":"failed","error":{"code":"X"},"evidence":{"lookup":"q","answer":1}}`), 400, "invalid_request")
			expect(a.Do("POST", n.v1+"/effects/walk-rec-0001/reconcile", huge), 413, "body_too_large")
			expect(a.Do("POST", n.v1+"/effects/walk-rec-0001/reconcile", walkReconciled, "Content-Type", "text/csv"), 415, "unsupported_media_type")
			r = a.Do("POST", n.v1+"/effects/walk-rec-0001/reconcile", walkReconciled)
			expect(r, 201, "")
			assert.Equal(t, "succeeded", r.Body["state"])
			r = a.Do("POST", n.v1+"/effects/walk-rec-0001/commit", `{"reservation":"`+token+`","outcome":"succeeded","external_ref":"ch_2"}`)
			expect(r, 201, "")
			assert.NotNil(t, r.Body["reconciled_earlier"], "the original call's late commit")
		})
	}
}

// walkErase drives POST …/erasures and GET …/erasures/{seq} (SPEC §14):
// on A (committed) every refusal, nothing to erase, an erasure of the
// reconciled key and its reading; on B (inline, an admin token) the
// refusal of inline payloads.
func walkErase(t *testing.T, a, b *Ledgerd, tok map[string]string, spaces []walkNS, huge string, expect func(Resp, int, string)) {
	t.Helper()
	for _, n := range spaces {
		t.Run(n.name, func(t *testing.T) {
			for _, body := range []string{`{}`, `{"keys":["walk-rec-0001"],"subject":"s"}`, `{"keys":[]}`,
				`{"keys":["walk-rec-0001"],"fields":["tool"]}`, `{"keys":"walk-rec-0001"}`, `{"keys":["walk-rec-0001"],"x":1}`,
				`{"keys":["walk-rec-0001"],"fields":[]}`, `{"keys":["walk-rec-0001"],"fields":["result","result"]}`,
				`{"keys":["walk-rec-0001"],"reason":""}`} {
				expect(a.Do("POST", n.v1+"/erasures", body), 400, "invalid_request")
			}
			expect(a.Do("POST", n.v1+"/erasures", huge), 413, "body_too_large")
			expect(a.Do("POST", n.v1+"/erasures", `{"keys":["walk-rec-0001"]}`, "Content-Type", "text/csv"), 415, "unsupported_media_type")
			r := a.Do("POST", n.v1+"/erasures", `{"keys":["walk-none-0001"]}`)
			expect(r, 200, "")
			assert.Equal(t, "nothing_to_erase", r.Body["status"])
			r = a.Do("POST", n.v1+"/erasures", `{"keys":["walk-rec-0001"],"reason":"walk"}`)
			expect(r, 201, "")
			seq := r.Body["receipt"].(map[string]any)["seq"].(float64)
			r = a.Do("GET", fmt.Sprintf("%s/erasures/%d", n.v1, int(seq)), "")
			expect(r, 200, "")
			assert.NotEmpty(t, r.Body["ranges"])
			expect(a.Do("HEAD", fmt.Sprintf("%s/erasures/%d", n.v1, int(seq)), ""), 200, "")
			expect(a.Do("GET", n.v1+"/erasures/1", ""), 404, "unknown_erasure")
			expect(a.Do("GET", n.v1+"/erasures/x", ""), 404, "unknown_erasure")
			r = a.Do("GET", n.v1+"/erasures", "")
			expect(r, 200, "")
			assert.Equal(t, n.name, r.Body["namespace"])
			assert.NotEmpty(t, r.Body["erasures"])
			expect(a.Do("HEAD", n.v1+"/erasures", ""), 200, "")

			// B keeps its payloads inline: they cannot be erased.
			rr := b.Do("POST", n.v1+"/effects/reserve", `{"idempotency_key":"walk-inl-0001","execution_id":"e1","tool":"walk.tool","effect":"write"}`,
				"Authorization", tok["writer"])
			expect(rr, 201, "")
			expect(b.Do("POST", n.v1+"/effects/walk-inl-0001/commit", `{"reservation":"`+rr.Body["reservation"].(string)+
				`","outcome":"succeeded","external_ref":"r1"}`, "Authorization", tok["writer"]), 201, "")
			expect(b.Do("POST", n.v1+"/erasures", `{"keys":["walk-inl-0001"]}`, "Authorization", tok["admin"]), 409, "payloads_inline")
		})
	}
}
