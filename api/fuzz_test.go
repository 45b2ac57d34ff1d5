package api_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// FuzzRequests sends arbitrary bodies to the write endpoints: the server
// never panics, always answers in the contract's shape, and appends a
// receipt only with a 2xx. Seeds live in testdata/fuzz/FuzzRequests.
func FuzzRequests(f *testing.F) {
	f.Add(0, reserveBody)
	f.Add(0, `{"execution_id":"e","tool":"t","effect":"write","input":{"b":[1,2.50,"\u00e9"],"a":null}}`)
	f.Add(0, `{"execution_id":"e","tool":"t","effect":"read","attempt":1e3}`)
	f.Add(1, `{"reservation":"rsv_x","outcome":"failed","error":{"code":"E","retryable":true}}`)
	f.Add(2, `{"outcome":"succeeded","note":"n","result":{"a":1}}`)
	f.Add(0, `{"idempotency_key":"k\u0000kkkkkkk"}`)
	f.Add(3, `{"rules":[{"tool":"t*","approval":"required","expires_in_ms":60000},{"tool":"x.?","deny":true}],"self_approval":"allow"}`)
	f.Add(0, `{"idempotency_key":"fuzz-key-0002","execution_id":"e","tool":"t","effect":"write","input":{},"approval_summary":"s","changed":{"strategy":"x"}}`)
	f.Add(4, `{"decision":"approve","note":"n"}`)
	f.Add(5, `{"decision":"reject","client":"c"}`)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	db := ledgertest.Open(f)
	h := api.NewServer(db.Ledger, api.Config{Logger: logger})
	paths := []string{"/v1/effects/reserve", "/v1/effects/fuzz-key-0001/commit", "/v1/effects/fuzz-key-0001/resolve",
		"/v1/namespaces/default/policy", "/v1/approvals/1", "/v1/approvals/1/mcp-client"}
	f.Fuzz(func(t *testing.T, route int, body string) {
		if route < 0 {
			route = -route
		}
		path := paths[route%len(paths)]
		method := http.MethodPost
		if strings.HasSuffix(path, "/policy") {
			method = http.MethodPut
		}
		before := db.Head()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var out map[string]json.RawMessage
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			t.Fatalf("status %d, body not JSON: %q", rec.Code, rec.Body.String())
		}
		if rec.Code >= 400 {
			var e struct {
				Error struct {
					Code    string          `json:"code"`
					Message string          `json:"message"`
					Details json.RawMessage `json:"details"`
				} `json:"error"`
			}
			if json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Code == "" || e.Error.Message == "" || len(e.Error.Details) == 0 {
				t.Fatalf("status %d without the error shape: %s", rec.Code, rec.Body.String())
			}
			if e.Error.Code == "internal" {
				t.Fatalf("internal error for %q", body)
			}
			// A refusal appends nothing, but a reserve the policy denies
			// (one deny receipt, SPEC §13).
			if db.Head() != before && e.Error.Code != "denied_by_policy" {
				t.Fatalf("status %d appended a receipt", rec.Code)
			}
		}
	})
}
