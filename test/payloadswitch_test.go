package test

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// TestPayloadSwitch drives SPEC §14's one-way switch of an inline
// namespace to committed payloads through the real binaries on SQLite and
// PostgreSQL: the policy's refusals, the switch and its retention, keys
// reserved before it (dedupe and fingerprint_changed like with like, their
// commits committed), keys after it (hk1 fingerprints, commitments,
// subjects), erase refusing the inline part and erasing the committed one,
// the retention sweeper started without a restart and sweeping only the
// committed part, ledgerctl show/receipts/export from the file, verify
// (--db, --incremental, --server) clean, and the mode kept across a
// restart.
func TestPayloadSwitch(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testPayloadSwitch)
}

// switchResv is a reserve body of key with input {"to": to}.
func switchResv(key, exec, to, extra string) string {
	return `{"idempotency_key":"` + key + `","execution_id":"` + exec + `","tool":"mail.send","effect":"external","idempotent":true,"input":{"to":"` + to + `"}` + extra + `}`
}

func testPayloadSwitch(t *testing.T, db string) {
	clock := newTestClock(t, t0)
	l := clock.start(t, db, "--default-payloads", "inline", "--retention-interval", "20ms")
	marker := randomMarker(t)
	ns := func(r Resp) map[string]any {
		for _, n := range r.Body["namespaces"].([]any) {
			if m := n.(map[string]any); m["name"] == "default" {
				return m
			}
		}
		return nil
	}

	// Before: an inline namespace, a finished key and one in flight.
	tokA := l.Reserve(t, switchResv("before-00001", "e1", "a", ""))
	l.Commit(t, "before-00001", `{"reservation":"`+tokA+`","outcome":"succeeded","external_ref":"ref-a-`+marker+`","result":{"to":"a-`+marker+`"}}`)
	tokB := l.Reserve(t, switchResv("before-00002", "e1", "b", `,"lease_ms":86400000`))
	assert.Equal(t, "inline", l.Do("GET", "/v1/derivation-key", "").Body["payloads"])
	assert.Nil(t, ns(l.Do("GET", "/v1/namespaces", ""))["committed_after"])

	// The policy's refusals: one way, and retention only with the switch.
	for _, bad := range []string{`{"payloads":"inline"}`, `{"payloads":"sealed"}`, `{"payloads":1}`, `{"retention":{"payloads_ms":60000}}`} {
		r := l.Do("PUT", "/v1/namespaces/default/policy", bad)
		require.Equal(t, 400, r.Status, "%s: %s", bad, r.Raw)
		field := "payloads"
		if strings.Contains(bad, "retention") {
			field = "retention"
		}
		assert.Equal(t, field, r.Body["error"].(map[string]any)["details"].(map[string]any)["field"], bad)
	}

	// The switch, with a retention in the same policy.
	r := l.Do("PUT", "/v1/namespaces/default/policy", `{"payloads":"committed","retention":{"payloads_ms":60000}}`)
	require.Equal(t, 200, r.Status, r.Raw)
	switchAt := r.Body["seq"].(float64)
	require.Equal(t, float64(4), switchAt, r.Raw)
	n := ns(l.Do("GET", "/v1/namespaces", ""))
	assert.Equal(t, "committed", n["payloads"])
	assert.Equal(t, switchAt, n["committed_after"])
	dk := l.Do("GET", "/v1/derivation-key", "")
	require.Equal(t, 200, dk.Status, dk.Raw)
	assert.Equal(t, "committed", dk.Body["payloads"])
	key, err := hex.DecodeString(dk.Body["key"].(string))
	require.NoError(t, err)
	// A later policy that omits the member does not switch back; inline stays refused.
	r = l.Do("PUT", "/v1/namespaces/default/policy", `{"retention":{"payloads_ms":60000}}`)
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, false, r.Body["changed"], "the same policy as in force: %s", r.Raw)
	assert.Equal(t, "committed", r.Body["policy"].(map[string]any)["payloads"])
	require.Equal(t, 400, l.Do("PUT", "/v1/namespaces/default/policy", `{"payloads":"inline"}`).Status)

	// A key reserved before: a replay, in_progress and fingerprint_mismatch compare its sha256: fingerprint.
	rp := l.Do("POST", "/v1/effects/reserve", switchResv("before-00001", "e2", "a", ""))
	require.Equal(t, 200, rp.Status, rp.Raw)
	assert.Equal(t, "ref-a-"+marker, rp.Body["external_ref"])
	assert.Equal(t, 409, l.Do("POST", "/v1/effects/reserve", switchResv("before-00002", "e2", "b", "")).Status)
	mm := l.Do("POST", "/v1/effects/reserve", switchResv("before-00002", "e2", "changed", ""))
	require.Equal(t, 422, mm.Status, mm.Raw)
	assert.Equal(t, "fingerprint_mismatch", mm.Code())
	fpB, err := ledger.Fingerprint([]byte(`{"to":"b"}`))
	require.NoError(t, err)
	// Its commit after the switch is committed.
	c := l.Commit(t, "before-00002", `{"reservation":"`+tokB+`","outcome":"succeeded","result":{"to":"b-`+marker+`"}}`)
	commitB := int(c.Body["receipt"].(map[string]any)["seq"].(float64))
	rec := l.Do("GET", fmt.Sprintf("/v1/receipts/%d", commitB), "")
	assert.Equal(t, fpB, rec.Body["input_hash"], "the key keeps its sha256: fingerprint")
	assert.Regexp(t, `^pc1:[0-9a-f]{64}$`, rec.Body["commitments"].(map[string]any)["result"], rec.Raw)
	assert.Equal(t, map[string]any{"to": "b-" + marker}, rec.Body["result"])
	recA := l.Do("GET", "/v1/receipts/2", "")
	assert.Nil(t, recA.Body["commitments"], "receipts before the switch stay inline: %s", recA.Raw)
	assert.Equal(t, "ref-a-"+marker, recA.Body["external_ref"])

	// A key after the switch: keyed fingerprint, commitments, a subject.
	tokC := l.Reserve(t, switchResv("after-000001", "e1", "c", `,"subjects":["person-`+marker+`"]`))
	l.Commit(t, "after-000001", `{"reservation":"`+tokC+`","outcome":"succeeded","external_ref":"ref-c-`+marker+`","result":{"to":"c-`+marker+`"}}`)
	fpC, err := ledger.Fingerprint([]byte(`{"to":"c"}`))
	require.NoError(t, err)
	kc := l.Do("GET", "/v1/effects/after-000001", "")
	assert.Equal(t, ledger.KeyedHash(key, fpC), kc.Body["input_hash"])
	rpc := l.Do("POST", "/v1/effects/reserve", switchResv("after-000001", "e2", "c", ""))
	require.Equal(t, 200, rpc.Status, rpc.Raw)
	assert.Equal(t, "ref-c-"+marker, rpc.Body["external_ref"])

	// Erase: the inline part is refused, the committed part erased.
	er := l.Do("POST", "/v1/erasures", `{"keys":["before-00001"]}`)
	require.Equal(t, 409, er.Status, er.Raw)
	assert.Equal(t, "payloads_inline", er.Code())
	er = l.Do("POST", "/v1/erasures", `{"keys":["before-00001","before-00002"],"reason":"asked"}`)
	require.Equal(t, 201, er.Status, er.Raw)
	assert.Equal(t, float64(1), er.Body["count"], "only the commit after the switch: %s", er.Raw)
	assert.Equal(t, float64(1), er.Body["inline"], er.Raw)
	er = l.Do("POST", "/v1/erasures", `{"subject":"person-`+marker+`"}`)
	require.Equal(t, 201, er.Status, er.Raw)
	assert.Equal(t, float64(1), er.Body["count"], er.Raw)
	kc = l.Do("GET", "/v1/effects/after-000001", "")
	assert.NotContains(t, kc.Raw, "c-"+marker)
	assert.Contains(t, kc.Raw, `"erased":{`)
	kb := l.Do("GET", "/v1/effects/before-00002", "")
	assert.NotContains(t, kb.Raw, "b-"+marker)

	// Retention sweeps the committed part only, started without a restart.
	tokD := l.Reserve(t, switchResv("after-000002", "e1", "d", ""))
	l.Commit(t, "after-000002", `{"reservation":"`+tokD+`","outcome":"succeeded","result":{"to":"d-`+marker+`"}}`)
	head := func() float64 { return l.Do("GET", "/v1/head", "").Body["seq"].(float64) }
	before := head()
	clock.advance(61 * time.Second)
	require.Eventually(t, func() bool { return head() == before+1 }, 20*time.Second, 20*time.Millisecond, "one sweep erased: %s", l.Logs())
	e := l.Do("GET", fmt.Sprintf("/v1/erasures/%d", int(before)+1), "")
	require.Equal(t, 200, e.Status, e.Raw)
	assert.Equal(t, true, e.Body["retention"])
	for _, rg := range e.Body["ranges"].([]any) {
		assert.Greater(t, rg.([]any)[0].(float64), switchAt, "nothing of the inline part: %s", e.Raw)
	}
	assert.NotContains(t, l.Do("GET", "/v1/effects/after-000002", "").Raw, "d-"+marker)
	assert.Contains(t, l.Do("GET", "/v1/effects/before-00001", "").Raw, "a-"+marker, "the inline part stays")

	// A key after the sweep keeps its values, and the file shows them.
	tokE := l.Reserve(t, switchResv("after-000003", "e1", "e", ""))
	l.Commit(t, "after-000003", `{"reservation":"`+tokE+`","outcome":"succeeded","result":{"to":"e-`+marker+`"}}`)
	require.NoError(t, l.Stop())
	for _, args := range [][]string{{"show", "--db", db, "--json", "after-000003"}, {"receipts", "--db", db, "--json"}, {"export", "--db", db}} {
		out, stderr, code := ledgerctl(t, args...)
		require.Equal(t, 0, code, "%v: %s", args, stderr)
		assert.Contains(t, out, "e-"+marker, "%v", args)
		if args[0] != "show" {
			assert.Contains(t, out, "a-"+marker, "%v: the inline part", args)
		}
	}
	out, stderr, code := ledgerctl(t, "namespace", "list", "--db", db)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, fmt.Sprintf("committed after %d", int(switchAt)))
	state := filepath.Join(t.TempDir(), "state.json")
	out, stderr, code = ledgerctl(t, "verify", "--db", db, "--state", state)
	require.Equal(t, 0, code, "%s%s", out, stderr)

	// A restart keeps the mode: a new key is keyed and committed.
	l = clock.start(t, db, "--default-payloads", "inline")
	assert.Equal(t, "committed", l.Do("GET", "/v1/derivation-key", "").Body["payloads"])
	tokF := l.Reserve(t, switchResv("after-000004", "e1", "f", ""))
	c = l.Commit(t, "after-000004", `{"reservation":"`+tokF+`","outcome":"failed","error":{"code":"BOUNCED","message":"no `+marker+`","retryable":false}}`)
	rec = l.Do("GET", fmt.Sprintf("/v1/receipts/%d", int(c.Body["receipt"].(map[string]any)["seq"].(float64))), "")
	assert.Regexp(t, `^pc1:`, rec.Body["commitments"].(map[string]any)["error_message"], rec.Raw)
	assert.True(t, strings.HasPrefix(rec.Body["input_hash"].(string), ledger.KeyedHashPrefix), rec.Raw)
	out, stderr, code = ledgerctl(t, "verify", "--server", l.URL)
	require.Equal(t, 0, code, "%s%s", out, stderr)
	require.NoError(t, l.Stop())
	out, stderr, code = ledgerctl(t, "verify", "--db", db, "--state", state, "--incremental")
	require.Equal(t, 0, code, "%s%s", out, stderr)
	out, stderr, code = ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, "%s%s", out, stderr)
}

