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

// TestPortableReceipt_erasedBy: after an erasure, ledgerctl prove
// --erased-by (from the server or the file) adds the erase receipt, its
// inclusion proof under the bundle's checkpoint and the ranges' opening
// (SPEC §14 "erased_by"); check-proof then prints the field "erased by S".
// Every tampered part makes the bundle INVALID; a holder who drops
// erased_by, or a bundle without it, still proves with the issuer's word;
// a bundle re-encoded by a JSON tool (SPEC §9.1) still proves the erasure.
func TestPortableReceipt_erasedBy(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testPortableErasedBy)
}

func testPortableErasedBy(t *testing.T, db string) {
	dir := t.TempDir()
	marker := randomMarker(t)
	key, vkey := keygen(t, dir, "ex.test")
	l := startLedgerdEnv(t, nil, db, "--signing-key", key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms",
		"--default-payloads", "committed")
	for _, k := range []string{"refund-order-1234", "refund-order-5678"} {
		tok := l.Reserve(t, `{"idempotency_key":"`+k+`","execution_id":"exec-1","tool":"payments.refund","effect":"write"}`)
		l.Commit(t, k, `{"reservation":"`+tok+`","outcome":"succeeded","external_ref":"re_`+marker+`","result":{"to":"`+marker+`"}}`)
	}
	// Receipt 5 erases the results of receipts 2 and 4: ranges [[2,2],[4,4]].
	er := l.Do("POST", "/v1/erasures", `{"keys":["refund-order-1234","refund-order-5678"],"fields":["result"],"reason":"request 9"}`)
	require.Equal(t, 201, er.Status, er.Raw)
	waitCheckpoint(t, l, vkey, 5)

	check := func(t *testing.T, doc string) (string, int) {
		t.Helper()
		f := filepath.Join(t.TempDir(), "p.json")
		require.NoError(t, os.WriteFile(f, []byte(doc), 0o644))
		out, stderr, code := ledgerctl(t, "check-proof", f, "--vkey", vkey)
		return out + stderr, code
	}
	out, stderr, code := ledgerctl(t, "prove", "--server", l.URL, "--erased-by", "2")
	require.Equal(t, 0, code, stderr)
	bundle := strings.TrimSpace(out)
	assert.NotContains(t, bundle, `\"to\"`, "no erased value in a portable receipt")
	var p struct {
		Erased   map[string]uint64 `json:"erased"`
		ErasedBy struct {
			Receipt map[string]any `json:"receipt"`
			Ranges  [][2]uint64    `json:"ranges"`
			Salt    string         `json:"salt"`
		} `json:"erased_by"`
	}
	require.NoError(t, json.Unmarshal([]byte(bundle), &p), bundle)
	assert.Equal(t, map[string]uint64{"result": 5}, p.Erased)
	assert.Equal(t, "erase", p.ErasedBy.Receipt["kind"])
	assert.Equal(t, [][2]uint64{{2, 2}, {4, 4}}, p.ErasedBy.Ranges)
	assert.Len(t, p.ErasedBy.Salt, 32)
	assert.True(t, strings.HasPrefix(p.ErasedBy.Receipt["note"].(string), "pc1:"), "the reason stays committed: %v", p.ErasedBy.Receipt)

	got, code := check(t, bundle)
	require.Equal(t, 0, code, got)
	assert.Contains(t, got, "valid: receipt 2")
	assert.Contains(t, got, "external_ref disclosed; result erased by 5")

	r := l.Do("GET", "/v1/receipts/2/proof?erased_by=true", "") // checked against api/openapi.yaml
	require.Equal(t, 200, r.Status, r.Raw)
	assert.JSONEq(t, bundle, r.Raw, "the route ledgerctl prove --erased-by reads")
	fromDB, stderr, code := ledgerctl(t, "prove", "--db", db, "--erased-by", "2")
	require.Equal(t, 0, code, stderr)
	assert.JSONEq(t, bundle, strings.TrimSpace(fromDB), "the same proof from the file")

	// Without --erased-by: the issuer's word only.
	out, stderr, code = ledgerctl(t, "prove", "--server", l.URL, "2")
	require.Equal(t, 0, code, stderr)
	assert.NotContains(t, out, "erased_by")
	got, code = check(t, strings.TrimSpace(out))
	require.Equal(t, 0, code, got)
	assert.Contains(t, got, "result not disclosed (issuer says erased by 5)")

	edit := func(t *testing.T, f func(doc, erasedBy map[string]any)) string {
		t.Helper()
		var doc map[string]any
		require.NoError(t, json.Unmarshal([]byte(bundle), &doc))
		f(doc, doc["erased_by"].(map[string]any))
		b, err := json.Marshal(doc)
		require.NoError(t, err)
		return string(b)
	}
	// The holder drops erased_by: still valid, with the issuer's word.
	got, code = check(t, edit(t, func(doc, _ map[string]any) { delete(doc, "erased_by") }))
	require.Equal(t, 0, code, got)
	assert.Contains(t, got, "result not disclosed (issuer says erased by 5)")

	// Re-encoded by a JSON tool (members sorted, indented): still proven.
	var anyDoc any
	require.NoError(t, json.Unmarshal([]byte(bundle), &anyDoc))
	re, err := json.MarshalIndent(anyDoc, "", "  ")
	require.NoError(t, err)
	got, code = check(t, string(re))
	require.Equal(t, 0, code, got)
	assert.Contains(t, got, "result erased by 5")

	for _, bad := range []struct {
		desc string
		edit func(doc, erasedBy map[string]any)
		want string
	}{
		{"altered ranges", func(_, e map[string]any) { e["ranges"] = [][2]uint64{{2, 2}} }, "do not open its set"},
		{"altered salt", func(_, e map[string]any) { e["salt"] = strings.Repeat("0", 32) }, "do not open its set"},
		{"the erase's inclusion replaced by the receipt's", func(doc, e map[string]any) { e["inclusion"] = doc["inclusion"] }, "erase receipt 5: proof does not verify"},
		{"a field the erase does not list", func(doc, _ map[string]any) {
			doc["erased"].(map[string]any)["external_ref"] = 5
			delete(doc["payloads"].(map[string]any), "external_ref")
		}, "its fields do not list external_ref"},
		{"the erase receipt edited", func(_, e map[string]any) {
			e["receipt"].(map[string]any)["actor"] = "someone-else"
		}, "erased_by"},
		{"an unknown member", func(_, e map[string]any) { e["checkpoint"] = "x" }, "unknown field"},
	} {
		got, code := check(t, edit(t, bad.edit))
		assert.Equal(t, 1, code, "%s: %s", bad.desc, got)
		assert.Contains(t, got, "INVALID", bad.desc)
		assert.Contains(t, got, bad.want, bad.desc)
	}

	// A second erase (receipt 6) of receipt 2's external_ref: the bundle
	// proves one erasure (the earlier of a tie), the other stays the
	// issuer's word.
	er = l.Do("POST", "/v1/erasures", `{"keys":["refund-order-1234"],"fields":["external_ref"],"reason":"request 10"}`)
	require.Equal(t, 201, er.Status, er.Raw)
	waitCheckpoint(t, l, vkey, 6)
	out, stderr, code = ledgerctl(t, "prove", "--db", db, "--erased-by", "2")
	require.Equal(t, 0, code, stderr)
	assert.NotContains(t, out, marker)
	got, code = check(t, strings.TrimSpace(out))
	require.Equal(t, 0, code, got)
	assert.Contains(t, got, "external_ref not disclosed (issuer says erased by 6); result erased by 5")
}
