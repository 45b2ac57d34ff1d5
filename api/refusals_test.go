package api_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// TestServer_contentEncoding: a body in a content coding is 415, whatever
// the bytes; identity is read as it is.
func TestServer_contentEncoding(t *testing.T) {
	t.Parallel()
	srv, db := MustOpenServer(t)
	body := `{"idempotency_key":"enc-key-0001","execution_id":"e","tool":"t","effect":"write"}`
	for _, enc := range []string{"gzip", "br", "deflate, identity", "x-anything"} {
		r := do(t, srv, "POST", "/v1/effects/reserve", body, "Content-Encoding", enc)
		assert.Equal(t, 415, r.status, enc)
		assert.Equal(t, "unsupported_media_type", r.code(), enc)
		assert.Equal(t, "identity", r.header.Get("Accept-Encoding"), enc)
	}
	assert.Zero(t, db.Head().Seq)
	assert.Equal(t, 201, do(t, srv, "POST", "/v1/effects/reserve", body, "Content-Encoding", "identity").status)
}

// TestServer_resultIsIJSON: result is held to the I-JSON rules input
// follows, and string members may not hold a lone surrogate.
func TestServer_resultIsIJSON(t *testing.T) {
	t.Parallel()
	srv, _ := MustOpenServer(t)
	for i, tt := range []struct {
		desc, fields, wantField string
	}{
		{"ErrNumberOutOfRange", `"result":[1e400]`, "result"},
		{"ErrLoneSurrogate", `"result":{"s":"\udfff"}`, "result"},
		{"ErrDuplicateMember", `"result":{"a":{"b":1,"b":1}}`, "result"},
		{"ErrLoneSurrogateInErrorMessage", `"outcome":"failed","error":{"code":"X","message":"\ud800x"}`, "error.message"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			key := "ijson-key-000" + string(rune('0'+i))
			r := do(t, srv, "POST", "/v1/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e","tool":"t","effect":"write"}`)
			require.Equal(t, 201, r.status, r.raw)
			fields := tt.fields
			if tt.wantField == "result" {
				fields = `"outcome":"succeeded",` + fields
			}
			r = do(t, srv, "POST", "/v1/effects/"+key+"/commit", `{"reservation":"`+r.body["reservation"].(string)+`",`+fields+`}`)
			assert.Equal(t, 400, r.status, r.raw)
			assert.Equal(t, tt.wantField, r.body["error"].(map[string]any)["details"].(map[string]any)["field"])
		})
	}
}

// TestServer_metricsScoped: /metrics needs a reader token once tokens
// exist, and a token limited to namespaces sees only theirs.
func TestServer_metricsScoped(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	path := db.Path()
	ctx := context.Background()
	require.NoError(t, db.Ledger.CreateNamespace(ctx, "payments", 0))
	require.NoError(t, db.Ledger.CreateNamespace(ctx, "hidden", 0))
	toks := MustOpenTokens(t, path)
	scoped := mustCreate(t, toks, "pay-reader", ledger.RoleReader, "payments")
	writer := mustCreate(t, toks, "gw", ledger.RoleWriter)
	srv := MustServe(t, api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	for _, ns := range []string{"payments", "hidden"} {
		r := do(t, srv, "POST", "/v1/ns/"+ns+"/effects/reserve", `{"idempotency_key":"metric-key-0001","execution_id":"e","tool":"t","effect":"write"}`,
			"Authorization", "Bearer "+writer)
		require.Equal(t, 201, r.status, r.raw)
	}
	get := func(token string) (int, string) {
		req, err := http.NewRequest("GET", srv.URL+"/metrics", nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(b)
	}
	status, _ := get("")
	assert.Equal(t, 401, status)
	status, _ = get(writer)
	assert.Equal(t, 403, status, "a writer token does not read")
	status, body := get(scoped)
	require.Equal(t, 200, status)
	assert.Contains(t, body, `namespace="payments"`)
	assert.NotContains(t, body, `namespace="hidden"`)
	assert.Contains(t, body, "go_goroutines", "series about no namespace stay")
}
