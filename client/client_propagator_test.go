package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
)

type traceKey struct{}

// TestWithPropagator: every request carries the headers the propagator
// adds from the request's context. (The server here only records
// headers; test/trace_test.go checks the ledger's spans join the trace.)
func TestWithPropagator(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("traceparent"))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":{"code":"invalid_request","message":"recorded","details":{}}}`))
	}))
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL, client.WithPropagator(func(ctx context.Context, h http.Header) {
		if tp, ok := ctx.Value(traceKey{}).(string); ok {
			h.Set("traceparent", tp)
		}
	}))
	require.NoError(t, err)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	req := client.ReserveRequest{Key: "order-1234", ExecutionID: "e1", Tool: "t", Class: client.ClassWrite}
	_, err = c.Reserve(context.WithValue(context.Background(), traceKey{}, tp), req)
	require.ErrorIs(t, err, client.ErrInvalidRequest)
	_, err = c.Reserve(context.Background(), req)
	require.ErrorIs(t, err, client.ErrInvalidRequest)
	assert.Equal(t, []string{tp, ""}, got)
}
