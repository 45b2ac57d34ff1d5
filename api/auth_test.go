package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// MustOpenTokens opens the tokens of the ledger at path.
func MustOpenTokens(tb testing.TB, path string) *ledger.Tokens {
	tb.Helper()
	toks, err := sqlite.OpenTokens(context.Background(), path)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = toks.Close() })
	return toks
}

// mustCreate creates the token name with role (limited to namespaces,
// if any) and returns it.
func mustCreate(tb testing.TB, toks *ledger.Tokens, name, role string, namespaces ...string) string {
	tb.Helper()
	tok, err := toks.Create(context.Background(), name, role, namespaces...)
	require.NoError(tb, err)
	return tok
}

func TestServer_auth(t *testing.T) {
	t.Parallel()
	// The ledger's clock moves only when the test moves it: the 10 ms
	// lease ends when the test says, whatever the machine's load.
	db := ledgertest.Open(t)
	clock := db.Clock
	toks := MustOpenTokens(t, db.Path())
	var err error
	tok := map[string]string{}
	for _, role := range []string{ledger.RoleReader, ledger.RoleWriter, ledger.RoleAdmin} {
		tok[role], err = toks.Create(context.Background(), role+"-bot", role)
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(tok[role], ledger.TokenPrefix))
		assert.GreaterOrEqual(t, len(tok[role]), 4+12+1+64, "≥ 256 random bits")
	}
	_, err = toks.Create(context.Background(), "reader-bot", ledger.RoleReader)
	assert.ErrorIs(t, err, ledger.ErrTokenExists)
	srv := MustServe(t, api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	bearer := func(role string) []string { return []string{"Authorization", "Bearer " + tok[role]} }
	body := `{"idempotency_key":"auth-key-0001","execution_id":"e","tool":"t","effect":"write","lease_ms":10}`

	for _, tt := range []struct {
		desc, method, path, body string
		header                   []string
		wantStatus               int
		wantCode                 string
	}{
		{"no token", "POST", "/v1/effects/reserve", body, nil, 401, "unauthorized"},
		{"not bearer", "POST", "/v1/effects/reserve", body, []string{"Authorization", "Basic eDp5"}, 401, "unauthorized"},
		{"forged token", "POST", "/v1/effects/reserve", body, []string{"Authorization", "Bearer " + tok["writer"][:20] + strings.Repeat("0", 64)}, 401, "unauthorized"},
		{"garbage token", "POST", "/v1/effects/reserve", body, []string{"Authorization", "Bearer nope"}, 401, "unauthorized"},
		{"reader may not write", "POST", "/v1/effects/reserve", body, bearer("reader"), 403, "forbidden"},
		{"writer may not list receipts", "GET", "/v1/receipts", "", bearer("writer"), 403, "forbidden"},
		{"writer may not read one receipt", "GET", "/v1/receipts/1", "", bearer("writer"), 403, "forbidden"},
		{"writer may look up a key it works with", "GET", "/v1/effects/auth-key-0001", "", bearer("writer"), 404, "unknown_key"},
		{"writer may read the head", "GET", "/v1/head", "", bearer("writer"), 200, ""},
		{"401 does not reveal keys", "GET", "/v1/effects/no-such-key-1", "", nil, 401, "unauthorized"},
		{"writer reserves", "POST", "/v1/effects/reserve", body, bearer("writer"), 201, ""},
		{"reader reads", "GET", "/v1/effects/auth-key-0001", "", bearer("reader"), 200, ""},
		{"writer may not resolve", "POST", "/v1/effects/auth-key-0001/resolve", `{"outcome":"failed","error":{"code":"X"},"note":"n"}`, bearer("writer"), 403, "forbidden"},
		{"admin resolves (after the 10 ms lease)", "POST", "/v1/effects/auth-key-0001/resolve", `{"outcome":"failed","error":{"code":"X"},"note":"checked"}`, bearer("admin"), 201, ""},
		{"admin reads", "GET", "/v1/head", "", bearer("admin"), 200, ""},
		{"healthz open", "GET", "/healthz", "", nil, 200, ""},
		{"readyz open", "GET", "/readyz", "", nil, 200, ""},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			if strings.Contains(tt.desc, "after the 10 ms lease") {
				clock.Advance(50 * time.Millisecond)
			}
			r := do(t, srv, tt.method, tt.path, tt.body, tt.header...)
			assert.Equal(t, tt.wantStatus, r.status, r.raw)
			assert.Equal(t, tt.wantCode, r.code())
			if tt.wantStatus == 401 {
				assert.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer")
			}
		})
	}
	// The token's name is the actor of the receipts it causes.
	r := do(t, srv, "GET", "/v1/receipts", "", bearer("reader")...)
	rs := r.body["receipts"].([]any)
	require.Len(t, rs, 2)
	assert.Equal(t, "writer-bot", rs[0].(map[string]any)["actor"])
	assert.Equal(t, "admin-bot", rs[1].(map[string]any)["actor"])

	// Revocation takes effect at once.
	require.NoError(t, toks.Revoke(context.Background(), "reader-bot"))
	r = do(t, srv, "GET", "/v1/head", "", bearer("reader")...)
	assert.Equal(t, 401, r.status)
}

