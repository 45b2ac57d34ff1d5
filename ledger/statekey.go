package ledger

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"fmt"
)

// StateKeyLen is the size of a namespace's secret (Chain.StateKey) and of
// the keys derived from it.
const StateKeyLen = 32

// mcpStateKeyInfo prefixes the HKDF info of MCPStateKey.
const mcpStateKeyInfo = "effect-ledger mcp state key/"

// MCPStateKey derives the key that authenticates the requestState
// envelopes of the MCP gateways (SPEC §11.1) from a namespace's secret:
// HKDF-SHA256 with no salt and info "effect-ledger mcp state key/" +
// token, the name of the API token the gateway uses ("" for an embedded
// ledger or a server without tokens). Each token gets its own key; the
// replicas of one gateway, sharing one token, share it.
func MCPStateKey(secret []byte, token string) ([]byte, error) {
	if len(secret) < StateKeyLen {
		return nil, fmt.Errorf("state key: a secret of %d bytes, want %d", len(secret), StateKeyLen)
	}
	return hkdf.Key(sha256.New, secret, nil, mcpStateKeyInfo+token, StateKeyLen)
}

// StateKey returns the namespace's secret (Chain.StateKey), made on first
// use. It is never part of the chain.
func (n *Namespace) StateKey(ctx context.Context) ([]byte, error) {
	key, err := n.chain.StateKey(ctx)
	if err != nil {
		return nil, fmt.Errorf("state key of %s: %w", n.name, err)
	}
	if len(key) != StateKeyLen {
		return nil, fmt.Errorf("state key of %s: %d bytes, want %d", n.name, len(key), StateKeyLen)
	}
	return key, nil
}
