package openapicheck_test

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit/openapicheck"
)

const (
	hash     = "c536a7804a3ee6fc1e44013c9550bcb8eb839e87df00f32e9462edc720f7771d"
	token    = "rsv_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	reserved = `{"status":"reserved","idempotency_key":"refund-order-1234","key_generated":false,` +
		`"reservation":"` + token + `","attempt":1,"lease_expires_at":1764475230000,"takeover":false,` +
		`"retry":false,"receipt":{"seq":1,"hash":"` + hash + `"}}`
	reserveBody = `{"idempotency_key":"refund-order-1234","execution_id":"exec-1","tool":"payments.refund","effect":"write"}`
)

// receipt is the JSON form of the spec's first test-vector receipt.
const receipt = `{"seq":1,"kind":"reserve","idempotency_key":"refund-order-1234","key_generated":false,` +
	`"execution_id":"exec-1","attempt":1,"tool":"payments.refund","effect":"write","idempotent":true,` +
	`"input_hash":"sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8","outcome":"",` +
	`"external_ref":"","result":null,"error_code":"","error_message":"","retryable":false,` +
	`"lease_expires_at":1764475230000,"ref_seq":0,"actor":"","note":"","recorded_at":1764475200000,` +
	`"prev_hash":"0000000000000000000000000000000000000000000000000000000000000000","hash":"` + hash + `"}`

// checkpoint is a signed note of the form ledgerd serves (C2SP
// tlog-checkpoint; the root and signature are arbitrary bytes).
var checkpoint = "ex.test/default\n3\n" + base64.StdEncoding.EncodeToString(make([]byte, 32)) + "\n\n\u2014 ex.test " +
	base64.StdEncoding.EncodeToString(make([]byte, 68)) + "\n"

func errorBody(code string) string {
	return `{"error":{"code":"` + code + `","message":"m","details":{}}}`
}

func TestLoad(t *testing.T) {
	doc, err := openapicheck.Load()
	require.NoError(t, err, "api/openapi.yaml is a valid OpenAPI document")
	assert.Equal(t, "3.1.0", doc.T.OpenAPI)
	assert.Contains(t, doc.Operations(), "POST /v1/effects/reserve")
	assert.Equal(t, []string{"POST"}, doc.Methods("/v1/effects/reserve"))
	assert.Nil(t, doc.Methods("/nope"))
}

func TestParse_ErrInvalid(t *testing.T) {
	for _, tc := range []struct{ desc, doc string }{
		{"not yaml", "openapi: [3.1.0"},
		{"no info", "openapi: 3.1.0\npaths: {}\n"},
		{"x-path-regexp with braces", "openapi: 3.1.0\ninfo: {title: t, version: '1'}\npaths:\n  /x/{p}:\n    get:\n      parameters:\n        - {name: p, in: path, required: true, schema: {type: string}, x-path-regexp: 'a{2}'}\n      responses:\n        '200': {description: ok}\n"},
		{"dangling ref", "openapi: 3.1.0\ninfo: {title: t, version: '1'}\npaths:\n  /x:\n    get:\n      responses:\n        '200': {$ref: '#/components/responses/Nope'}\n"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := openapicheck.Parse([]byte(tc.doc))
			assert.Error(t, err)
		})
	}
}

