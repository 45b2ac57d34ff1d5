package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// MustGateway serves a gateway in front of a real ledger on a temp file.
func MustGateway(t *testing.T) *httptest.Server {
	t.Helper()
	db := ledgertest.Open(t)
	ls := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	lc, err := client.New(ls.URL)
	require.NoError(t, err)
	gw := httptest.NewServer(NewGateway(lc, quiet))
	t.Cleanup(func() {
		gw.Close()
		ls.Close()
		_ = db.Close()
	})
	return gw
}

func call(t *testing.T, gw *httptest.Server, path, body string) (int, map[string]any) {
	t.Helper()
	res, err := http.Post(gw.URL+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer res.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
	return res.StatusCode, out
}

func stats(t *testing.T, gw *httptest.Server) map[string]any {
	t.Helper()
	res, err := http.Get(gw.URL + "/stats")
	require.NoError(t, err)
	defer res.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
	return out
}

func TestGateway_refund(t *testing.T) {
	gw := MustGateway(t)
	status, first := call(t, gw, "/tools/payments.refund", `{"execution_id":"call-1","input":{"order":1234,"amount":1200}}`)
	require.Equal(t, 200, status, "%v", first)
	assert.Equal(t, false, first["replayed"])
	status, second := call(t, gw, "/tools/payments.refund", `{"execution_id":"call-2","input":{"amount":1200,"order":1234}}`)
	require.Equal(t, 200, status, "%v", second)
	assert.Equal(t, true, second["replayed"])
	assert.Equal(t, first["external_ref"], second["external_ref"])
	assert.Equal(t, first["key"], second["key"])
	assert.Equal(t, 1.0, stats(t, gw)["payments.refund"], "refunded once")

	status, bad := call(t, gw, "/tools/payments.refund", `{"execution_id":"call-3","input":{"order":9,"amount":-5}}`)
	assert.Equal(t, 502, status)
	assert.Equal(t, "AMOUNT_INVALID", bad["error"].(map[string]any)["code"])
	status, again := call(t, gw, "/tools/payments.refund", `{"execution_id":"call-4","input":{"order":9,"amount":-5}}`)
	assert.Equal(t, 409, status)
	assert.Equal(t, "retry_not_allowed", again["error"].(map[string]any)["code"])

	status, _ = call(t, gw, "/tools/payments.refund", `{"input":`)
	assert.Equal(t, 400, status)
}

// TestGateway_emailConcurrent: two replicas get the same slow call at
// once; one sends, the other waits for it and returns its message id.
func TestGateway_emailConcurrent(t *testing.T) {
	gw := MustGateway(t)
	body := `{"execution_id":"%s","input":{"to":"ada@example.com","subject":"welcome","delay_ms":500}}`
	var wg sync.WaitGroup
	replies := make([]map[string]any, 2)
	for i := range replies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, r := call(t, gw, "/tools/email.send", strings.Replace(body, "%s", []string{"a", "b"}[i], 1))
			assert.Equal(t, 200, status, "%v", r)
			replies[i] = r
		}()
	}
	wg.Wait()
	assert.Equal(t, replies[0]["external_ref"], replies[1]["external_ref"])
	assert.NotEqual(t, replies[0]["replayed"], replies[1]["replayed"], "one sent, one replayed")
	assert.Equal(t, 1.0, stats(t, gw)["email.send"], "sent once")
}
