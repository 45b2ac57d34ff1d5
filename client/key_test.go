package client_test

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
)

// TestDeriveKey_knownAnswer pins the derivation, the same as the Python
// client's derive_key, so that gateways in either language (and other
// versions of this one) produce the same keys. Reproduce with
//
//	printf 'payments.refund\0{"amount":1200,"order":1234}' | sha256sum
//	printf '%s' '{"amount":1200,"order":1234}' | sha256sum
func TestDeriveKey_knownAnswer(t *testing.T) {
	k, err := client.DeriveKey("payments.refund", map[string]any{"order": 1234, "amount": 1200})
	require.NoError(t, err)
	assert.Equal(t, "dk_31e288fb6af29670771000949272b245789abeec76d397b530b10fb4990778eb", k)
	// printf 't\0null' | sha256sum
	k, err = client.DeriveKey("t", nil)
	require.NoError(t, err)
	assert.Equal(t, "dk_77413b11a83af4269e0b4368e43556391776fb26d92ea8ba3dfa4eda466f1899", k)
	fp, err := client.Fingerprint(map[string]any{"order": 1234, "amount": 1200})
	require.NoError(t, err)
	assert.Equal(t, "sha256:75a2e07e97a84fa440d4e0acff1fdcc639894a7a661b58c25ee7cc50266ec7fa", fp)
}

// crossLanguage is the derivation vector pinned by the Go, Python
// (clients/python/tests/test_canonical.py) and TypeScript
// (clients/typescript/test/canonical.test.mjs) suites alike: member names
// that sort differently by bytes and by UTF-16, escapes, and numbers whose
// ECMAScript spelling differs from their source (1e21 → 1e+21, -0.0 → 0).
const (
	crossTool  = "crm.contact.upsert"
	crossInput = `{"name":"Zoë Ünal","emails":["zoe@example.com"],"age":41,"score":0.1,"big":1e21,"small":1e-7,"neg":-0.0,"ok":true,"none":null,"€":"euro","é":"e-acute","a\nb":"tab\t\u0001"}`
	crossKey   = "dk_469d84d0f62eb0da9f12f4e7322f1679998e36bc1fa682f55edb5e6c5457724a"
	crossFP    = "sha256:849fddd7ea461d28838de74ba790297d074cc85558d3ee82c3050320ec388b44"
)

// TestDeriveKey_crossLanguage: the three clients derive the same key and
// fingerprint from the same call.
func TestDeriveKey_crossLanguage(t *testing.T) {
	k, err := client.DeriveKey(crossTool, json.RawMessage(crossInput))
	require.NoError(t, err)
	assert.Equal(t, crossKey, k)
	fp, err := client.Fingerprint(json.RawMessage(crossInput))
	require.NoError(t, err)
	assert.Equal(t, crossFP, fp)
}

// crossDerivationKey is the derivation key of the dk2_ vector the three
// clients pin alike (bytes 0x00 … 0x1f), and crossKey2 the key of the
// crossLanguage call derived with it in a committed namespace.
const (
	crossDerivationKey = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
	crossKey2          = "dk2_1eb893d57b5576d26f89a6673c6f2fafae5af686fdf85712bf1f729206e3dd17"
)

// TestDeriveKeyWith_knownAnswer pins the dk2_ derivation (SPEC §14), the
// same in the Python and TypeScript clients. Reproduce with
//
//	printf 'payments.refund\0{"amount":1200,"order":1234}' |
//	  openssl dgst -sha256 -mac HMAC -macopt hexkey:000102…1e1f
func TestDeriveKeyWith_knownAnswer(t *testing.T) {
	key, err := hex.DecodeString(crossDerivationKey)
	require.NoError(t, err)
	k, err := client.DeriveKeyWith(key, crossTool, json.RawMessage(crossInput))
	require.NoError(t, err)
	assert.Equal(t, crossKey2, k)
	k, err = client.DeriveKeyWith(key, "payments.refund", map[string]any{"order": 1234, "amount": 1200})
	require.NoError(t, err)
	assert.Equal(t, "dk2_0a9d3f77240a6a4953cce53ebbe391bc1175c9d02f0e90a28852fdf59524370c", k)
	// printf 't\0null' | openssl dgst -sha256 -mac HMAC -macopt hexkey:…
	k, err = client.DeriveKeyWith(key, "t", nil)
	require.NoError(t, err)
	assert.Equal(t, "dk2_ba5650b624f400768aeca378e635bd33868970589c2564363a5483287279ff18", k)
	assert.NoError(t, validKey(k))

	other := append([]byte(nil), key...)
	other[0] ^= 1
	k2, err := client.DeriveKeyWith(other, "t", nil)
	require.NoError(t, err)
	assert.NotEqual(t, k, k2, "another namespace's key, another derived key")

	_, err = client.DeriveKeyWith(nil, "t", nil)
	assert.ErrorContains(t, err, "empty derivation key")
	_, err = client.DeriveKeyWith(key, "", nil)
	assert.ErrorContains(t, err, "empty tool")
}

