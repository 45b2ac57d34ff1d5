package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
)

func TestClient_StateKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	hexKey := strings.Repeat("ab", 32)
	srv, _ := approverLedger(t, map[string]route{
		"GET /v1/ns/payments/mcp/state-key": {200, `{"key":"` + hexKey + `"}`},
		"GET /v1/ns/short/mcp/state-key":    {200, `{"key":"abcd"}`},
		"GET /v1/mcp/state-key":             {404, `{"error":{"code":"not_found","message":"no route"}}`},
	})
	c, err := client.New(srv.URL, client.WithNamespace("payments"))
	require.NoError(t, err)
	key, err := c.StateKey(ctx)
	require.NoError(t, err)
	assert.Equal(t, strings.Repeat("\xab", 32), string(key))

	s, err := client.New(srv.URL, client.WithNamespace("short"))
	require.NoError(t, err)
	_, err = s.StateKey(ctx)
	assert.ErrorContains(t, err, "not 32 hex-encoded bytes")

	d, err := client.New(srv.URL)
	require.NoError(t, err)
	_, err = d.StateKey(ctx)
	assert.True(t, errors.Is(err, client.ErrNotFound), "an older ledgerd: %v", err)
}
