package test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPortableReceipt_committed: a portable receipt of a committed
// namespace (SPEC §14) carries the chain's commitments and opens the
// disclosed fields in "payloads"; check-proof checks each opening, says
// which fields are disclosed, accepts a receipt whose holder dropped an
// entry, refuses a changed value, and after an erasure says which erase
// receipt the issuer names.
func TestPortableReceipt_committed(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testPortableCommitted)
}

func testPortableCommitted(t *testing.T, db string) {
	dir := t.TempDir()
	marker := randomMarker(t)
	key, vkey := keygen(t, dir, "ex.test")
	l := startLedgerdEnv(t, nil, db, "--signing-key", key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms",
		"--default-payloads", "committed")
	tok := l.Reserve(t, `{"idempotency_key":"refund-order-1234","execution_id":"exec-1","tool":"payments.refund","effect":"write"}`)
	l.Commit(t, "refund-order-1234", `{"reservation":"`+tok+`","outcome":"succeeded","external_ref":"re_`+marker+`","result":{"to":"`+marker+`"}}`)
	waitCheckpoint(t, l, vkey, 2)

	out, stderr, code := ledgerctl(t, "prove", "--server", l.URL, "2")
	require.Equal(t, 0, code, stderr)
	bundle := strings.TrimSpace(out)
	var p struct {
		Receipt  map[string]any               `json:"receipt"`
		Payloads map[string]map[string]string `json:"payloads"`
	}
	require.NoError(t, json.Unmarshal([]byte(bundle), &p), bundle)
	assert.True(t, strings.HasPrefix(p.Receipt["external_ref"].(string), "pc1:"), "the chain's text: %v", p.Receipt)
	assert.True(t, strings.HasPrefix(p.Receipt["result_text"].(string), "pc1:"))
	assert.Equal(t, "re_"+marker, p.Payloads["external_ref"]["value"])
	assert.Equal(t, `{"to":"`+marker+`"}`, p.Payloads["result"]["value"])
	assert.Len(t, p.Payloads["result"]["salt"], 32)

	check := func(t *testing.T, doc string) (string, int) {
		t.Helper()
		f := filepath.Join(t.TempDir(), "p.json")
		require.NoError(t, os.WriteFile(f, []byte(doc), 0o644))
		out, stderr, code := ledgerctl(t, "check-proof", f, "--vkey", vkey)
		return out + stderr, code
	}
	got, code := check(t, bundle)
	require.Equal(t, 0, code, got)
	assert.Contains(t, got, "valid: receipt 2")
	assert.Contains(t, got, "external_ref disclosed; result disclosed")

	// Selective disclosure: the holder drops the result's opening.
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(bundle), &doc))
	delete(doc["payloads"].(map[string]any), "result")
	withheld, err := json.Marshal(doc)
	require.NoError(t, err)
	got, code = check(t, string(withheld))
	require.Equal(t, 0, code, got)
	assert.Contains(t, got, "external_ref disclosed; result not disclosed")

	for _, bad := range []struct{ desc, doc, want string }{
		{"a changed value", strings.Replace(bundle, `"value":"re_`+marker, `"value":"re_forged`, 1), "does not open its commitment"},
		{"an unknown payload field", strings.Replace(bundle, `"payloads":{`, `"payloads":{"tool":{"value":"x","salt":"00"},`, 1), "not a payload field"},
		{"an extra member", strings.Replace(bundle, `"result":{"value":`, `"result":{"why":1,"value":`, 1), "unknown field"},
	} {
		got, code := check(t, bad.doc)
		assert.Equal(t, 1, code, "%s: %s", bad.desc, got)
		assert.Contains(t, got, "INVALID", bad.desc)
		assert.Contains(t, got, bad.want, bad.desc)
	}

	// The same bundle from the file.
	fromDB, stderr, code := ledgerctl(t, "prove", "--db", db, "2")
	require.Equal(t, 0, code, stderr)
	assert.JSONEq(t, bundle, strings.TrimSpace(fromDB), "the same proof from the file")

	// After an erasure the bundle withholds the values and names the erase.
	er := l.Do("POST", "/v1/erasures", `{"keys":["refund-order-1234"],"reason":"request 9"}`)
	require.Equal(t, 201, er.Status, er.Raw)
	waitCheckpoint(t, l, vkey, 3)
	out, stderr, code = ledgerctl(t, "prove", "--server", l.URL, "2")
	require.Equal(t, 0, code, stderr)
	assert.NotContains(t, out, marker, "no erased value in a portable receipt")
	got, code = check(t, strings.TrimSpace(out))
	require.Equal(t, 0, code, got)
	assert.Contains(t, got, "external_ref not disclosed (issuer says erased by 3)")
}