// TestDoc_Check shows that the checker fails on each kind of mismatch, so
// a passing e2e suite means something.
func TestDoc_Check(t *testing.T) {
	doc, err := openapicheck.Load()
	require.NoError(t, err)
	for _, tc := range []struct {
		desc    string
		x       openapicheck.Exchange
		wantOp  string
		wantErr string
	}{
		{desc: "OK reserved", x: openapicheck.JSONExchange("POST", "/v1/effects/reserve", reserveBody, 201, reserved), wantOp: "POST /v1/effects/reserve"},
		{desc: "OK error", x: openapicheck.JSONExchange("POST", "/v1/effects/reserve", reserveBody, 409, errorBody("in_progress"), "Retry-After", "3"), wantOp: "POST /v1/effects/reserve"},
		{desc: "OK key with slash", x: openapicheck.JSONExchange("GET", "/v1/effects/a%2Fb-0000001", "", 404, errorBody("unknown_key")), wantOp: "GET /v1/effects/{key}"},
		{desc: "OK not found", x: openapicheck.JSONExchange("GET", "/v2/nothing", "", 404, errorBody("not_found"))},
		{desc: "OK method not allowed", x: openapicheck.JSONExchange("DELETE", "/v1/head", "", 405, errorBody("method_not_allowed"), "Allow", "GET, HEAD")},
		{desc: "OK head", x: openapicheck.JSONExchange("HEAD", "/v1/head", "", 200, ""), wantOp: "HEAD /v1/head"},
		{desc: "OK receipt", x: openapicheck.JSONExchange("GET", "/v1/receipts/1", "", 200, receipt), wantOp: "GET /v1/receipts/{seq}"},
		{
			desc: "OK malformed receipt",
			x: openapicheck.JSONExchange("GET", "/v1/receipts/1", "", 200, strings.Replace(strings.Replace(receipt, `"seq":1`, `"seq":null`, 1),
				`"hash":"`+hash+`"}`, `"hash":"`+hash+`","malformed":{"seq":"'x'"}}`, 1)),
			wantOp: "GET /v1/receipts/{seq}",
		},
		{
			desc:   "OK result as text",
			x:      openapicheck.JSONExchange("GET", "/v1/receipts/1", "", 200, strings.Replace(receipt, `"result":null`, `"result":"{ \"a\": 1 }","result_encoding":"text"`, 1)),
			wantOp: "GET /v1/receipts/{seq}",
		},
		{
			desc:    "ErrNullWithoutMalformed",
			x:       openapicheck.JSONExchange("GET", "/v1/receipts/1", "", 200, strings.Replace(receipt, `"seq":1`, `"seq":null`, 1)),
			wantOp:  "GET /v1/receipts/{seq}",
			wantErr: "seq",
		},
		{
			desc:    "ErrMalformedNamesAString",
			x:       openapicheck.JSONExchange("GET", "/v1/receipts/1", "", 200, strings.Replace(receipt, `"hash":"`+hash+`"}`, `"hash":"`+hash+`","malformed":{"tool":"x"}}`, 1)),
			wantOp:  "GET /v1/receipts/{seq}",
			wantErr: "malformed",
		},
		{
			desc:    "ErrMissingField",
			x:       openapicheck.JSONExchange("POST", "/v1/effects/reserve", reserveBody, 201, strings.Replace(reserved, `"takeover":false,`, "", 1)),
			wantOp:  "POST /v1/effects/reserve",
			wantErr: "takeover",
		},
		{
			desc:    "ErrExtraField",
			x:       openapicheck.JSONExchange("POST", "/v1/effects/reserve", reserveBody, 201, strings.Replace(reserved, `"retry":false`, `"retry":false,"secret":1`, 1)),
			wantOp:  "POST /v1/effects/reserve",
			wantErr: "secret",
		},
		{
			desc:    "ErrBadHash",
			x:       openapicheck.JSONExchange("POST", "/v1/effects/reserve", reserveBody, 201, strings.Replace(reserved, hash, "XYZ", 1)),
			wantOp:  "POST /v1/effects/reserve",
			wantErr: "hash",
		},
		{
			desc:    "ErrUndeclaredStatus",
			x:       openapicheck.JSONExchange("POST", "/v1/effects/reserve", reserveBody, 418, errorBody("internal")),
			wantOp:  "POST /v1/effects/reserve",
			wantErr: "status",
		},
		{
			desc:    "ErrCodeNotForStatus",
			x:       openapicheck.JSONExchange("POST", "/v1/effects/reserve", reserveBody, 409, errorBody("unknown_key")),
			wantOp:  "POST /v1/effects/reserve",
			wantErr: "code",
		},
		{
			desc:    "ErrMissingRetryAfter",
			x:       openapicheck.JSONExchange("GET", "/v1/head", "", 429, errorBody("rate_limited")),
			wantOp:  "GET /v1/head",
			wantErr: "Retry-After",
		},
		{
			desc:    "ErrNotJSON",
			x:       openapicheck.JSONExchange("GET", "/v1/head", "", 200, "", "Content-Type", "text/plain"),
			wantOp:  "GET /v1/head",
			wantErr: "Content-Type",
		},
		{
			desc:    "ErrAcceptedForbiddenRequest",
			x:       openapicheck.JSONExchange("POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","wait_ms":999999}`, 201, reserved),
			wantOp:  "POST /v1/effects/reserve",
			wantErr: "request the document forbids",
		},
		{
			desc:    "ErrUnknownPathNot404",
			x:       openapicheck.JSONExchange("GET", "/v2/nothing", "", 200, `{}`),
			wantErr: "404",
		},
		{
			desc:    "ErrWrongAllow",
			x:       openapicheck.JSONExchange("PUT", "/v1/head", "", 405, errorBody("method_not_allowed"), "Allow", "GET"),
			wantErr: "Allow",
		},
		{
			desc:    "ErrMissingAllow",
			x:       openapicheck.JSONExchange("PUT", "/v1/head", "", 405, errorBody("method_not_allowed")),
			wantErr: "Allow",
		},
		{
			desc:   "OK tile of several segments",
			x:      openapicheck.JSONExchange("GET", "/log/default/tile/0/x001/234.p/5", "", 200, strings.Repeat("\x00\xff", 80), "Content-Type", "application/octet-stream", "Cache-Control", "no-cache", "X-Content-Type-Options", "nosniff"),
			wantOp: "GET /log/{ns}/{tile}",
		},
		{
			desc:   "OK full tile",
			x:      openapicheck.JSONExchange("GET", "/log/default/tile/entries/000", "", 200, "\x00\x20", "Content-Type", "application/octet-stream", "Cache-Control", "public, max-age=31536000, immutable", "X-Content-Type-Options", "nosniff"),
			wantOp: "GET /log/{ns}/{tile}",
		},
		{
			desc:   "OK tile beyond the tree",
			x:      openapicheck.JSONExchange("GET", "/log/default/tile/1/x002/000", "", 404, errorBody("not_found")),
			wantOp: "GET /log/{ns}/{tile}",
		},
		{
			desc:    "ErrTileWithoutCacheControl",
			x:       openapicheck.JSONExchange("GET", "/log/default/tile/0/000", "", 200, "x", "Content-Type", "application/octet-stream", "X-Content-Type-Options", "nosniff"),
			wantOp:  "GET /log/{ns}/{tile}",
			wantErr: "Cache-Control",
		},
		{
			desc:    "ErrTileCachedBriefly",
			x:       openapicheck.JSONExchange("GET", "/log/default/tile/0/000", "", 200, "x", "Content-Type", "application/octet-stream", "Cache-Control", "max-age=60", "X-Content-Type-Options", "nosniff"),
			wantOp:  "GET /log/{ns}/{tile}",
			wantErr: "Cache-Control",
		},
		{
			desc:    "ErrMalformedTileServed",
			x:       openapicheck.JSONExchange("GET", "/log/default/tile/0/abc", "", 200, "x", "Content-Type", "application/octet-stream", "Cache-Control", "no-cache", "X-Content-Type-Options", "nosniff"),
			wantOp:  "GET /log/{ns}/{tile}",
			wantErr: "request the document forbids",
		},
		{
			desc:    "ErrTileNotCheckpointed",
			x:       openapicheck.JSONExchange("GET", "/log/default/tile/0/000", "", 404, errorBody("not_checkpointed")),
			wantOp:  "GET /log/{ns}/{tile}",
			wantErr: "code",
		},
		{
			desc:   "OK checkpoint",
			x:      openapicheck.JSONExchange("GET", "/log/default/checkpoint", "", 200, checkpoint, "Content-Type", "text/plain; charset=utf-8", "Cache-Control", "no-cache", "X-Content-Type-Options", "nosniff"),
			wantOp: "GET /log/{ns}/checkpoint",
		},
		{
			desc:   "OK no checkpoint yet",
			x:      openapicheck.JSONExchange("GET", "/log/default/checkpoint", "", 404, errorBody("not_checkpointed")),
			wantOp: "GET /log/{ns}/checkpoint",
		},
		{
			desc:    "ErrCheckpointNotANote",
			x:       openapicheck.JSONExchange("GET", "/log/default/checkpoint", "", 200, "ex.test/default\n3\n", "Content-Type", "text/plain; charset=utf-8", "Cache-Control", "no-cache", "X-Content-Type-Options", "nosniff"),
			wantOp:  "GET /log/{ns}/checkpoint",
			wantErr: "pattern",
		},
		{
			desc:   "OK portable receipt",
			x:      openapicheck.JSONExchange("GET", "/v1/receipts/1/proof", "", 200, `{"receipt":`+receipt+`,"leaf_index":0,"inclusion":[],"checkpoint":"`+strings.ReplaceAll(checkpoint, "\n", `\n`)+`"}`),
			wantOp: "GET /v1/receipts/{seq}/proof",
		},
		{
			desc:   "OK portable receipt not checkpointed",
			x:      openapicheck.JSONExchange("GET", "/v1/receipts/1/proof", "", 404, errorBody("not_checkpointed")),
			wantOp: "GET /v1/receipts/{seq}/proof",
		},
		{
			desc:    "ErrInclusionUpperHex",
			x:       openapicheck.JSONExchange("GET", "/v1/proof/inclusion?seq=1", "", 200, `{"seq":1,"leaf_index":0,"tree_size":2,"root":"`+hash+`","hashes":["`+strings.ToUpper(hash)+`"]}`),
			wantOp:  "GET /v1/proof/inclusion",
			wantErr: "hashes",
		},
		{
			desc:   "OK consistency",
			x:      openapicheck.JSONExchange("GET", "/v1/proof/consistency?from=0", "", 200, `{"from":0,"to":2,"root_from":"`+hash+`","root_to":"`+hash+`","hashes":[]}`),
			wantOp: "GET /v1/proof/consistency",
		},
		{
			desc:    "ErrNotFoundShape",
			x:       openapicheck.JSONExchange("GET", "/v2/nothing", "", 404, `{"error":"nope"}`),
			wantErr: "error",
		},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			op, err := doc.Check(context.Background(), tc.x)
			assert.Equal(t, tc.wantOp, op)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

// TestTransport checks and reports real exchanges, and hands back bodies
// intact.
func TestTransport(t *testing.T) {
	doc, err := openapicheck.Load()
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/head" {
			_, _ = w.Write([]byte(`{"seq":0,"hash":"` + strings.Repeat("0", 64) + `"}`))
			return
		}
		w.WriteHeader(201)
		_, _ = w.Write(b) // echo: not a reserve response
	}))
	defer srv.Close()
	var mu sync.Mutex
	var problems, ops []string
	c := &http.Client{Transport: &openapicheck.Transport{
		Base: http.DefaultTransport, Doc: doc,
		Report: func(_ *http.Request, err error) { mu.Lock(); problems = append(problems, err.Error()); mu.Unlock() },
		Observe: func(op string, x openapicheck.Exchange) {
			mu.Lock()
			ops = append(ops, op)
			mu.Unlock()
		},
	}}

	res, err := c.Get(srv.URL + "/v1/head")
	require.NoError(t, err)
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	assert.Contains(t, string(b), `"seq":0`, "the body survives the check")

	res, err = c.Post(srv.URL+"/v1/effects/reserve", "application/json", strings.NewReader(reserveBody))
	require.NoError(t, err)
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	assert.Equal(t, reserveBody, string(b), "the server saw the request body")

	mu.Lock()
	assert.Equal(t, []string{"GET /v1/head", "POST /v1/effects/reserve"}, ops)
	require.Len(t, problems, 1, "only the echo is wrong: %v", problems)
	assert.Contains(t, problems[0], "POST /v1/effects/reserve")
	mu.Unlock()

	// A server the document does not describe is passed through unchecked.
	c.Transport.(*openapicheck.Transport).Serves = func(*http.Request) bool { return false }
	res, err = c.Post(srv.URL+"/v1/effects/reserve", "application/json", strings.NewReader(reserveBody))
	require.NoError(t, err)
	res.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, problems, 1, "nothing new reported")
	assert.Len(t, ops, 2, "nothing new observed")
}
