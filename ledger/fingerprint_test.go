package ledger_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/gowebpki/jcs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// TestFingerprint checks the RFC 8785 examples: the fingerprint is the
// SHA-256 of the canonical text.
func TestFingerprint(t *testing.T) {
	for _, tt := range []struct {
		desc, input, canonical string
	}{
		{
			desc: "RFC 8785 §3.2.2 example",
			input: `{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`,
			canonical: `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`,
		},
		{
			desc:      "RFC 8785 §3.2.3 sorting by UTF-16 code units",
			input:     `{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}`,
			canonical: "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"\u00f6\":\"Latin Small Letter O With Diaeresis\",\"\u20ac\":\"Euro Sign\",\"\U0001F600\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}",
		},
		{desc: "whitespace and key order do not matter", input: ` { "b" : 1 , "a" : [ 1.0 , 2 ] } `, canonical: `{"a":[1,2],"b":1}`},
		{desc: "scalar", input: `"x"`, canonical: `"x"`},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			got, err := ledger.Fingerprint([]byte(tt.input))
			require.NoError(t, err)
			sum := sha256.Sum256([]byte(tt.canonical))
			assert.Equal(t, "sha256:"+hex.EncodeToString(sum[:]), got)
		})
	}
	for _, bad := range []string{`{"a":1,"a":2}`, `1e400`, `"\udc00"`, `{`, ``, `[1,]`} {
		_, err := ledger.Fingerprint([]byte(bad))
		assert.Error(t, err, "input %q", bad)
	}
}

// FuzzFingerprint checks that fingerprints are stable: the canonical form
// has the same fingerprint as the input, and canonicalising is idempotent.
func FuzzFingerprint(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `[1.0,2e3,-0,"\u00e9"]`, `{"b":{"c":[null,true]},"a":"x"}`, `1e21`, `0.000001`, `"\ud83d\ude00"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		fp, err := ledger.Fingerprint([]byte(input))
		if err != nil {
			return
		}
		canon, err := jcs.Transform([]byte(input))
		if err != nil {
			t.Fatalf("fingerprinted but not canonicalisable: %v", err)
		}
		again, err := ledger.Fingerprint(canon)
		if err != nil {
			t.Fatalf("canonical form %q rejected: %v", canon, err)
		}
		if again != fp {
			t.Fatalf("fingerprint of canonical form %q differs", canon)
		}
	})
}
