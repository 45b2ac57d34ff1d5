package ledger_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// hkdfSHA256 is RFC 5869 written out for one block (L = 32), with no
// salt (HashLen zeros): an independent check of MCPStateKey.
func hkdfSHA256(secret []byte, info string) []byte {
	ext := hmac.New(sha256.New, make([]byte, sha256.Size))
	ext.Write(secret)
	prk := ext.Sum(nil)
	exp := hmac.New(sha256.New, prk)
	exp.Write([]byte(info))
	exp.Write([]byte{1})
	return exp.Sum(nil)
}

// TestMCPStateKey: the key is HKDF-SHA256 of the secret with info
// "effect-ledger mcp state key/" + the token's name, 32 bytes: the same
// for one secret and name, another for another name or secret, never the
// secret itself; a short secret is refused.
func TestMCPStateKey(t *testing.T) {
	secret := bytes.Repeat([]byte{0x42}, ledger.StateKeyLen)
	for _, name := range []string{"", "gateway", "other-gateway"} {
		k, err := ledger.MCPStateKey(secret, name)
		require.NoError(t, err)
		assert.Len(t, k, ledger.StateKeyLen)
		assert.Equal(t, hkdfSHA256(secret, "effect-ledger mcp state key/"+name), k, "token %q", name)
		again, err := ledger.MCPStateKey(secret, name)
		require.NoError(t, err)
		assert.Equal(t, k, again, "deterministic")
		assert.NotEqual(t, secret, k)
	}
	a, _ := ledger.MCPStateKey(secret, "gateway")
	b, _ := ledger.MCPStateKey(secret, "other-gateway")
	none, _ := ledger.MCPStateKey(secret, "")
	assert.NotEqual(t, a, b, "each token its own key")
	assert.NotEqual(t, a, none)
	other := bytes.Repeat([]byte{0x43}, ledger.StateKeyLen)
	c, _ := ledger.MCPStateKey(other, "gateway")
	assert.NotEqual(t, a, c, "each namespace's secret its own keys")
	// A fixed answer, so that the derivation cannot change unnoticed (the
	// envelopes of running gateways would stop opening).
	// (Computed with Python's hmac module.)
	assert.Equal(t, "d136b440e2774bea4c7ea1464d315381bb67ce306e2d93b89030a1358985cf57", hex.EncodeToString(a))

	_, err := ledger.MCPStateKey(secret[:16], "gateway")
	assert.Error(t, err, "a short secret")
}
