package chain_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
)

// reencodeReceipt passes a receipt's JSON through encoding/json as a
// map: members reordered, strings re-escaped, numbers kept as written.
func reencodeReceipt(t *testing.T, b []byte) []byte {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	var m map[string]any
	require.NoError(t, dec.Decode(&m))
	out, err := json.MarshalIndent(m, "", "  ")
	require.NoError(t, err)
	return out
}

// TestReceipt_JSON_resultText checks SPEC §9.1: every JSON receipt carries
// result_text, a re-encoded receipt still decodes to the stored result
// (and hashes), and a result that is not result_text's value is refused.
func TestReceipt_JSON_resultText(t *testing.T) {
	_, r2 := vector()
	l := chain.Link(1, chain.ZeroHash, r2)
	l.Result = `{"z":[1.0,2.50,1e2,-0],"big":9007199254740993,"s":"<&> é\u2028","a":{"b":null}}`
	l = chain.Link(1, chain.ZeroHash, l)
	b := l.AppendJSON(nil)
	assert.Contains(t, string(b), `"result":`+l.Result+`,"result_text":`+string(chain.AppendJSONString(nil, l.Result))+`,"error_code"`)

	t.Run("re-encoded", func(t *testing.T) {
		re := reencodeReceipt(t, b)
		require.NotContains(t, string(re), l.Result, "the embedded result's bytes changed")
		var got chain.Receipt
		require.NoError(t, json.Unmarshal(re, &got))
		assert.Equal(t, l.Result, got.Result, "the result is result_text's value")
		assert.NoError(t, got.Check())
	})
	t.Run("without result_text as before", func(t *testing.T) {
		without := []byte(strings.Replace(string(b), `,"result_text":`+string(chain.AppendJSONString(nil, l.Result)), "", 1))
		require.NotContains(t, string(without), "result_text")
		var got chain.Receipt
		require.NoError(t, json.Unmarshal(without, &got))
		assert.Equal(t, l.Result, got.Result)
		assert.NoError(t, got.Check())
		re := reencodeReceipt(t, without)
		require.NoError(t, json.Unmarshal(re, &got))
		assert.ErrorIs(t, got.Check(), chain.ErrHashMismatch, "the re-encoded bytes are hashed")
	})
	for _, tc := range []struct{ desc, from, to, want string }{
		{"result altered", `"result":{"z":[1.0,2.50,1e2,-0],"big":9007199254740993`, `"result":{"z":[1.0,2.50,1e2,-0],"big":9007199254740992`,
			"at $.big: 9007199254740992 in result, 9007199254740993 in result_text"},
		{"result_text altered", `"result_text":"{\"z\":[1.0,2.50,1e2,-0],\"big\":9007199254740993`, `"result_text":"{\"z\":[1.0,2.50,1e2,-0],\"big\":9007199254740992`,
			"at $.big: 9007199254740993 in result, 9007199254740992 in result_text"},
		{"member added", `"a":{"b":null}}`, `"a":{"b":null,"c":1}}`, "at $.a.c: 1 in result, absent in result_text"},
		{"duplicate member", `"a":{"b":null}}`, `"a":{"b":null,"b":null}}`, `result: member name "b" appears twice`},
		{"result null", `"result":` + l.Result + `,`, `"result":null,`, "result is null, result_text is not empty"},
		{"result_text not JSON", `"result_text":"{`, `"result_text":"{{`, "result_text: not one JSON value"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			in := strings.Replace(string(b), tc.from, tc.to, 1)
			require.NotEqual(t, string(b), in)
			var got chain.Receipt
			err := json.Unmarshal([]byte(in), &got)
			require.ErrorIs(t, err, chain.ErrResultMismatch)
			var rm *chain.ResultMismatchError
			require.ErrorAs(t, err, &rm)
			assert.Equal(t, uint64(2), rm.Seq)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	t.Run("no result", func(t *testing.T) {
		r := chain.Link(0, chain.ZeroHash, chain.Receipt{Kind: chain.KindReserve, IdempotencyKey: "k-12345678"})
		b := r.AppendJSON(nil)
		assert.Contains(t, string(b), `"result":null,"result_text":"",`)
		var got chain.Receipt
		require.NoError(t, json.Unmarshal(b, &got))
		assert.Equal(t, r, got)
		bad := strings.Replace(string(b), `"result_text":""`, `"result_text":"{}"`, 1)
		assert.ErrorIs(t, json.Unmarshal([]byte(bad), &got), chain.ErrResultMismatch)
		bad = strings.Replace(string(b), `"result":null`, `"result":{}`, 1)
		assert.ErrorIs(t, json.Unmarshal([]byte(bad), &got), chain.ErrResultMismatch)
	})
	t.Run("a member name twice", func(t *testing.T) {
		for _, result := range []string{`{"a":1,"a":2}`, `[{"x":{"b":1,"\u0062":2}}]`, `{"a":{"a":1},"a":[]}`} {
			r := l
			r.Result = result
			b := r.AppendJSON(nil)
			assert.Contains(t, string(b), `"result":`+string(chain.AppendJSONString(nil, result))+`,"result_encoding":"text","result_text":`, result)
			var got chain.Receipt
			require.NoError(t, json.Unmarshal(reencodeReceipt(t, b), &got), result)
			assert.Equal(t, result, got.Result)
		}
		r := l
		r.Result = `{"a":{"a":1},"b":[{"a":1},{"a":2}]}`
		assert.Contains(t, string(r.AppendJSON(nil)), `"result":`+r.Result+`,"result_text":`, "names repeat in different objects only")
	})
	t.Run("result_encoding", func(t *testing.T) {
		r := l
		r.Result = `{"a": 1}`
		b := r.AppendJSON(nil)
		assert.Contains(t, string(b), `"result":"{\"a\": 1}","result_encoding":"text","result_text":"{\"a\": 1}",`)
		var got chain.Receipt
		require.NoError(t, json.Unmarshal(reencodeReceipt(t, b), &got))
		assert.Equal(t, r.Result, got.Result)
		bad := strings.Replace(string(b), `"result_text":"{\"a\": 1}"`, `"result_text":"{\"a\":1}"`, 1)
		assert.ErrorIs(t, json.Unmarshal([]byte(bad), &got), chain.ErrResultMismatch, "text compared exactly")

		r.Result = "{\"a\":\"\xff\"}"
		b = r.AppendJSON(nil)
		assert.NotContains(t, string(b), "result_text", "no JSON string holds bytes that are not UTF-8")
		require.NoError(t, json.Unmarshal(b, &got))
		assert.Equal(t, r.Result, got.Result)
	})
}
