package client_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
)

// dkLedger answers GET {path} with status and body (counted in asked),
// and every reserve 500 (the tests only look at the key sent).
func dkLedger(t *testing.T, path string, status *atomic.Int32, body string) (*httptest.Server, *atomic.Int32, *atomic.Value) {
	t.Helper()
	var asked atomic.Int32
	var key atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodGet && r.URL.Path == path:
			asked.Add(1)
			w.WriteHeader(int(status.Load()))
			if status.Load() == 200 {
				_, _ = io.WriteString(w, body)
			} else {
				_, _ = io.WriteString(w, `{"error":{"code":"unavailable","message":"down"}}`)
			}
		default:
			var b struct {
				Key string `json:"idempotency_key"`
			}
			_ = json.NewDecoder(r.Body).Decode(&b)
			key.Store(b.Key)
			w.WriteHeader(400)
			_, _ = io.WriteString(w, `{"error":{"code":"invalid_request","message":"seen"}}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &asked, &key
}

func noRun(context.Context, string) (client.Outcome, error) { panic("the effect must not run") }

// TestClient_DerivationKey: Do fetches the namespace's derivation key
// once per Client and derives dk2_ keys with it in a committed namespace;
// a failed fetch is not kept (the call fails, nothing runs, the next
// asks again); an explicit key or a read call never asks.
func TestClient_DerivationKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var status atomic.Int32
	status.Store(503)
	srv, asked, sent := dkLedger(t, "/v1/ns/people/derivation-key", &status,
		`{"payloads":"committed","key":"`+crossDerivationKey+`"}`)
	c, err := client.New(srv.URL, client.WithNamespace("people"), client.WithRetry(1, time.Millisecond, time.Millisecond))
	require.NoError(t, err)
	call := client.Effect{Tool: crossTool, Class: client.ClassWrite, Input: json.RawMessage(crossInput)}

	_, err = c.Do(ctx, call, noRun)
	require.ErrorIs(t, err, client.ErrUnavailable, "as an unreachable ledger")
	assert.ErrorContains(t, err, "derivation key")
	assert.Equal(t, int32(2), asked.Load(), "a 503 is retried")
	assert.Nil(t, sent.Load(), "no reserve without the key")

	status.Store(200)
	for range 3 {
		_, err = c.Do(ctx, call, noRun)
		require.ErrorIs(t, err, client.ErrInvalidRequest)
		assert.Equal(t, crossKey2, sent.Load())
	}
	assert.Equal(t, int32(3), asked.Load(), "fetched once, after the failure")
	dk, err := c.DerivationKey(ctx)
	require.NoError(t, err)
	assert.Equal(t, client.PayloadsCommitted, dk.Payloads)
	assert.Equal(t, crossDerivationKey, hex.EncodeToString(dk.Key))

	// An explicit key and a read call never ask.
	fresh, err := client.New(srv.URL, client.WithNamespace("people"))
	require.NoError(t, err)
	explicit := call
	explicit.Key = "order-1234-refund"
	_, err = fresh.Do(ctx, explicit, noRun)
	require.ErrorIs(t, err, client.ErrInvalidRequest)
	assert.Equal(t, "order-1234-refund", sent.Load())
	read := call
	read.Class = client.ClassRead
	res, err := fresh.Do(ctx, read, func(_ context.Context, key string) (client.Outcome, error) {
		assert.Equal(t, crossKey, key, "a read skips the ledger: dk_")
		return client.Outcome{}, nil
	})
	require.NoError(t, err)
	assert.True(t, res.NotRecorded)
	assert.Equal(t, int32(3), asked.Load())
}

// TestClient_DerivationKey_answers: an inline namespace derives dk_; a
// ledgerd before the route (404 not_found) has inline namespaces only;
// a malformed answer is an error.
func TestClient_DerivationKey_answers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, _ := approverLedger(t, map[string]route{
		"GET /v1/derivation-key":          {200, `{"payloads":"inline","key":"` + crossDerivationKey + `"}`},
		"GET /v1/ns/short/derivation-key": {200, `{"payloads":"committed","key":"abcd"}`},
		"GET /v1/ns/odd/derivation-key":   {200, `{"payloads":"sealed","key":"` + crossDerivationKey + `"}`},
		"GET /v1/ns/gone/derivation-key":  {404, `{"error":{"code":"unknown_namespace","message":"no"}}`},
	})
	for _, tt := range []struct {
		ns, payloads, err string
	}{
		{"", client.PayloadsInline, ""},
		{"old", client.PayloadsInline, ""}, // no such route: not_found
		{"short", "", "not 32 hex-encoded bytes"},
		{"odd", "", `unknown payload mode "sealed"`},
		{"gone", "", "unknown_namespace"},
	} {
		c, err := client.New(srv.URL, client.WithNamespace(tt.ns))
		require.NoError(t, err)
		dk, err := c.DerivationKey(ctx)
		if tt.err != "" {
			assert.ErrorContains(t, err, tt.err, tt.ns)
			continue
		}
		require.NoError(t, err, tt.ns)
		assert.Equal(t, tt.payloads, dk.Payloads, tt.ns)
		k, err := dk.DeriveKey(crossTool, json.RawMessage(crossInput))
		require.NoError(t, err)
		assert.Equal(t, crossKey, k, tt.ns)
	}
}