func TestServer_rateLimit(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	toks := MustOpenTokens(t, db.Path())
	a := mustCreate(t, toks, "bot-a", ledger.RoleReader)
	b := mustCreate(t, toks, "bot-b", ledger.RoleReader)
	s := api.NewServer(db.Ledger, api.Config{Logger: quiet,
		RateLimit: 0.5, RateBurst: 3}) // a slow refill: the test cannot outrun it
	srv := MustServe(t, s)
	for range 3 {
		assert.Equal(t, 200, do(t, srv, "GET", "/v1/head", "", "Authorization", "Bearer "+a).status)
	}
	r := do(t, srv, "GET", "/v1/head", "", "Authorization", "Bearer "+a)
	assert.Equal(t, 429, r.status)
	assert.Equal(t, "rate_limited", r.code())
	assert.NotEmpty(t, r.header.Get("Retry-After"))
	assert.Equal(t, 200, do(t, srv, "GET", "/v1/head", "", "Authorization", "Bearer "+b).status, "buckets are per token")
}

// TestServer_rateLimitSharedByReplicas: with three replicas each enforces
// a third of the burst, so that the total stays within the limit.
func TestServer_rateLimitSharedByReplicas(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	toks := MustOpenTokens(t, db.Path())
	a := mustCreate(t, toks, "bot-a", ledger.RoleReader)
	s := api.NewServer(db.Ledger, api.Config{Logger: quiet,
		RateLimit: 0.5, RateBurst: 6, RateLimitShare: func() int { return 3 }})
	srv := MustServe(t, s)
	for range 2 {
		assert.Equal(t, 200, do(t, srv, "GET", "/v1/head", "", "Authorization", "Bearer "+a).status)
	}
	r := do(t, srv, "GET", "/v1/head", "", "Authorization", "Bearer "+a)
	assert.Equal(t, 429, r.status, "a third of the burst of 6")
}

// TestServer_scopedAdmin: an admin token limited to namespaces creates
// only the namespaces it names, and does not read the default
// namespace's verification status.
func TestServer_scopedAdmin(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	toks := MustOpenTokens(t, db.Path())
	tok := mustCreate(t, toks, "team-a", ledger.RoleAdmin, "a")
	srv := MustServe(t, api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	auth := []string{"Authorization", "Bearer " + tok}
	r := do(t, srv, "POST", "/v1/namespaces", `{"name":"b"}`, auth...)
	assert.Equal(t, 403, r.status)
	assert.Equal(t, "forbidden", r.code())
	assert.Equal(t, 201, do(t, srv, "POST", "/v1/namespaces", `{"name":"a"}`, auth...).status)
	assert.Equal(t, 403, do(t, srv, "GET", "/v1/verification", "", auth...).status)
	assert.Equal(t, 403, do(t, srv, "GET", "/v1/head", "", auth...).status)
	assert.Equal(t, 200, do(t, srv, "GET", "/v1/ns/a/head", "", auth...).status)
}
