package test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPruneStatus drives GET /v1/ns/{ns}/prune (SPEC §16's prunable
// watermark) through the real binaries on SQLite and PostgreSQL: admins
// only; 409 not_prunable without a key TTL; in a namespace with one, a
// key in flight pins the watermark (named with its state and first seq)
// until it ends and ages past the TTL and the policy's min_keep_ms, after
// which the watermark reaches the head; nothing is appended.
func TestPruneStatus(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testPruneStatus)
}

func testPruneStatus(t *testing.T, db string) {
	clock := newTestClock(t, t0)
	l := clock.start(t, db)
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"aged","key_ttl_ms":60000}`).Status)
	require.NoError(t, l.Stop())
	admin := createToken(t, db, "ops", "admin")
	reader := createToken(t, db, "auditor", "reader")
	l = clock.start(t, db)
	auth := []string{"Authorization", "Bearer " + admin}

	r := l.Do("GET", "/v1/ns/aged/prune", "", "Authorization", "Bearer "+reader)
	assert.Equal(t, 403, r.Status, "a reader: %s", r.Raw)
	assert.Equal(t, 401, l.Do("GET", "/v1/ns/aged/prune", "").Status, "no token")
	r = l.Do("GET", "/v1/prune", "", auth...)
	require.Equal(t, 409, r.Status, r.Raw)
	assert.Equal(t, "not_prunable", r.Body["error"].(map[string]any)["code"], "default has no key TTL")

	reserve := func(key, lease string) string {
		rr := l.Do("POST", "/v1/ns/aged/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e1","tool":"mail.send","effect":"external"`+lease+`}`, auth...)
		require.Equal(t, 201, rr.Status, rr.Raw)
		return rr.Body["reservation"].(string)
	}
	commit := func(key, tok string) {
		c := l.Do("POST", "/v1/ns/aged/effects/"+key+"/commit", `{"reservation":"`+tok+`","outcome":"succeeded"}`, auth...)
		require.Equal(t, 201, c.Status, c.Raw)
	}
	commit("done-0000001", reserve("done-0000001", ""))
	open := reserve("open-0000001", `,"lease_ms":600000`)
	commit("done-0000002", reserve("done-0000002", ""))
	require.Equal(t, 200, l.Do("PUT", "/v1/namespaces/aged/policy", `{"archive":{"keep_ms":120000,"min_keep_ms":60000}}`, auth...).Status)

	clock.advance(2 * time.Minute)
	r = l.Do("GET", "/v1/ns/aged/prune", "", auth...)
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, map[string]any{"keep_ms": 120000.0, "min_keep_ms": 60000.0}, r.Body["archive"])
	w := r.Body["watermark"].(map[string]any)
	assert.Equal(t, 2.0, w["through"], "the open key's reserve (seq 3) pins: %s", r.Raw)
	assert.Equal(t, 6.0, w["head"], r.Raw) // 5 receipts of keys, the policy
	assert.Equal(t, 6.0, w["floor"], r.Raw)
	assert.Equal(t, map[string]any{"key": "open-0000001", "state": "reserved", "seq": 3.0}, w["pinned_by"], r.Raw)

	commit("open-0000001", open)
	clock.advance(2 * time.Minute)
	r = l.Do("GET", "/v1/ns/aged/prune", "", auth...)
	require.Equal(t, 200, r.Status, r.Raw)
	w = r.Body["watermark"].(map[string]any)
	assert.Equal(t, 7.0, w["through"], "every key ended and aged: %s", r.Raw)
	assert.Nil(t, w["pinned_by"], r.Raw)
	assert.Equal(t, 7.0, w["head"], "nothing appended by the reads")
}
