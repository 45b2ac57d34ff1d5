package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// spanAttrs returns a span's attributes by key, as strings.
func spanAttrs(s sdktrace.ReadOnlySpan) map[string]string {
	out := map[string]string{}
	for _, kv := range s.Attributes() {
		out[string(kv.Key)] = kv.Value.String()
	}
	return out
}

// TestServer_tracing: a namespaced reserve and its commit are
// server spans with the namespace, key, decision and receipt seq, each
// with a batch span as its child. (test/trace_test.go checks the same
// through ledgerd's OTLP export and the caller's traceparent.)
func TestServer_tracing(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	require.NoError(t, db.Ledger.CreateNamespace(context.Background(), "payments", ledger.NamespaceSettings{}))
	rec := tracetest.NewSpanRecorder()
	s := api.NewServer(db.Ledger, api.Config{Logger: quiet,
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))})
	srv := MustServe(t, s)

	post := func(path, body string) {
		res, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		_ = res.Body.Close()
	}
	post("/v1/ns/payments/effects/reserve", `{"idempotency_key":"order-0001","execution_id":"e1","tool":"t","effect":"write"}`)
	ended := rec.Ended()
	require.Len(t, ended, 2, "the request and its batch")
	batch, req := ended[0], ended[1]
	assert.Equal(t, "ledger.batch", batch.Name())
	assert.Equal(t, req.SpanContext().SpanID(), batch.Parent().SpanID())
	assert.Equal(t, "POST /v1/ns/{ns}/effects/reserve", req.Name())
	got := spanAttrs(req)
	assert.Equal(t, "payments", got["ledger.namespace"])
	assert.Equal(t, "order-0001", got["ledger.key"])
	assert.Equal(t, "reserved", got["ledger.decision"])
	assert.Equal(t, "1", got["ledger.receipt.seq"])
	assert.Equal(t, "payments", spanAttrs(batch)["ledger.namespace"])
	assert.Contains(t, batch.Attributes(), attribute.Int("ledger.batch.size", 1))

	post("/v1/ns/payments/effects/order-0001/commit", `{"reservation":"rsv_`+strings.Repeat("0", 64)+`","outcome":"succeeded"}`)
	got = spanAttrs(rec.Ended()[len(rec.Ended())-1])
	assert.Equal(t, "order-0001", got["ledger.key"], "the key of a refused commit comes from its path")
	assert.Equal(t, "stale_reservation", got["ledger.decision"])
}

// BenchmarkServer_ServeHTTP measures what tracing costs a request: off
// (the default; a nil check) and on with an SDK that records nothing.
func BenchmarkServer_ServeHTTP(b *testing.B) {
	for _, tc := range []struct {
		desc string
		tp   *sdktrace.TracerProvider
	}{
		{"tracing=off", nil},
		{"tracing=on", sdktrace.NewTracerProvider()},
	} {
		db := ledgertest.Open(b, ledgertest.WithNow(time.Now))
		cfg := api.Config{Logger: quiet}
		if tc.tp != nil {
			cfg.TracerProvider = tc.tp
		}
		s := api.NewServer(db.Ledger, cfg)
		for _, rt := range []struct{ name, method, path, body string }{
			{"head", http.MethodGet, "/v1/head", ""},
			{"reserve-read", http.MethodPost, "/v1/effects/reserve", `{"execution_id":"e1","tool":"t","effect":"read"}`},
		} {
			b.Run(tc.desc+"/"+rt.name, func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					r := httptest.NewRequest(rt.method, rt.path, strings.NewReader(rt.body))
					r.Header.Set("Content-Type", "application/json")
					w := httptest.NewRecorder()
					s.ServeHTTP(w, r)
					if w.Code >= 300 {
						b.Fatalf("%s %s: %d %s", rt.method, rt.path, w.Code, w.Body)
					}
				}
			})
		}
	}
}
