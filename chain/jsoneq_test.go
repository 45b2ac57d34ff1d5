package chain_test

import (
	"bytes"
	"encoding/json"
	"math/big"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
)

func TestDiffJSON(t *testing.T) {
	for _, tc := range [][2]string{
		{`{"a":1,"b":[1,2]}`, "{ \"b\": [ 1, 2 ],\n  \"a\": 1.0 }"},
		{`1`, `1.0`}, {`1`, `1e0`}, {`1`, `10e-1`}, {`1`, `0.1E+1`}, {`1`, `100000e-5`},
		{`0`, `-0`}, {`0`, `0.000e99`}, {`-0.0`, `0e-5`},
		{`100`, `1e2`}, {`100`, `1E+2`}, {`-1.5`, `-15e-1`},
		{`12345678901234567890123`, `12345678901234567890123.000`},
		{`1e99999999999999999999999`, `10e99999999999999999999998`},
		{`"é"`, `"\u00e9"`}, {`"/"`, `"\/"`}, {`"<&>"`, `"\u003c\u0026\u003e"`},
		{`"\ud83d\ude00"`, `"😀"`}, {`"\\ud800"`, `"\\ud800"`}, {`"\\\ud83d\ude00"`, `"\\😀"`},
		{`[]`, `[ ]`}, {`{}`, `{ }`}, {`null`, ` null `}, {`true`, "\ttrue\n"},
		{`{"":{"x":[{"y":null}]}}`, `{"": {"x": [{"y": null}]}}`},
	} {
		d, err := chain.DiffJSON([]byte(tc[0]), []byte(tc[1]))
		require.NoError(t, err, "%s %s", tc[0], tc[1])
		assert.Empty(t, d, "%s and %s are the same JSON value", tc[0], tc[1])
	}
	for _, tc := range []struct{ a, b, want string }{
		{`{"n":9007199254740993}`, `{"n":9007199254740992}`, "at $.n: 9007199254740993 in the first, 9007199254740992 in the second"},
		{`0.1`, `0.10000000000000001`, "at $: 0.1 in the first, 0.10000000000000001 in the second"},
		{`1e400`, `1e401`, "at $: 1e400"},
		{`-1`, `1`, "at $: -1"},
		{`[1,2]`, `[2,1]`, "at $[0]: 1 in the first, 2 in the second"},
		{`[1,2]`, `[1,2,3]`, "at $: an array of 2 in the first, an array of 3 in the second"},
		{`{"a":1}`, `{"a":1,"b":null}`, "at $.b: absent in the first, null in the second"},
		{`{"a b":{"c":1}}`, `{"a b":{}}`, `at $["a b"].c: 1 in the first, absent in the second`},
		{`1`, `"1"`, `at $: 1 in the first, "1" in the second`},
		{`null`, `false`, "at $: null in the first, false in the second"},
		{`""`, `null`, `at $: "" in the first, null in the second`},
		{`{"a":[]}`, `{"a":{}}`, "at $.a: an array of 0 in the first, an object of 0 members in the second"},
		{`"é"`, `"e\u0301"`, `at $: "é" in the first`},
	} {
		d, err := chain.DiffJSON([]byte(tc.a), []byte(tc.b))
		require.NoError(t, err)
		assert.Contains(t, d, tc.want, "%s vs %s", tc.a, tc.b)
		eq, err := chain.EqualJSON([]byte(tc.b), []byte(tc.a))
		require.NoError(t, err)
		assert.False(t, eq, "%s vs %s", tc.b, tc.a)
	}
	for _, tc := range []struct{ bad, want string }{
		{`{"a":1,"a":1}`, `member name "a" appears twice`},
		{`{"a":{"b":1,"\u0062":2}}`, `member name "b" appears twice`},
		{`[{"x":1},{"y":1,"y":2}]`, `member name "y" appears twice`},
		{`{`, "not one JSON value"},
		{`1 2`, "not one JSON value"},
		{``, "not one JSON value"},
		{`NaN`, "not one JSON value"},
		{"\"\xff\"", "not UTF-8"},
		{`"\ud800"`, `a lone surrogate escape \ud800`},
		{`["\udc00x"]`, `a lone surrogate escape \udc00`},
		{`{"k":"\ud83d\u0041"}`, `a lone surrogate escape \ud83d`},
		{`"\ud83d"`, `a lone surrogate escape \ud83d`},
		{strings.Repeat("[", 20000) + strings.Repeat("]", 20000), "not one JSON value"},
	} {
		_, err := chain.DiffJSON([]byte(`1`), []byte(tc.bad))
		require.Error(t, err, tc.bad)
		assert.Contains(t, err.Error(), "second value: "+tc.want)
		_, err = chain.EqualJSON([]byte(tc.bad), []byte(`1`))
		assert.ErrorContains(t, err, "first value: "+tc.want)
	}
}

