package test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// hourMS is the default namespace's key lifetime in these tests.
const hourMS = int64(time.Hour / time.Millisecond)

// num reads a JSON number member of a decoded body.
func num(t *testing.T, m map[string]any, path ...string) int64 {
	t.Helper()
	var v any = m
	for _, p := range path {
		o, ok := v.(map[string]any)
		require.True(t, ok, "no object at %s in %v", p, m)
		v = o[p]
	}
	f, ok := v.(float64)
	require.True(t, ok, "%v is not a number (%v)", path, m)
	return int64(f)
}

func ttlReserve(key, exec string, idempotent bool, extra string) string {
	return fmt.Sprintf(`{"idempotency_key":%q,"execution_id":%q,"tool":"reports.send","effect":"external","idempotent":%t,"input":{"day":1}%s}`,
		key, exec, idempotent, extra)
}

// TestKeyLifetime drives SPEC §12 through the real binaries on SQLite and
// on PostgreSQL, with ledgerd's clock moved through a file (no waiting).
func TestKeyLifetime(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		testKeyLifetime(t, filepath.Join(t.TempDir(), "ledger.db"))
	})
	t.Run("postgres", func(t *testing.T) {
		testKeyLifetime(t, pgtest.URL(t))
	})
}

func testKeyLifetime(t *testing.T, db string) {
	clock := newTestClock(t, t0)
	l := clock.start(t, db, "--default-key-ttl", "1h", "--verify-every", "1h")

	// The namespaces and their lifetimes.
	r := l.Do("POST", "/v1/namespaces", `{"name":"reports","key_ttl_ms":86400000}`)
	require.Equal(t, 201, r.Status, r.Raw)
	assert.Equal(t, int64(86400000), num(t, r.Body, "key_ttl_ms"))
	for _, body := range []string{`{"name":"bad","key_ttl_ms":-1}`, `{"name":"bad","key_ttl_ms":"1h"}`,
		`{"name":"bad","key_ttl_ms":1.5}`, `{"name":"bad","key_ttl_ms":9007199254740992}`} {
		r := l.Do("POST", "/v1/namespaces", body)
		assert.Equal(t, 400, r.Status, body)
		assert.Equal(t, "invalid_request", r.Code(), body)
		details, _ := r.Body["error"].(map[string]any)["details"].(map[string]any)
		assert.Equal(t, "key_ttl_ms", details["field"], body)
	}
	out, stderr, code := ledgerctl(t, "namespace", "create", "--server", l.URL, "mail", "--key-ttl", "30m", "--json")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, `"key_ttl_ms":1800000`)
	_, stderr, code = ledgerctl(t, "namespace", "create", "--server", l.URL, "bad", "--key-ttl", "-1s")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--key-ttl")
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"forever"}`).Status)
	r = l.Do("GET", "/v1/namespaces", "")
	require.Equal(t, 200, r.Status, r.Raw)
	ttls := map[string]int64{}
	for _, n := range r.Body["namespaces"].([]any) {
		m := n.(map[string]any)
		ttls[m["name"].(string)] = num(t, m, "key_ttl_ms")
	}
	assert.Equal(t, map[string]int64{"default": hourMS, "reports": 86400000, "mail": 1800000, "forever": 0}, ttls)

	// A succeeded key: remembered one millisecond short of the TTL, a new
	// generation at it.
	r = l.Do("POST", "/v1/effects/reserve", ttlReserve("daily-report", "exec-1", false, ""))
	require.Equal(t, 201, r.Status, r.Raw)
	_, hasRenewed := r.Body["renewed"]
	assert.False(t, hasRenewed, "a new key is not renewed")
	l.Commit(t, "daily-report", `{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded","external_ref":"msg_1"}`)
	r = l.Do("GET", "/v1/effects/daily-report", "")
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, t0+hourMS, num(t, r.Body, "expires_at"))
	clock.set(t0 + hourMS - 1)
	r = l.Do("POST", "/v1/effects/reserve", ttlReserve("daily-report", "exec-2", false, ""))
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, "replayed", r.Body["status"])
	replaySeq := num(t, r.Body, "receipt", "seq")
	clock.set(t0 + hourMS)
	r = l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"daily-report","execution_id":"exec-3","tool":"reports.send","effect":"external","input":{"day":2}}`)
	require.Equal(t, 201, r.Status, r.Raw)
	assert.Equal(t, "reserved", r.Body["status"])
	assert.Equal(t, replaySeq, num(t, r.Body, "renewed", "seq"))
	assert.Equal(t, t0+hourMS-1, num(t, r.Body, "renewed", "recorded_at"))
	renewSeq := num(t, r.Body, "receipt", "seq")
	r = l.Do("GET", "/v1/effects/daily-report", "")
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, "reserved", r.Body["state"])
	_, hasExpiry := r.Body["expires_at"]
	assert.False(t, hasExpiry, "a reserved key has no expiry")
	require.Len(t, r.Body["receipts"], 1, "only the current generation")
	assert.Equal(t, renewSeq, num(t, r.Body["receipts"].([]any)[0].(map[string]any), "seq"))
	assert.Equal(t, replaySeq, num(t, r.Body["receipts"].([]any)[0].(map[string]any), "ref_seq"))
	r = l.Do("GET", "/v1/effects/daily-report?history=true", "")
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Len(t, r.Body["receipts"], 4, "history: both generations")
	r = l.Do("GET", "/v1/effects/daily-report?history=yes", "")
	assert.Equal(t, 400, r.Status)
	assert.Equal(t, "invalid_request", r.Code())

	// A failed key: refused one millisecond short of the TTL, renewed at it.
	tok := l.Reserve(t, ttlReserve("weekly-digest", "exec-4", false, ""))
	l.Commit(t, "weekly-digest", `{"reservation":"`+tok+`","outcome":"failed","error":{"code":"BOUNCED"}}`)
	clock.set(t0 + 2*hourMS - 1)
	r = l.Do("POST", "/v1/effects/reserve", ttlReserve("weekly-digest", "exec-5", false, ""))
	assert.Equal(t, 409, r.Status)
	assert.Equal(t, "retry_not_allowed", r.Code())
	clock.set(t0 + 2*hourMS)
	r = l.Do("POST", "/v1/effects/reserve", ttlReserve("weekly-digest", "exec-5", false, ""))
	require.Equal(t, 201, r.Status, r.Raw)
	require.NotNil(t, r.Body["renewed"])

	// An interrupted key past the TTL still waits for a person; a key of a
	// namespace without a TTL is remembered.
	r = l.Do("POST", "/v1/effects/reserve", ttlReserve("lost-call-01", "exec-6", false, `,"lease_ms":10`))
	require.Equal(t, 201, r.Status, r.Raw)
	r = l.Do("POST", "/v1/ns/forever/effects/reserve", ttlReserve("forever-key", "exec-7", false, ""))
	require.Equal(t, 201, r.Status, r.Raw)
	r = l.Do("POST", "/v1/ns/forever/effects/forever-key/commit", `{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	clock.set(t0 + 30*24*hourMS)
	r = l.Do("POST", "/v1/effects/reserve", ttlReserve("lost-call-01", "exec-8", false, ""))
	assert.Equal(t, 409, r.Status, r.Raw)
	assert.Equal(t, "unsafe_resume", r.Code())
	r = l.Do("POST", "/v1/ns/forever/effects/reserve", ttlReserve("forever-key", "exec-9", false, ""))
	assert.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, "replayed", r.Body["status"])
	r = l.Do("GET", "/v1/ns/forever/effects/forever-key", "")
	_, hasExpiry = r.Body["expires_at"]
	assert.False(t, hasExpiry, "no expires_at without a TTL")

	r = l.Do("POST", "/v1/effects/reserve", ttlReserve("quarterly-report", "exec-11", false, ""))
	require.Equal(t, 201, r.Status, r.Raw)
	l.Commit(t, "quarterly-report", `{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded"}`)

	// The verifiers: offline and online, full and incremental, and the
	// audit's renewed keys.
	state := filepath.Join(t.TempDir(), "state.json")
	for _, args := range [][]string{
		{"verify", "--db", db, "--json", "--state", state},
		{"verify", "--server", l.URL, "--json"},
	} {
		out, stderr, code := ledgerctl(t, args...)
		require.Equal(t, 0, code, "%v: %s %s", args, out, stderr)
		var rep struct {
			OK    bool `json:"ok"`
			Audit struct {
				RenewedKeys []struct {
					Key              string `json:"key"`
					PreviousFinalSeq int64  `json:"previous_final_seq"`
					PreviousOutcome  string `json:"previous_outcome"`
					Seq              int64  `json:"seq"`
				} `json:"renewed_keys"`
				ReInvocations []struct {
					Key string `json:"key"`
				} `json:"re_invocations"`
			} `json:"audit"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
		assert.True(t, rep.OK)
		require.Len(t, rep.Audit.RenewedKeys, 2, out)
		assert.Equal(t, "daily-report", rep.Audit.RenewedKeys[0].Key)
		assert.Equal(t, int64(2), rep.Audit.RenewedKeys[0].PreviousFinalSeq)
		assert.Equal(t, renewSeq, rep.Audit.RenewedKeys[0].Seq)
		assert.Equal(t, "succeeded", rep.Audit.RenewedKeys[0].PreviousOutcome)
		assert.Equal(t, "weekly-digest", rep.Audit.RenewedKeys[1].Key)
		assert.Equal(t, "failed", rep.Audit.RenewedKeys[1].PreviousOutcome)
		for _, ri := range rep.Audit.ReInvocations {
			assert.NotEqual(t, "weekly-digest", ri.Key, "a new generation is not a re-invocation")
		}
	}
	out, stderr, code = ledgerctl(t, "audit", "--db", db)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "Renewed keys: a new generation after the key's lifetime (2)")
	// The outcome that ended the previous generation, then its seq.
	assert.Regexp(t, `PREVIOUS OUTCOME\s+PREVIOUS SEQ\n`, out)
	assert.Regexp(t, fmt.Sprintf(`\n  %d\s+daily-report\s.*\ssucceeded\s+2\n`, renewSeq), out)
	assert.Regexp(t, `\n  \d+\s+weekly-digest\s.*\sfailed\s+\d+\n`, out)
	clock.set(t0 + 60*24*hourMS)
	r = l.Do("POST", "/v1/effects/reserve", ttlReserve("monthly-report", "exec-10", false, ""))
	require.Equal(t, 201, r.Status, r.Raw)
	r = l.Do("POST", "/v1/effects/reserve", ttlReserve("quarterly-report", "exec-12", false, ""))
	require.Equal(t, 201, r.Status, r.Raw)
	require.NotNil(t, r.Body["renewed"], "renewed after the pinned head")
	out, stderr, code = ledgerctl(t, "verify", "--db", db, "--state", state, "--incremental", "--json")
	require.Equal(t, 0, code, "%s %s", out, stderr)
	var inc struct {
		OK    bool `json:"ok"`
		Audit struct {
			RenewedKeys []struct {
				Key string `json:"key"`
			} `json:"renewed_keys"`
		} `json:"audit"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &inc), out)
	assert.True(t, inc.OK)
	require.Len(t, inc.Audit.RenewedKeys, 1, "the incremental run audits the renewal after the pin: %s", out)
	assert.Equal(t, "quarterly-report", inc.Audit.RenewedKeys[0].Key)
	for _, tc := range []struct {
		args []string
		want int
	}{{[]string{"--db", db}, 1}, {[]string{"--db", db, "--history"}, 4}, {[]string{"--server", l.URL, "--history"}, 4}} {
		out, stderr, code = ledgerctl(t, append([]string{"show", "--json", "daily-report"}, tc.args...)...)
		require.Equal(t, 0, code, stderr)
		var v struct {
			Receipts []any `json:"receipts"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &v), out)
		assert.Len(t, v.Receipts, tc.want, "%v", tc.args)
	}
	out, stderr, code = ledgerctl(t, "show", "--db", db, "--namespace", "forever", "forever-key")
	require.Equal(t, 0, code, stderr)
	assert.NotContains(t, out, "expires", "no expiry without a TTL")
	out, stderr, code = ledgerctl(t, "namespace", "list", "--db", db)
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `(?m)^default +\d+ +[0-9a-f]{64} +1h0m0s`, out)
	assert.Regexp(t, `(?m)^forever +\d+ +[0-9a-f]{64} +-`, out)

	// The periodic verifier of a restarted ledgerd reads the TTL from the
	// ledger too, and the TTL stays what the ledger was created with.
	require.NoError(t, l.Stop())
	l = clock.start(t, db, "--default-key-ttl", "5m", "--verify-every", "1h")
	r = l.Do("GET", "/v1/namespaces", "")
	assert.Contains(t, r.Raw, `{"name":"default","head":`)
	for _, n := range r.Body["namespaces"].([]any) {
		if m := n.(map[string]any); m["name"] == "default" {
			assert.Equal(t, hourMS, num(t, m, "key_ttl_ms"), "fixed when the ledger was created")
		}
	}
	var ran map[string]any
	require.Eventually(t, func() bool {
		ran = l.Do("GET", "/v1/verification", "").Body
		return ran["ran"] == true
	}, 30*time.Second, 20*time.Millisecond)
	assert.Equal(t, true, ran["ok"], "%v", ran)
}
