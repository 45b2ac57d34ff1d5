package test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestArchivePolicy drives SPEC §16's policy member "archive" through the
// real binaries on SQLite and PostgreSQL: recorded in RFC 8785 form and
// read back, a warning in a namespace without a key TTL (it can archive,
// never prune) and none in one with a TTL, each bad value a 400 naming the
// member with nothing appended, and a clean ledgerctl verify (--db and
// --server) of the policy receipts.
func TestArchivePolicy(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testArchivePolicy)
}

func testArchivePolicy(t *testing.T, db string) {
	l := StartLedgerd(t, db)
	const archive = `{"archive":{"min_keep_ms":3600000,"keep_ms":2592000000}}`
	r := l.Do("PUT", "/v1/namespaces/default/policy", archive)
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, true, r.Body["changed"])
	assert.Contains(t, r.Body["warnings"], "this namespace has no key TTL: its receipts can be archived, never pruned (docs/operations.md)")
	got := l.Do("GET", "/v1/namespaces/default/policy", "")
	require.Equal(t, 200, got.Status, got.Raw)
	text, err := json.Marshal(got.Body["policy"])
	require.NoError(t, err)
	assert.JSONEq(t, `{"archive":{"keep_ms":2592000000,"min_keep_ms":3600000}}`, string(text))
	seq := got.Body["seq"]

	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"aged","key_ttl_ms":86400000}`).Status)
	r = l.Do("PUT", "/v1/namespaces/aged/policy", archive)
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Nil(t, r.Body["warnings"], "a namespace with a key TTL prunes: %s", r.Raw)

	for bad, field := range map[string]string{
		`{"archive":{"keep_ms":2592000000}}`:                           "archive.min_keep_ms",
		`{"archive":{"min_keep_ms":3600000}}`:                          "archive.keep_ms",
		`{"archive":{"keep_ms":2592000000,"min_keep_ms":1000}}`:        "archive.min_keep_ms",
		`{"archive":{"keep_ms":60000,"min_keep_ms":3600000}}`:          "archive.keep_ms",
		`{"archive":{"keep_ms":2592000000,"min_keep_ms":60000,"x":1}}`: "archive.x",
		`{"archive":"30d"}`:                                            "archive",
	} {
		r := l.Do("PUT", "/v1/namespaces/default/policy", bad)
		require.Equal(t, 400, r.Status, "%s: %s", bad, r.Raw)
		assert.Equal(t, "invalid_request", r.Body["error"].(map[string]any)["code"], bad)
		assert.Equal(t, field, r.Body["error"].(map[string]any)["details"].(map[string]any)["field"], bad)
	}
	assert.Equal(t, seq, l.Do("GET", "/v1/namespaces/default/policy", "").Body["seq"], "a refused policy appends nothing")

	out, stderr, code := ledgerctl(t, "verify", "--server", l.URL)
	assert.Equal(t, 0, code, "%s%s", out, stderr)
	for _, ns := range []string{"default", "aged"} {
		out, stderr, code = ledgerctl(t, "verify", "--server", l.URL, "--namespace", ns)
		assert.Equal(t, 0, code, "%s: %s%s", ns, out, stderr)
	}
	require.NoError(t, l.Stop())
	out, stderr, code = ledgerctl(t, "verify", "--db", db, "--namespace", "aged")
	assert.Equal(t, 0, code, "%s%s", out, stderr)
}