// TestPayloadSwitch_replicas: two ledgerd replicas on one PostgreSQL
// database. One switches the namespace; the other, which has served it
// inline, follows at once: its next receipts are committed and keyed, its
// derivation key and listing say committed (SPEC §14).
func TestPayloadSwitch_replicas(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	a, b := startReplicas(t, url, "--default-payloads", "inline")
	tok := b.Reserve(t, switchResv("rep-before-1", "e1", "x", ""))
	b.Commit(t, "rep-before-1", `{"reservation":"`+tok+`","outcome":"succeeded","result":{"n":1}}`)
	assert.Equal(t, "inline", b.Do("GET", "/v1/derivation-key", "").Body["payloads"])
	r := a.Do("PUT", "/v1/namespaces/default/policy", `{"payloads":"committed"}`)
	require.Equal(t, 200, r.Status, r.Raw)

	tok = b.Reserve(t, switchResv("rep-after-01", "e1", "y", ""))
	c := b.Commit(t, "rep-after-01", `{"reservation":"`+tok+`","outcome":"succeeded","result":{"n":2}}`)
	rec := b.Do("GET", fmt.Sprintf("/v1/receipts/%d", int(c.Body["receipt"].(map[string]any)["seq"].(float64))), "")
	assert.Regexp(t, `^pc1:`, rec.Body["commitments"].(map[string]any)["result"], rec.Raw)
	assert.True(t, strings.HasPrefix(rec.Body["input_hash"].(string), ledger.KeyedHashPrefix), rec.Raw)
	assert.Equal(t, map[string]any{"n": float64(2)}, rec.Body["result"])
	assert.Equal(t, "committed", b.Do("GET", "/v1/derivation-key", "").Body["payloads"])
	// b's policy write after a's switch records the member too.
	r = b.Do("PUT", "/v1/namespaces/default/policy", `{"self_approval":"allow"}`)
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, "committed", r.Body["policy"].(map[string]any)["payloads"], r.Raw)
	require.NoError(t, a.Stop())
	require.NoError(t, b.Stop())
	out, stderr, code := ledgerctl(t, "verify", "--db", url)
	require.Equal(t, 0, code, "%s%s", out, stderr)
}