// TestDerivationKey_DeriveKey: a committed namespace's key derives dk2_,
// an inline one's (or none) dk_.
func TestDerivationKey_DeriveKey(t *testing.T) {
	key, err := hex.DecodeString(crossDerivationKey)
	require.NoError(t, err)
	for _, tt := range []struct {
		dk   *client.DerivationKey
		want string
	}{
		{&client.DerivationKey{Payloads: client.PayloadsCommitted, Key: key}, crossKey2},
		{&client.DerivationKey{Payloads: client.PayloadsInline, Key: key}, crossKey},
		{&client.DerivationKey{Payloads: client.PayloadsInline}, crossKey},
		{nil, crossKey},
	} {
		got, err := tt.dk.DeriveKey(crossTool, json.RawMessage(crossInput))
		require.NoError(t, err)
		assert.Equal(t, tt.want, got)
	}
}

// validKey checks a key as the ledger does: 8–255 bytes of visible ASCII.
func validKey(k string) error {
	if len(k) < client.MinKeyLen || len(k) > client.MaxKeyLen {
		return fmt.Errorf("%d bytes", len(k))
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return fmt.Errorf("byte %d", i)
		}
	}
	return nil
}

// TestDeriveKey_stable: the same call gives the same key whatever the
// member order, spacing, number form or Go type of its input.
func TestDeriveKey_stable(t *testing.T) {
	type order struct {
		Order  int     `json:"order"`
		Amount float64 `json:"amount"`
		Note   string  `json:"note"`
	}
	want, err := client.DeriveKey("payments.refund", json.RawMessage(`{"amount":1200,"note":"<é>","order":1234}`))
	require.NoError(t, err)
	for _, tt := range []struct {
		desc  string
		input any
	}{
		{"map", map[string]any{"order": 1234, "note": "<é>", "amount": 1200}},
		{"map built in another order", func() map[string]any {
			m := map[string]any{}
			m["note"], m["amount"], m["order"] = "<é>", 1200.0, 1234
			return m
		}()},
		{"struct", order{Order: 1234, Amount: 1200, Note: "<é>"}},
		{"raw JSON, other order and spacing", json.RawMessage(" {\"order\": 1234 ,\n \"note\":\"<\\u00e9>\", \"amount\": 1.2e3}")},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			got, err := client.DeriveKey("payments.refund", tt.input)
			require.NoError(t, err)
			assert.Equal(t, want, got)
		})
	}
	other, err := client.DeriveKey("payments.refund", map[string]any{"order": 1234, "note": "<é>", "amount": 1201})
	require.NoError(t, err)
	assert.NotEqual(t, want, other, "another input, another key")
	otherTool, err := client.DeriveKey("payments.charge", json.RawMessage(`{"amount":1200,"note":"<é>","order":1234}`))
	require.NoError(t, err)
	assert.NotEqual(t, want, otherTool, "the tool is hashed too")
}

// TestDeriveKey_valid: every derived key is one the ledger accepts,
// whatever the tool's name, and never a generated-looking one.
func TestDeriveKey_valid(t *testing.T) {
	for _, tool := range []string{"email.send", "gen_report", "send mail\tnow é", strings.Repeat("t", 300)} {
		t.Run(tool[:min(len(tool), 20)], func(t *testing.T) {
			k, err := client.DeriveKey(tool, nil)
			require.NoError(t, err)
			assert.True(t, strings.HasPrefix(k, client.DerivedKeyPrefix), k)
			assert.Len(t, k, 67)
			assert.False(t, strings.HasPrefix(k, "gen_"), "the ledger's generated keys start with gen_")
			for i := 0; i < len(k); i++ {
				assert.True(t, k[i] >= 0x21 && k[i] <= 0x7e, "byte %d of %s is not visible ASCII", i, k)
			}
		})
	}
	t.Run("ErrEmptyTool", func(t *testing.T) {
		_, err := client.DeriveKey("", 1)
		assert.Error(t, err)
	})
	t.Run("ErrInvalidInput", func(t *testing.T) {
		_, err := client.DeriveKey("t", json.RawMessage(`{"a":1,"a":2}`))
		assert.Error(t, err)
		_, err = client.DeriveKey("t", func() {})
		assert.Error(t, err)
	})
}
