package chain_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
)

// vkeyA and vkeyB are Ed25519 verifier keys made by
// golang.org/x/mod/sumdb/note.GenerateKey(rand.Reader, "ex.test"); the
// id is the first 4 bytes of SHA-256("ex.test\n" ‖ 0x01 ‖ public key):
//
//	printf 'ex.test\n' > k; echo AWviOq6gzsPyqoaULD46VpaiKBecDYmoBKl2lg5cyTxG | base64 -d >> k; sha256sum k | cut -c1-8
const (
	vkeyA = "ex.test+44cb48a7+AWviOq6gzsPyqoaULD46VpaiKBecDYmoBKl2lg5cyTxG"
	vkeyB = "ex.test+5efd5a1c+AZR2Xr+YCEYEDiqBMwB0euJz5Y1Ffzzk1U0hh7zgGt9q"
)

func TestParseVerifierKey(t *testing.T) {
	name, id, err := chain.ParseVerifierKey(vkeyA)
	require.NoError(t, err)
	assert.Equal(t, "ex.test", name)
	assert.Equal(t, "44cb48a7", id)
	for _, tt := range []struct{ desc, vkey, wantErr string }{
		{"no parts", "ex.test", "NAME+ID+KEY"},
		{"id of another key", "ex.test+44cb48a8+AWviOq6gzsPyqoaULD46VpaiKBecDYmoBKl2lg5cyTxG", "does not match"},
		{"another name", "other.test+44cb48a7+AWviOq6gzsPyqoaULD46VpaiKBecDYmoBKl2lg5cyTxG", "does not match"},
		{"uppercase id", "ex.test+44CB48A7+AWviOq6gzsPyqoaULD46VpaiKBecDYmoBKl2lg5cyTxG", "8 lowercase hex"},
		{"not Ed25519", "ex.test+44cb48a7+AmviOq6gzsPyqoaULD46VpaiKBecDYmoBKl2lg5cyTxG", "Ed25519"},
		{"short key", "ex.test+44cb48a7+AWviOq6g", "Ed25519"},
		{"space in name", "ex test+44cb48a7+AWviOq6gzsPyqoaULD46VpaiKBecDYmoBKl2lg5cyTxG", "NAME+ID+KEY"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			_, _, err := chain.ParseVerifierKey(tt.vkey)
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestParseKeyResult(t *testing.T) {
	k := chain.KeyResult{VKey: vkeyB, Retires: "44cb48a7"}
	text := `{"retires":"44cb48a7","vkey":"` + vkeyB + `"}`
	assert.Equal(t, text, k.Text(), "RFC 8785: members sorted by name")
	got, err := chain.ParseKeyResult(text)
	require.NoError(t, err)
	assert.Equal(t, k, *got)
	for _, tt := range []struct{ desc, text, wantErr string }{
		{"members reordered", `{"vkey":"` + vkeyB + `","retires":"44cb48a7"}`, "RFC 8785"},
		{"white space", `{"retires": "44cb48a7","vkey":"` + vkeyB + `"}`, "RFC 8785"},
		{"unknown member", `{"retires":"44cb48a7","vkey":"` + vkeyB + `","x":1}`, "unknown field"},
		{"retires itself", `{"retires":"5efd5a1c","vkey":"` + vkeyB + `"}`, "retires itself"},
		{"retires no key id", `{"retires":"44cb48","vkey":"` + vkeyB + `"}`, "not a key id"},
		{"bad vkey", `{"retires":"44cb48a7","vkey":"ex.test+00000000+AAAA"}`, "vkey"},
		{"not JSON", `retires`, "malformed key result"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			_, err := chain.ParseKeyResult(tt.text)
			assert.ErrorIs(t, err, chain.ErrKeyResult)
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}
