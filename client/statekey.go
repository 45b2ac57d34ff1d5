package client

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
)

// StateKey returns the key with which ledger-mcp authenticates the
// requestState envelopes of its multi-round calls (SPEC §11.1), from GET
// /v1/mcp/state-key in the client's namespace: derived by the ledger from
// the namespace's secret for the client's token, so every gateway using
// the same token gets the same key. It needs a writer (or admin) token.
// A ledgerd older than the route answers ErrNotFound (404 not_found).
func (c *Client) StateKey(ctx context.Context) ([]byte, error) {
	var b struct {
		Key string `json:"key"`
	}
	if _, err := c.exchange(ctx, "state key", http.MethodGet, c.route("/v1/mcp/state-key"), nil, &b); err != nil {
		return nil, err
	}
	key, err := hex.DecodeString(b.Key)
	if err != nil || len(key) < 32 {
		return nil, fmt.Errorf("state key: not 32 hex-encoded bytes")
	}
	return key, nil
}
