package test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/tlog"
)

// walkSigningKeys drives POST and GET …/signing-keys (SPEC §9.2) on d,
// which signs with the key whose verifier key is vkey (and has tokens by
// now): every refusal, a rotation, the conflict of a second one, and the
// history.
func walkSigningKeys(t *testing.T, d *Ledgerd, vkey string, spaces []walkNS, huge string, expect func(Resp, int, string)) {
	t.Helper()
	admin := createToken(t, d.DB, "walk-keys", "admin")
	do := func(method, path, body string, header ...string) Resp {
		return d.Do(method, path, body, append([]string{"Authorization", "Bearer " + admin}, header...)...)
	}
	old, err := tlog.NewVerifier(vkey)
	require.NoError(t, err)
	_, next, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	_, other, err := tlog.GenerateKey("other.test")
	require.NoError(t, err)
	for _, n := range spaces {
		t.Run(n.name, func(t *testing.T) {
			for _, body := range []string{`{}`, `{"vkey":"ex.test+00000000+AAAA"}`, `{"vkey":"` + other + `"}`,
				`{"vkey":"` + next + `","retires":"XYZ"}`, `{"vkey":"` + next + `","x":1}`, `{"vkey":1}`} {
				expect(do("POST", n.v1+"/signing-keys", body), 400, "invalid_request")
			}
			expect(do("POST", n.v1+"/signing-keys", huge), 413, "body_too_large")
			expect(do("POST", n.v1+"/signing-keys", `{"vkey":"`+next+`"}`, "Content-Type", "text/csv"), 415, "unsupported_media_type")
			r := do("POST", n.v1+"/signing-keys", `{"vkey":"`+next+`"}`)
			expect(r, 201, "")
			assert.Equal(t, tlog.KeyID(old), r.Body["retires"])
			expect(do("POST", n.v1+"/signing-keys", `{"vkey":"`+next+`"}`), 409, "key_rotation_conflict")
			r = do("GET", n.v1+"/signing-keys", "")
			expect(r, 200, "")
			assert.Len(t, r.Body["rotations"], 1)
			expect(do("HEAD", n.v1+"/signing-keys", ""), 200, "")
		})
	}
}