// TestPayloadSwitch_portable: portable receipts of a switched namespace
// (SPEC §14): one of the inline part is as inline (its values in the
// receipt, no "payloads"), one of the committed part carries commitments
// and opens them in "payloads"; check-proof accepts both.
func TestPayloadSwitch_portable(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		dir := t.TempDir()
		marker := randomMarker(t)
		key, vkey := keygen(t, dir, "ex.test")
		l := startLedgerdEnv(t, nil, db, "--signing-key", key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms",
			"--default-payloads", "inline")
		tok := l.Reserve(t, switchResv("port-before1", "e1", "a", ""))
		l.Commit(t, "port-before1", `{"reservation":"`+tok+`","outcome":"succeeded","result":{"to":"a-`+marker+`"}}`) // 2
		require.Equal(t, 200, l.Do("PUT", "/v1/namespaces/default/policy", `{"payloads":"committed"}`).Status)        // 3
		tok = l.Reserve(t, switchResv("port-after01", "e1", "b", ""))
		l.Commit(t, "port-after01", `{"reservation":"`+tok+`","outcome":"succeeded","result":{"to":"b-`+marker+`"}}`) // 5
		waitCheckpoint(t, l, vkey, 5)
		for _, c := range []struct {
			seq       string
			committed bool
		}{{"2", false}, {"5", true}} {
			out, stderr, code := ledgerctl(t, "prove", "--server", l.URL, c.seq)
			require.Equal(t, 0, code, stderr)
			var p struct {
				Receipt  map[string]any               `json:"receipt"`
				Payloads map[string]map[string]string `json:"payloads"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &p), out)
			if c.committed {
				assert.Regexp(t, `^pc1:`, p.Receipt["result_text"], out)
				assert.Equal(t, `{"to":"b-`+marker+`"}`, p.Payloads["result"]["value"], out)
			} else {
				assert.Nil(t, p.Payloads, out)
				assert.Contains(t, out, "a-"+marker)
			}
			f := filepath.Join(t.TempDir(), "p.json")
			require.NoError(t, os.WriteFile(f, []byte(out), 0o644))
			got, stderr, code := ledgerctl(t, "check-proof", f, "--vkey", vkey)
			require.Equal(t, 0, code, got+stderr)
			assert.Contains(t, got, "valid: receipt "+c.seq)
		}
	})
}
