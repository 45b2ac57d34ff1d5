package mcpgate_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/mcpgate"
)

func TestDeriveKey(t *testing.T) {
	key, err := mcpgate.DeriveKey(nil, "shop.charge", json.RawMessage(`{"order":"A1","amount":12.5}`), "")
	require.NoError(t, err)

	t.Run("IsTheClientsDerivedKey", func(t *testing.T) {
		want, err := client.DeriveKey("shop.charge", map[string]any{
			"arguments": map[string]any{"amount": 12.5, "order": "A1"}, "scope": ""})
		require.NoError(t, err)
		assert.Equal(t, want, key)
	})
	t.Run("SpellingDoesNotMatter", func(t *testing.T) {
		other, err := mcpgate.DeriveKey(nil, "shop.charge", json.RawMessage(` { "amount" : 1.25e1, "order" : "A1" } `), "")
		require.NoError(t, err)
		assert.Equal(t, key, other)
	})
	t.Run("ScopeIsNewWork", func(t *testing.T) {
		scoped, err := mcpgate.DeriveKey(nil, "shop.charge", json.RawMessage(`{"order":"A1","amount":12.5}`), "run-2")
		require.NoError(t, err)
		assert.NotEqual(t, key, scoped)
	})
	t.Run("ToolIsPartOfIt", func(t *testing.T) {
		other, err := mcpgate.DeriveKey(nil, "shop.refund", json.RawMessage(`{"order":"A1","amount":12.5}`), "")
		require.NoError(t, err)
		assert.NotEqual(t, key, other)
	})
	t.Run("CommittedNamespace", func(t *testing.T) {
		// SPEC §14: dk2_ + hex HMAC-SHA-256(the namespace's key, the same message).
		dkey := []byte(strings.Repeat("k", 32))
		committed, err := mcpgate.DeriveKey(&client.DerivationKey{Payloads: client.PayloadsCommitted, Key: dkey},
			"shop.charge", json.RawMessage(`{"order":"A1","amount":12.5}`), "")
		require.NoError(t, err)
		m := hmac.New(sha256.New, dkey)
		m.Write([]byte("shop.charge\x00" + `{"arguments":{"amount":12.5,"order":"A1"},"scope":""}`))
		assert.Equal(t, "dk2_"+hex.EncodeToString(m.Sum(nil)), committed)
		inline, err := mcpgate.DeriveKey(&client.DerivationKey{Payloads: client.PayloadsInline, Key: dkey},
			"shop.charge", json.RawMessage(`{"order":"A1","amount":12.5}`), "")
		require.NoError(t, err)
		assert.Equal(t, key, inline, "an inline namespace keeps dk_")
	})
	t.Run("KnownAnswer", func(t *testing.T) {
		// dk_ + hex SHA-256("shop.charge" 0x00 `{"arguments":{"amount":12.5,"order":"A1"},"scope":""}`)
		assert.Equal(t, "dk_"+sha256Hex("shop.charge\x00"+`{"arguments":{"amount":12.5,"order":"A1"},"scope":""}`), key)
	})
}

func TestLedgerToolName(t *testing.T) {
	assert.Equal(t, "shop.charge", mcpgate.LedgerToolName("shop", "charge"))
	long := strings.Repeat("t", 128)
	a := mcpgate.LedgerToolName(strings.Repeat("s", 64), long)
	b := mcpgate.LedgerToolName(strings.Repeat("s", 64), long[:127]+"u")
	assert.Len(t, a, 128)
	assert.NotEqual(t, a, b, "two long names that share their prefix map apart")
	assert.Equal(t, a, mcpgate.LedgerToolName(strings.Repeat("s", 64), long), "the mapping is stable")
	spaced := mcpgate.LedgerToolName("shop", "send mail")
	assert.True(t, strings.HasPrefix(spaced, "shop.send_mail~"), spaced)
	assert.NotEqual(t, spaced, mcpgate.LedgerToolName("shop", "send_mail"))
}
