package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// quiet discards logs.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// MustServe serves s through httptest until the test ends.
func MustServe(tb testing.TB, s *api.Server) *httptest.Server {
	tb.Helper()
	srv := httptest.NewServer(s)
	tb.Cleanup(srv.Close)
	return srv
}

// MustOpenServer serves a new ledger in a temp dir through httptest.
func MustOpenServer(tb testing.TB) (*httptest.Server, *ledgertest.DB) {
	tb.Helper()
	db := ledgertest.Open(tb, ledgertest.WithNow(time.Now))
	return MustServe(tb, api.NewServer(db.Ledger, api.Config{Logger: quiet})), db
}

// response is a decoded HTTP response.
type response struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (r response) code() string {
	e, _ := r.body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

func (r response) field() string {
	e, _ := r.body["error"].(map[string]any)
	d, _ := e["details"].(map[string]any)
	f, _ := d["field"].(string)
	return f
}

func do(tb testing.TB, srv *httptest.Server, method, path, body string, header ...string) response {
	tb.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	require.NoError(tb, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := srv.Client().Do(req)
	require.NoError(tb, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(tb, err)
	out := response{status: res.StatusCode, header: res.Header, raw: string(raw)}
	if method != http.MethodHead {
		require.NoError(tb, json.Unmarshal(raw, &out.body), "body %q", raw)
		assert.Equal(tb, "application/json", res.Header.Get("Content-Type"))
	}
	return out
}

const reserveBody = `{"idempotency_key":"refund-order-1234","execution_id":"exec-1","tool":"payments.refund","effect":"write","input":{"order":7}}`

func TestServer_walkthrough(t *testing.T) {
	t.Parallel()
	srv, db := MustOpenServer(t)

	r := do(t, srv, "GET", "/v1/head", "")
	assert.Equal(t, 200, r.status)
	assert.Equal(t, map[string]any{"seq": 0.0, "hash": strings.Repeat("0", 64)}, r.body)

	r = do(t, srv, "POST", "/v1/effects/reserve", reserveBody)
	require.Equal(t, 201, r.status, r.raw)
	assert.Equal(t, "reserved", r.body["status"])
	assert.Equal(t, "refund-order-1234", r.body["idempotency_key"])
	assert.Equal(t, false, r.body["key_generated"])
	assert.Equal(t, 1.0, r.body["attempt"])
	assert.NotZero(t, r.body["lease_expires_at"])
	assert.Equal(t, map[string]any{"seq": 1.0, "hash": db.Head().Hash.String()}, r.body["receipt"])
	token := r.body["reservation"].(string)

	r = do(t, srv, "POST", "/v1/effects/reserve", reserveBody)
	assert.Equal(t, 409, r.status)
	assert.Equal(t, "in_progress", r.code())
	assert.NotEmpty(t, r.header.Get("Retry-After"))

	commit := `{"reservation":"` + token + `","outcome":"succeeded","external_ref":"re_3Pq9","result":{"amount": 1200, "currency":"eur"}}`
	r = do(t, srv, "POST", "/v1/effects/refund-order-1234/commit", commit)
	require.Equal(t, 201, r.status, r.raw)
	assert.Equal(t, "committed", r.body["status"])
	assert.Equal(t, false, r.body["late"])
	assert.Equal(t, 2.0, r.body["receipt"].(map[string]any)["seq"])
	assert.Empty(t, r.header.Get("Idempotent-Replayed"))
	committed := r.body

	r = do(t, srv, "POST", "/v1/effects/refund-order-1234/commit", commit)
	assert.Equal(t, 200, r.status)
	assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	assert.Equal(t, committed, r.body, "the original 201 body")

	r = do(t, srv, "POST", "/v1/effects/reserve", strings.Replace(reserveBody, "exec-1", "exec-2", 1))
	require.Equal(t, 200, r.status, r.raw)
	assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	assert.Equal(t, "replayed", r.body["status"])
	assert.Equal(t, "succeeded", r.body["outcome"])
	assert.Equal(t, "re_3Pq9", r.body["external_ref"])
	assert.Equal(t, map[string]any{"amount": 1200.0, "currency": "eur"}, r.body["result"])
	assert.Contains(t, r.raw, `"result":{"amount":1200,"currency":"eur"}`, "compact, verbatim")
	assert.Equal(t, committed["receipt"], r.body["original"])
	assert.Equal(t, 3.0, r.body["receipt"].(map[string]any)["seq"])

	r = do(t, srv, "GET", "/v1/effects/refund-order-1234", "")
	require.Equal(t, 200, r.status)
	assert.Equal(t, "succeeded", r.body["state"])
	assert.Len(t, r.body["receipts"], 3)

	r = do(t, srv, "GET", "/v1/receipts?limit=2", "")
	require.Equal(t, 200, r.status)
	assert.Len(t, r.body["receipts"], 2)
	assert.Equal(t, 2.0, r.body["next_after"])
	r = do(t, srv, "GET", "/v1/receipts?after=2", "")
	assert.Len(t, r.body["receipts"], 1)
	assert.Nil(t, r.body["next_after"])
	r = do(t, srv, "GET", "/v1/receipts?kind=commit&tool=payments.refund&execution_id=exec-1&key=refund-order-1234", "")
	assert.Len(t, r.body["receipts"], 1)

	r = do(t, srv, "GET", "/v1/receipts/2", "")
	require.Equal(t, 200, r.status)
	assert.Equal(t, "commit", r.body["kind"])
	assert.Equal(t, 1.0, r.body["ref_seq"])
	members := 24 // 21 fields, prev_hash, hash and result_text (SPEC §9.1)
	if db.Payloads() == ledger.PayloadsCommitted {
		members += 3 // commitments, salts and erased (SPEC §14)
	}
	assert.Len(t, r.body, members)
	assert.Equal(t, "re_3Pq9", r.body["external_ref"], "the value, not its commitment")
	assert.Equal(t, `{"amount":1200,"currency":"eur"}`, r.body["result_text"])

	r = do(t, srv, "GET", "/v1/head", "")
	assert.Equal(t, 3.0, r.body["seq"])
}

func TestServer_Reserve_keys(t *testing.T) {
	t.Parallel()
	srv, _ := MustOpenServer(t)
	base := `{"execution_id":"exec-1","tool":"t.x","effect":"write"`
	for _, tt := range []struct {
		desc, body, header string
		wantStatus         int
		wantErr, wantKey   string
	}{
		{desc: "header bare", body: base + `}`, header: "hdr-key-0001", wantStatus: 201, wantKey: "hdr-key-0001"},
		{desc: "header sf-string", body: base + `}`, header: `"hdr-key-0002"`, wantStatus: 201, wantKey: "hdr-key-0002"},
		{desc: "header sf-string with escapes", body: base + `}`, header: `"hdr-\"key\\-3"`, wantStatus: 201, wantKey: `hdr-"key\-3`},
		{desc: "header and body equal", body: base + `,"idempotency_key":"hdr-key-0004"}`, header: "hdr-key-0004", wantStatus: 201, wantKey: "hdr-key-0004"},
		{desc: "ErrInvalidRequest header and body differ", body: base + `,"idempotency_key":"hdr-key-0005"}`, header: "hdr-key-0006", wantStatus: 400, wantErr: "invalid_request"},
		{desc: "ErrInvalidKey unterminated sf-string", body: base + `}`, header: `"hdr-key-0007`, wantStatus: 400, wantErr: "invalid_key"},
		{desc: "ErrInvalidKey key with space", body: base + `,"idempotency_key":"has a space"}`, wantStatus: 400, wantErr: "invalid_key"},
		{desc: "ErrInvalidKey too long", body: base + `,"idempotency_key":"` + strings.Repeat("k", 256) + `"}`, wantStatus: 400, wantErr: "invalid_key"},
		{desc: "short key is replaced", body: base + `,"idempotency_key":"short"}`, wantStatus: 201, wantKey: "gen_"},
		{desc: "null key is replaced", body: base + `,"idempotency_key":null}`, wantStatus: 201, wantKey: "gen_"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			var hdr []string
			if tt.header != "" {
				hdr = []string{"Idempotency-Key", tt.header}
			}
			r := do(t, srv, "POST", "/v1/effects/reserve", tt.body, hdr...)
			assert.Equal(t, tt.wantStatus, r.status, r.raw)
			if tt.wantErr != "" {
				assert.Equal(t, tt.wantErr, r.code())
				assert.Equal(t, "idempotency_key", r.field())
				return
			}
			k, _ := r.body["idempotency_key"].(string)
			assert.True(t, strings.HasPrefix(k, tt.wantKey), k)
			assert.Equal(t, tt.wantKey == "gen_", r.body["key_generated"])
		})
	}
}

// TestServer_badInput sends malformed and hostile requests: each gets the
// contract's error shape and status, and nothing is appended.
func TestServer_badInput(t *testing.T) {
	t.Parallel()
	srv, db := MustOpenServer(t)
	deep := strings.Repeat("[", 10001) + strings.Repeat("]", 10001)
	for _, tt := range []struct {
		desc, method, path, body, contentType string
		wantStatus                            int
		wantErr, wantField                    string
	}{
		{"truncated JSON", "POST", "/v1/effects/reserve", `{"execution_id":"e`, "", 400, "invalid_json", ""},
		{"trailing garbage", "POST", "/v1/effects/reserve", reserveBody + `{}`, "", 400, "invalid_json", ""},
		{"trailing text", "POST", "/v1/effects/reserve", reserveBody + ` x`, "", 400, "invalid_json", ""},
		{"empty body", "POST", "/v1/effects/reserve", ``, "application/json", 400, "invalid_json", ""},
		{"array body", "POST", "/v1/effects/reserve", `[1]`, "", 400, "invalid_request", ""},
		{"invalid UTF-8", "POST", "/v1/effects/reserve", "{\"tool\":\"\xff\"}", "", 400, "invalid_json", ""},
		{"10001-deep nesting", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","input":` + deep + `}`, "", 400, "invalid_json", ""},
		{"unknown field", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","amount":1}`, "", 400, "invalid_request", "amount"},
		{"duplicate field", "POST", "/v1/effects/reserve", `{"execution_id":"e","execution_id":"f","tool":"t","effect":"write"}`, "", 400, "invalid_request", "execution_id"},
		{"missing execution_id", "POST", "/v1/effects/reserve", `{"tool":"t","effect":"write"}`, "", 400, "invalid_request", "execution_id"},
		{"execution_id a number", "POST", "/v1/effects/reserve", `{"execution_id":5,"tool":"t","effect":"write"}`, "", 400, "invalid_request", "execution_id"},
		{"attempt -1", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","attempt":-1}`, "", 400, "invalid_request", "attempt"},
		{"attempt 2^63", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","attempt":9223372036854775808}`, "", 400, "invalid_request", "attempt"},
		{"attempt 1e309", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","attempt":1e309}`, "", 400, "invalid_request", "attempt"},
		{"attempt 1.5", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","attempt":1.5}`, "", 400, "invalid_request", "attempt"},
		{"attempt a string", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","attempt":"2"}`, "", 400, "invalid_request", "attempt"},
		{"idempotent a string", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","idempotent":"yes"}`, "", 400, "invalid_request", "idempotent"},
		{"lease_ms 0", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","lease_ms":0}`, "", 400, "invalid_request", "lease_ms"},
		{"wait_ms -1", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","wait_ms":-1}`, "", 400, "invalid_request", "wait_ms"},
		{"wait_ms 60001", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","wait_ms":60001}`, "", 400, "invalid_request", "wait_ms"},
		{"wait_ms 1.5", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","wait_ms":1.5}`, "", 400, "invalid_request", "wait_ms"},
		{"wait_ms a string", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","wait_ms":"100"}`, "", 400, "invalid_request", "wait_ms"},
		{"wait_ms a boolean", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","wait_ms":true}`, "", 400, "invalid_request", "wait_ms"},
		{"input and input_hash", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","input":1,"input_hash":"x"}`, "", 400, "invalid_request", "input"},
		{"NUL in key", "POST", "/v1/effects/reserve", `{"idempotency_key":"abc\u0000defgh","execution_id":"e","tool":"t","effect":"write"}`, "", 400, "invalid_key", "idempotency_key"},
		{"control char in tool", "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t\u0007","effect":"write"}`, "", 400, "invalid_request", "tool"},
		{"wrong content type", "POST", "/v1/effects/reserve", reserveBody, "text/plain", 415, "unsupported_media_type", ""},
		{"form content type", "POST", "/v1/effects/reserve", reserveBody, "application/x-www-form-urlencoded", 415, "unsupported_media_type", ""},
		{"error on success", "POST", "/v1/effects/refund-order-1234/commit", `{"reservation":"r","outcome":"succeeded","error":{"code":"X"}}`, "", 400, "invalid_request", "error"},
		{"error not an object", "POST", "/v1/effects/refund-order-1234/commit", `{"reservation":"r","outcome":"failed","error":"X"}`, "", 400, "invalid_request", "error"},
		{"unknown error field", "POST", "/v1/effects/refund-order-1234/commit", `{"reservation":"r","outcome":"failed","error":{"code":"X","why":1}}`, "", 400, "invalid_request", "error.why"},
		{"missing reservation", "POST", "/v1/effects/refund-order-1234/commit", `{"outcome":"succeeded"}`, "", 400, "invalid_request", "reservation"},
		{"resolve without note", "POST", "/v1/effects/refund-order-1234/resolve", `{"outcome":"succeeded"}`, "", 400, "invalid_request", "note"},
		{"commit unknown key", "POST", "/v1/effects/unknown-key-1/commit", `{"reservation":"r","outcome":"succeeded"}`, "", 404, "unknown_key", ""},
		{"resolve unknown key", "POST", "/v1/effects/unknown-key-1/resolve", `{"outcome":"succeeded","note":"n"}`, "", 404, "unknown_key", ""},
		{"get unknown key", "GET", "/v1/effects/unknown-key-1", ``, "", 404, "unknown_key", ""},
		{"unknown route", "GET", "/v2/nothing", ``, "", 404, "not_found", ""},
		{"wrong method", "DELETE", "/v1/receipts", ``, "", 405, "method_not_allowed", ""},
		{"PUT reserve", "PUT", "/v1/effects/reserve", ``, "", 405, "method_not_allowed", ""},
		{"GET reserve", "GET", "/v1/effects/reserve", ``, "", 405, "method_not_allowed", ""},
		{"GET commit", "GET", "/v1/effects/some-key-1/commit", ``, "", 405, "method_not_allowed", ""},
		{"DELETE key", "DELETE", "/v1/effects/some-key-1", ``, "", 405, "method_not_allowed", ""},
		{"POST head", "POST", "/v1/head", `{}`, "", 405, "method_not_allowed", ""},
		{"limit too large", "GET", "/v1/receipts?limit=1001", ``, "", 400, "invalid_request", "limit"},
		{"limit zero", "GET", "/v1/receipts?limit=0", ``, "", 400, "invalid_request", "limit"},
		{"after negative", "GET", "/v1/receipts?after=-1", ``, "", 400, "invalid_request", "after"},
		{"unknown query", "GET", "/v1/receipts?colour=red", ``, "", 400, "invalid_request", "colour"},
		{"bad kind", "GET", "/v1/receipts?kind=delete", ``, "", 400, "invalid_request", "kind"},
		{"unknown receipt", "GET", "/v1/receipts/1", ``, "", 404, "unknown_receipt", ""},
		{"non-numeric receipt", "GET", "/v1/receipts/abc", ``, "", 404, "unknown_receipt", ""},
		{"non-numeric approval", "GET", "/v1/approvals/abc", ``, "", 404, "unknown_approval", ""},
		{"answer to a non-numeric approval", "POST", "/v1/approvals/abc", `{"decision":"approve"}`, "", 404, "unknown_approval", ""},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
			require.NoError(t, err)
			ct := tt.contentType
			if ct == "" && tt.body != "" {
				ct = "application/json"
			}
			if ct != "" {
				req.Header.Set("Content-Type", ct)
			}
			res, err := srv.Client().Do(req)
			require.NoError(t, err)
			defer res.Body.Close()
			raw, _ := io.ReadAll(res.Body)
			var body struct {
				Error struct {
					Code    string         `json:"code"`
					Message string         `json:"message"`
					Details map[string]any `json:"details"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(raw, &body), "%s", raw)
			assert.Equal(t, tt.wantStatus, res.StatusCode, "%s", raw)
			assert.Equal(t, tt.wantErr, body.Error.Code)
			assert.NotEmpty(t, body.Error.Message)
			assert.NotNil(t, body.Error.Details, "details is always an object")
			if tt.wantField != "" {
				assert.Equal(t, tt.wantField, body.Error.Details["field"])
			}
		})
	}
	assert.Zero(t, db.Head().Seq, "bad input appends nothing")
}

func TestServer_bodyTooLarge(t *testing.T) {
	t.Parallel()
	srv, db := MustOpenServer(t)
	big := `{"execution_id":"e","tool":"t","effect":"write","input":"` + strings.Repeat("a", 1<<20) + `"}`
	res, err := srv.Client().Post(srv.URL+"/v1/effects/reserve", "application/json", bytes.NewReader([]byte(big)))
	require.NoError(t, err)
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	assert.Equal(t, 413, res.StatusCode)
	assert.Contains(t, string(raw), `"code":"body_too_large"`)
	assert.Zero(t, db.Head().Seq)

	// Just under the limit is accepted.
	ok := `{"execution_id":"e","tool":"t","effect":"write","input":"` + strings.Repeat("a", 1<<20-100) + `"}`
	r := do(t, srv, "POST", "/v1/effects/reserve", ok)
	assert.Equal(t, 201, r.status, r.raw)
}

func TestServer_keyInPath(t *testing.T) {
	t.Parallel()
	srv, _ := MustOpenServer(t)
	k := `a/b?c#d%e'f"g`
	body := `{"idempotency_key":` + mustJSON(k) + `,"execution_id":"e","tool":"t","effect":"write"}`
	r := do(t, srv, "POST", "/v1/effects/reserve", body)
	require.Equal(t, 201, r.status, r.raw)
	esc := strings.NewReplacer("%", "%25", "/", "%2F", "?", "%3F", "#", "%23", `"`, "%22").Replace(k)
	r = do(t, srv, "POST", "/v1/effects/"+esc+"/commit", `{"reservation":"`+r.body["reservation"].(string)+`","outcome":"succeeded"}`)
	require.Equal(t, 201, r.status, r.raw)
	r = do(t, srv, "GET", "/v1/effects/"+esc, "")
	require.Equal(t, 200, r.status, r.raw)
	assert.Equal(t, k, r.body["idempotency_key"])
	assert.Equal(t, "succeeded", r.body["state"])
}

func TestServer_ops(t *testing.T) {
	t.Parallel()
	srv, _ := MustOpenServer(t)
	assert.Equal(t, 200, do(t, srv, "GET", "/healthz", "").status)
	assert.Equal(t, 200, do(t, srv, "GET", "/readyz", "").status)
	do(t, srv, "POST", "/v1/effects/reserve", reserveBody)
	res, err := srv.Client().Get(srv.URL + "/metrics")
	require.NoError(t, err)
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	for _, m := range []string{
		`ledger_receipts_appended_total{kind="reserve",namespace="default"}`,
		`ledger_reserve_outcomes_total{namespace="default",status="reserved"}`,
		`ledger_chain_head_seq`,
		`ledger_http_request_duration_seconds_count{code="201",method="POST",route="/v1/effects/reserve"}`,
	} {
		assert.Contains(t, string(raw), m)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestServer_maxInFlight holds requests in flight and checks that the one
// beyond the bound gets 503 with Retry-After while health stays open.
func TestServer_maxInFlight(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	s := api.NewServer(db.Ledger, api.Config{Logger: quiet,
		MaxInFlight: 2, MaxInFlightPerClient: -1}) // every request here comes from one address
	srv, release, free := serveHolding(t, s)
	// A hold that arrives while a probe below has the other place is
	// refused (503) and tries again, so both end up held.
	for range 2 {
		go hold(srv, release)
	}
	require.Eventually(t, func() bool {
		return do(t, srv, "GET", "/v1/head", "").status == 503
	}, 60*time.Second, 10*time.Millisecond, "the two held requests take both places")
	r := do(t, srv, "GET", "/v1/head", "")
	assert.Equal(t, "unavailable", r.code())
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	assert.Equal(t, 200, do(t, srv, "GET", "/healthz", "").status)
	free()
	require.Eventually(t, func() bool { return do(t, srv, "GET", "/v1/head", "").status == 200 }, 60*time.Second, 10*time.Millisecond)
}

// serveHolding serves s with its hold route (/test/hold, AddHoldRoute),
// which holds each request until free is called; free runs too when the
// test ends, before the server closes, so that a failed assertion does
// not leave the server waiting for the held requests.
func serveHolding(t *testing.T, s *api.Server) (srv *httptest.Server, release <-chan struct{}, free func()) {
	t.Helper()
	rel := make(chan struct{})
	s.AddHoldRoute(rel)
	srv = MustServe(t, s)
	var once sync.Once
	free = func() { once.Do(func() { close(rel) }) }
	t.Cleanup(free) // registered after MustServe's, so it runs first
	return srv, rel, free
}

// hold sends GET /test/hold, with the header's name and value pairs,
// until one is held: one refused with 503 (no place was free) is sent
// again, until release is closed.
func hold(srv *httptest.Server, release <-chan struct{}, header ...string) {
	for {
		req, _ := http.NewRequest("GET", srv.URL+"/test/hold", nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		res, err := srv.Client().Do(req)
		if err != nil {
			return
		}
		res.Body.Close()
		if res.StatusCode != http.StatusServiceUnavailable {
			return
		}
		select {
		case <-release:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestServer_maxInFlight_slowBodiesHoldNoPlace: bodies still arriving
// hold no place, global or per client.
func TestServer_maxInFlight_slowBodiesHoldNoPlace(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	s := api.NewServer(db.Ledger, api.Config{Logger: quiet, MaxInFlight: 1, MaxInFlightPerClient: 1})
	srv := MustServe(t, s)
	for range 3 {
		c := testkit.SlowBody(t, srv.Listener.Addr().String(), "")
		_, err := io.WriteString(c, `{"execution_id":`)
		require.NoError(t, err)
	}
	assert.Equal(t, 200, do(t, srv, "GET", "/v1/head", "").status)
	r := do(t, srv, "POST", "/v1/effects/reserve", `{"idempotency_key":"fast-key-0001","execution_id":"e","tool":"t","effect":"write"}`)
	assert.Equal(t, 201, r.status, r.raw)
}

// TestServer_maxInFlightPerClient: one client at its bound is refused
// while another is served.
func TestServer_maxInFlightPerClient(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	toks := MustOpenTokens(t, db.Path())
	busy := mustCreate(t, toks, "busy", ledger.RoleReader)
	other := mustCreate(t, toks, "other", ledger.RoleReader)
	s := api.NewServer(db.Ledger, api.Config{Logger: quiet, MaxInFlight: 4, MaxInFlightPerClient: 1})
	srv, release, free := serveHolding(t, s)
	// A hold that arrives while a probe below has the busy token's place is
	// refused (503) and tries again, so that it ends up held.
	go hold(srv, release, "Authorization", "Bearer "+busy)
	require.Eventually(t, func() bool {
		return do(t, srv, "GET", "/v1/head", "", "Authorization", "Bearer "+busy).status == 503
	}, 60*time.Second, 10*time.Millisecond, "the busy token's one place is held")
	r := do(t, srv, "GET", "/v1/head", "", "Authorization", "Bearer "+busy)
	assert.Equal(t, "unavailable", r.code())
	assert.Equal(t, float64(1), r.body["error"].(map[string]any)["details"].(map[string]any)["limit"])
	assert.Equal(t, 200, do(t, srv, "GET", "/v1/head", "", "Authorization", "Bearer "+other).status, "another token is served")
	free()
	require.Eventually(t, func() bool {
		return do(t, srv, "GET", "/v1/head", "", "Authorization", "Bearer "+busy).status == 200
	}, 60*time.Second, 10*time.Millisecond)
}

// TestServer_statusTable checks that every contract code maps to a status.
func TestServer_statusTable(t *testing.T) {
	t.Parallel()
	for _, code := range []string{ledger.ECodeInvalidJSON, ledger.ECodeInvalidRequest, ledger.ECodeInvalidKey,
		ledger.ECodeBodyTooLarge, ledger.ECodeUnsupportedMedia, ledger.ECodeNotFound, ledger.ECodeMethodNotAllowed,
		ledger.ECodeUnavailable, ledger.ECodeUnauthorized, ledger.ECodeForbidden, ledger.ECodeRateLimited, ledger.ECodeInternal,
		ledger.ECodeFingerprintMismatch, ledger.ECodeInProgress, ledger.ECodeUnsafeResume, ledger.ECodeRetryNotAllowed,
		ledger.ECodeAttemptConflict, ledger.ECodeUnknownKey, ledger.ECodeStaleReservation, ledger.ECodeAlreadyFinalized,
		ledger.ECodeNotInterrupted, ledger.ECodeUnknownReceipt} {
		assert.NotEqual(t, 500, api.StatusOf(code), code)
	}
}

// TestServer_hugeArrays: a large array input is fingerprinted (no crash,
// no quadratic blow-up); past 1 MiB it is refused with 413.
func TestServer_hugeArrays(t *testing.T) {
	t.Parallel()
	srv, db := MustOpenServer(t)
	arr := "[" + strings.Repeat("0,", 200_000) + "0]"
	r := do(t, srv, "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","input":`+arr+`}`)
	assert.Equal(t, 201, r.status, r.raw[:min(len(r.raw), 200)])
	big := "[" + strings.Repeat("0,", 600_000) + "0]"
	r = do(t, srv, "POST", "/v1/effects/reserve", `{"execution_id":"e","tool":"t","effect":"write","input":`+big+`}`)
	assert.Equal(t, 413, r.status)
	assert.Equal(t, "body_too_large", r.code())
	assert.Equal(t, uint64(1), db.Head().Seq)
}

func TestServer_panic(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	s := api.NewServer(db.Ledger, api.Config{Logger: quiet})
	s.AddPanicRoute()
	srv := MustServe(t, s)
	r := do(t, srv, "GET", "/test/panic", "")
	assert.Equal(t, 500, r.status)
	assert.Equal(t, "internal", r.code())
	assert.NotContains(t, r.raw, "boom", "no internals in the message")
	assert.Equal(t, 200, do(t, srv, "GET", "/healthz", "").status, "the server lives on")
}

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
	require.NoError(t, db.Ledger.CreateNamespace(ctx, "payments", ledger.NamespaceSettings{}))
	require.NoError(t, db.Ledger.CreateNamespace(ctx, "hidden", ledger.NamespaceSettings{}))
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

// TestServer_subjectsAreIJSON: a subject with a lone surrogate escape is
// refused on reserve as on erase (SPEC §14): read as U+FFFD, two such
// subjects would be one person.
func TestServer_subjectsAreIJSON(t *testing.T) {
	t.Parallel()
	srv, _ := MustOpenServer(t)
	r := do(t, srv, "POST", "/v1/effects/reserve", `{"idempotency_key":"subj-key-0001","execution_id":"e","tool":"t","effect":"write","subjects":["a\ud800"]}`)
	assert.Equal(t, 400, r.status, r.raw)
	assert.Equal(t, "subjects", r.body["error"].(map[string]any)["details"].(map[string]any)["field"])
	r = do(t, srv, "POST", "/v1/erasures", `{"subject":"a\ud800","reason":"r"}`)
	assert.Equal(t, 400, r.status, r.raw)
	r = do(t, srv, "POST", "/v1/erasures", `{"keys":["subj-key-\udc00"],"reason":"r"}`)
	assert.Equal(t, 400, r.status, r.raw)
	r = do(t, srv, "POST", "/v1/effects/reserve", `{"idempotency_key":"subj-key-0002","execution_id":"e","tool":"t","effect":"write","subjects":["caf\u00e9"]}`)
	assert.Equal(t, 201, r.status, "an escape of a whole character is fine: %s", r.raw)
}

// TestServer_refusalShowsErased: the failure a retry_not_allowed refusal
// shows carries `erased` for its erased message (SPEC §14: the one shape,
// refusals included), never the value.
func TestServer_refusalShowsErased(t *testing.T) {
	t.Parallel()
	srv, _ := MustOpenServer(t)
	body := `{"idempotency_key":"fail-key-0001","execution_id":"e","tool":"t","effect":"write"}`
	r := do(t, srv, "POST", "/v1/effects/reserve", body)
	require.Equal(t, 201, r.status, r.raw)
	r = do(t, srv, "POST", "/v1/effects/fail-key-0001/commit", `{"reservation":"`+r.body["reservation"].(string)+
		`","outcome":"failed","error":{"code":"DECLINED","message":"card of alice declined"}}`)
	require.Equal(t, 201, r.status, r.raw)
	e := do(t, srv, "POST", "/v1/erasures", `{"keys":["fail-key-0001"],"reason":"request"}`)
	require.Equal(t, 201, e.status, e.raw)
	seq := e.body["receipt"].(map[string]any)["seq"].(float64)
	r = do(t, srv, "POST", "/v1/effects/reserve", body)
	require.Equal(t, 409, r.status, r.raw)
	assert.NotContains(t, r.raw, "alice")
	failure := r.body["error"].(map[string]any)["details"].(map[string]any)["failure"].(map[string]any)
	assert.Equal(t, map[string]any{"error_message": seq}, failure["erased"], r.raw)
	assert.Equal(t, "", failure["error_message"])
}

// TestServer_refusalsShowErased: the approval_rejected and unchanged_retry
// refusals quote their receipt in §14's one shape once its values are
// erased — "" and "erased", never the value — and an ask's view shows its
// summary erased.
func TestServer_refusalsShowErased(t *testing.T) {
	t.Parallel()
	srv, _ := MustOpenServer(t)
	r := do(t, srv, "PUT", "/v1/namespaces/default/policy",
		`{"rules":[{"tool":"pay.*","approval":"required"},{"tool":"flaky.*","repeat_failure":"refuse"}]}`)
	require.Equal(t, 200, r.status, r.raw)

	held := `{"idempotency_key":"held-key-0001","execution_id":"e","tool":"pay.charge","effect":"write","input":{"n":2},"approval_summary":"refund alice"}`
	ask := do(t, srv, "POST", "/v1/effects/reserve", held)
	require.Equal(t, 202, ask.status, ask.raw)
	askSeq := ask.body["approval"].(map[string]any)["seq"].(float64)
	r = do(t, srv, "POST", fmt.Sprintf("/v1/approvals/%d", int(askSeq)), `{"decision":"reject","note":"no, alice"}`)
	require.Equal(t, 201, r.status, r.raw)

	flaky := `{"idempotency_key":"flaky-key-001","execution_id":"e","tool":"flaky.call","effect":"write","input":{"n":1}}`
	r = do(t, srv, "POST", "/v1/effects/reserve", flaky)
	require.Equal(t, 201, r.status, r.raw)
	r = do(t, srv, "POST", "/v1/effects/flaky-key-001/commit", `{"reservation":"`+r.body["reservation"].(string)+
		`","outcome":"failed","error":{"code":"TIMEOUT","message":"timeout for alice","retryable":true}}`)
	require.Equal(t, 201, r.status, r.raw)

	e := do(t, srv, "POST", "/v1/erasures", `{"keys":["held-key-0001","flaky-key-001"],"reason":"request"}`)
	require.Equal(t, 201, e.status, e.raw)
	seq := e.body["receipt"].(map[string]any)["seq"].(float64)

	r = do(t, srv, "POST", "/v1/effects/reserve", held)
	require.Equal(t, 409, r.status, r.raw)
	assert.NotContains(t, r.raw, "alice")
	approval := r.body["error"].(map[string]any)["details"].(map[string]any)["approval"].(map[string]any)
	assert.Equal(t, map[string]any{"note": seq}, approval["erased"], r.raw)

	r = do(t, srv, "POST", "/v1/effects/reserve", strings.NewReplacer("flaky-key-001", "flaky-key-002", `"e"`, `"e2"`).Replace(flaky))
	require.Equal(t, 409, r.status, r.raw)
	assert.NotContains(t, r.raw, "alice")
	failed := r.body["error"].(map[string]any)["details"].(map[string]any)["failed"].(map[string]any)
	assert.Equal(t, map[string]any{"error_message": seq}, failed["erased"], r.raw)

	r = do(t, srv, "GET", fmt.Sprintf("/v1/approvals/%d", int(askSeq)), "")
	require.Equal(t, 200, r.status, r.raw)
	assert.NotContains(t, r.raw, "alice")
	assert.Equal(t, map[string]any{"summary": seq}, r.body["erased"], r.raw)
	assert.Equal(t, map[string]any{"note": seq}, r.body["answer"].(map[string]any)["erased"], r.raw)
}

// TestServer_keyWithLoneSurrogate: a body's idempotency key with a lone
// surrogate escape is invalid_key (SPEC §4), as in the header.
func TestServer_keyWithLoneSurrogate(t *testing.T) {
	t.Parallel()
	srv, _ := MustOpenServer(t)
	r := do(t, srv, "POST", "/v1/effects/reserve", `{"idempotency_key":"key-\ud800-0001","execution_id":"e","tool":"t","effect":"write"}`)
	require.Equal(t, 400, r.status, r.raw)
	assert.Equal(t, "invalid_key", r.body["error"].(map[string]any)["code"], r.raw)
}