// FuzzEqualJSON checks the JSON equality of SPEC §9.1: reflexive and
// symmetric, blind to what an encoder may change (spacing, member order,
// string escapes: an encoding/json round trip that keeps number literals),
// and exact on numbers (a big.Rat oracle). Seeds cover the cases of
// TestDiffJSON; testdata/fuzz/FuzzEqualJSON may hold more.
func FuzzEqualJSON(f *testing.F) {
	for _, s := range [][2]string{
		{`{"amount":1200,"currency":"eur"}`, `{"currency":"eur","amount":1200.0}`},
		{`9007199254740993`, `9007199254740992`},
		{`1.0`, `1e0`}, {`-0`, `0`}, {`1e400`, `10e399`}, {`0.1`, `0.10000000000000001`},
		{`{"a":1,"a":2}`, `{"a":1}`},
		{`["\u00e9","\/",{"":null}]`, `["é","/",{"":null}]`},
		{`[1,[2,[3,{"x":true}]]]`, `[1,[2,[3,{"x":false}]]]`},
		{`"\ud800"`, `"\ufffd"`},
		{`{`, `}`},
		{`{"a":{"b":1},"c":[{"b":1,"\u0062":2}]}`, `{"a":{"b":1}}`},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ab, errAB := chain.EqualJSON([]byte(a), []byte(b))
		ba, errBA := chain.EqualJSON([]byte(b), []byte(a))
		if (errAB == nil) != (errBA == nil) || ab != ba {
			t.Fatalf("not symmetric: %q %q: %v %v / %v %v", a, b, ab, errAB, ba, errBA)
		}
		if errAB == nil {
			checkNumbers(t, a, b, ab)
		}
		checkReceiptResult(t, a)
		if _, err := chain.DiffJSON([]byte(a), []byte(a)); err != nil {
			return // a is not a value the equality accepts
		}
		if eq, err := chain.EqualJSON([]byte(a), []byte(a)); err != nil || !eq {
			t.Fatalf("%q is not equal to itself: %v", a, err)
		}
		for _, re := range reencode(t, a) {
			if eq, err := chain.EqualJSON([]byte(a), re); err != nil || !eq {
				d, _ := chain.DiffJSON([]byte(a), re)
				t.Fatalf("%q re-encoded as %q is not equal: %v %s", a, re, err, d)
			}
		}
	})
}

// reencode returns a through encoding/json with number literals kept:
// compact with sorted keys, and indented.
func reencode(t *testing.T, a string) [][]byte {
	dec := json.NewDecoder(strings.NewReader(a))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("encoding/json refuses %q, which EqualJSON accepted: %v", a, err)
	}
	compact, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var ind bytes.Buffer
	enc := json.NewEncoder(&ind)
	enc.SetIndent(" ", "\t")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return [][]byte{compact, ind.Bytes()}
}

// checkNumbers compares EqualJSON on two number literals of small
// exponent with math/big's exact rationals.
func checkNumbers(t *testing.T, a, b string, eq bool) {
	ra, okA := smallNumber(a)
	rb, okB := smallNumber(b)
	if okA && okB && (ra.Cmp(rb) == 0) != eq {
		t.Fatalf("%s and %s: EqualJSON %v, exact values %v and %v", a, b, eq, ra, rb)
	}
}

func smallNumber(s string) (*big.Rat, bool) {
	s = strings.TrimSpace(s)
	if _, exp, ok := strings.Cut(strings.ToLower(s), "e"); len(s) > 60 || ok && len(strings.TrimLeft(exp, "+-")) > 3 {
		return nil, false
	}
	var n json.Number
	if err := json.Unmarshal([]byte(s), &n); err != nil {
		return nil, false
	}
	r, ok := new(big.Rat).SetString(string(n))
	return r, ok
}

// checkReceiptResult checks that a receipt whose stored result is the
// compact JSON a is embedded verbatim unless an object of a has a member
// name twice (then as a string marked "text", SPEC §9.1), and that either
// way it decodes to a's exact text.
func checkReceiptResult(t *testing.T, a string) {
	if !chain.IsCompactJSON(a) || a == "null" {
		return
	}
	out := (&chain.Receipt{Result: a}).AppendJSON(nil)
	_, err := chain.DiffJSON([]byte(a), []byte(a))
	dup := err != nil && (strings.Contains(err.Error(), "appears twice") || strings.Contains(err.Error(), "lone surrogate"))
	verbatim := bytes.Contains(out, []byte(`"result":`+a+`,"result_text":`))
	if verbatim == dup {
		t.Fatalf("%q (a member twice: %v) embedded verbatim: %v: %s", a, dup, verbatim, out)
	}
	var back chain.Receipt
	if err := json.Unmarshal(out, &back); err != nil || back.Result != a {
		t.Fatalf("%q came back as %q: %v", a, back.Result, err)
	}
}
