package chain_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
)

// vector returns the two receipts of the SPEC §2 test vector.
func vector() (chain.Receipt, chain.Receipt) {
	r1 := chain.Receipt{
		Seq: 1, Kind: "reserve", IdempotencyKey: "refund-order-1234", ExecutionID: "exec-1",
		Attempt: 1, Tool: "payments.refund", Effect: "write", Idempotent: true,
		InputHash:      "sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8",
		LeaseExpiresAt: 1764475230000, RecordedAt: 1764475200000,
	}
	r2 := chain.Receipt{
		Seq: 2, Kind: "commit", IdempotencyKey: r1.IdempotencyKey, ExecutionID: r1.ExecutionID,
		Attempt: 1, Tool: r1.Tool, Effect: r1.Effect, Idempotent: true, InputHash: r1.InputHash,
		Outcome: "succeeded", ExternalRef: "re_3Pq9", Result: `{"amount":1200,"currency":"eur"}`,
		RefSeq: 1, RecordedAt: 1764475200450,
	}
	return r1, r2
}

// TestReceipt_Hash_vector checks the test vector of docs/spec.md §2. To
// reproduce the first hash (prints "216 c536a780…"):
//
//	python3 - <<'EOF'
//	import hashlib, struct
//	def u(n): return struct.pack('>Q', n)
//	def b(x): return bytes([x])
//	def s(x): x = x.encode(); return struct.pack('>I', len(x)) + x
//	body = (u(1) + s('reserve') + s('refund-order-1234') + b(0) + s('exec-1') + u(1)
//	        + s('payments.refund') + s('write') + b(1)
//	        + s('sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8')
//	        + s('') * 5 + b(0) + u(1764475230000) + u(0) + s('') * 2 + u(1764475200000))
//	print(len(body), hashlib.sha256(b'effect-receipt-ledger/v1' + bytes(32) + body).hexdigest())
//	EOF
func TestReceipt_Hash_vector(t *testing.T) {
	r1, r2 := vector()
	assert.Equal(t, 216, len(r1.Body()), "body length of seq 1")
	assert.Equal(t, r1.BodySize(), len(r1.Body()))
	assert.Equal(t, r2.BodySize(), len(r2.Body()))

	h1 := r1.ComputeHash(chain.ZeroHash)
	assert.Equal(t, "c536a7804a3ee6fc1e44013c9550bcb8eb839e87df00f32e9462edc720f7771d", h1.String())
	h2 := r2.ComputeHash(h1)
	assert.Equal(t, "5696e522798aa5923576765d1e4184cdd8076fbac9c7ea31056382427453c3c4", h2.String())

	// Link builds the same chain.
	l1 := chain.Link(0, chain.ZeroHash, r1)
	l2 := chain.Link(l1.Seq, l1.Hash, r2)
	assert.Equal(t, h1, l1.Hash)
	assert.Equal(t, uint64(2), l2.Seq)
	assert.Equal(t, h1, l2.PrevHash)
	assert.Equal(t, h2, l2.Hash)
	assert.NoError(t, l1.Check())
	assert.NoError(t, l2.Check())

	var h chain.Hasher
	assert.Equal(t, h1, h.Hash(chain.ZeroHash, &r1))
	assert.Equal(t, h2, h.Hash(h1, &r2))
}

// TestReceipt_Body_layout checks the exact byte layout of the first fields.
func TestReceipt_Body_layout(t *testing.T) {
	r1, _ := vector()
	body := r1.Body()
	want := []byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 7, 'r', 'e', 's', 'e', 'r', 'v', 'e', 0, 0, 0, 17}
	assert.Equal(t, want, body[:len(want)])
	// recorded_at is the last 8 bytes.
	assert.Equal(t, uint64(1764475200000), binary.BigEndian.Uint64(body[len(body)-8:]))
}

// TestReceipt_Hash_everyField changes each field in turn and checks that
// the hash changes.
func TestReceipt_Hash_everyField(t *testing.T) {
	_, base := vector()
	baseHash := base.ComputeHash(chain.ZeroHash)
	v := reflect.ValueOf(&base).Elem()
	tested := 0
	for i := 0; i < v.NumField(); i++ {
		name := v.Type().Field(i).Name
		if name == "PrevHash" || name == "Hash" || name == "Malformed" || name == "Open" { // not hashed
			continue
		}
		t.Run(name, func(t *testing.T) {
			r := base
			f := reflect.ValueOf(&r).Elem().Field(i)
			switch f.Kind() {
			case reflect.Uint64:
				f.SetUint(f.Uint() + 1)
			case reflect.Bool:
				f.SetBool(!f.Bool())
			case reflect.String:
				f.SetString(f.String() + "x")
			default:
				t.Fatalf("unhandled field kind %s", f.Kind())
			}
			assert.NotEqual(t, baseHash, r.ComputeHash(chain.ZeroHash))
		})
		tested++
	}
	assert.Equal(t, 21, tested, "SPEC §2 has 21 fields")

	t.Run("PrevHash", func(t *testing.T) {
		var prev chain.Hash
		prev[31] = 1
		assert.NotEqual(t, baseHash, base.ComputeHash(prev))
	})
}

// TestReceipt_Body_boundaries checks that moving bytes between adjacent
// string fields changes the body: the length prefixes make boundaries
// unambiguous.
func TestReceipt_Body_boundaries(t *testing.T) {
	for _, tt := range []struct {
		desc string
		a, b chain.Receipt
	}{
		{"key/execution", chain.Receipt{IdempotencyKey: "ab", ExecutionID: "c"}, chain.Receipt{IdempotencyKey: "a", ExecutionID: "bc"}},
		{"tool/effect", chain.Receipt{Tool: "x.write", Effect: ""}, chain.Receipt{Tool: "x.", Effect: "write"}},
		{"code/message", chain.Receipt{ErrorCode: "E1", ErrorMessage: "x"}, chain.Receipt{ErrorCode: "E", ErrorMessage: "1x"}},
		{"actor/note", chain.Receipt{Actor: "", Note: "bob"}, chain.Receipt{Actor: "bob", Note: ""}},
		{"empty vs absent result", chain.Receipt{Result: ""}, chain.Receipt{Result: `""`}},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			assert.NotEqual(t, tt.a.Body(), tt.b.Body())
			assert.NotEqual(t, tt.a.ComputeHash(chain.ZeroHash), tt.b.ComputeHash(chain.ZeroHash))
		})
	}
}

func TestReceipt_Check(t *testing.T) {
	r1, _ := vector()
	l := chain.Link(0, chain.ZeroHash, r1)
	t.Run("OK", func(t *testing.T) { assert.NoError(t, l.Check()) })
	t.Run("ErrHashMismatch", func(t *testing.T) {
		bad := l
		bad.ExternalRef = "forged"
		err := bad.Check()
		require.ErrorIs(t, err, chain.ErrHashMismatch)
		var hm *chain.HashMismatchError
		require.ErrorAs(t, err, &hm)
		assert.Equal(t, l.Hash, hm.Claimed)
		assert.Equal(t, bad.ComputeHash(chain.ZeroHash), hm.Computed)
	})
}

func TestReceipt_JSON(t *testing.T) {
	r1, r2 := vector()
	l1 := chain.Link(0, chain.ZeroHash, r1)
	l2 := chain.Link(1, l1.Hash, r2)

	t.Run("OK", func(t *testing.T) {
		for _, r := range []chain.Receipt{l1, l2} {
			b, err := json.Marshal(r)
			require.NoError(t, err)
			var got chain.Receipt
			require.NoError(t, json.Unmarshal(b, &got))
			assert.Equal(t, r, got)
			assert.NoError(t, got.Check())
		}
		b, _ := json.Marshal(l1)
		var m map[string]any
		require.NoError(t, json.Unmarshal(b, &m))
		assert.Len(t, m, 24, "21 fields, prev_hash, hash and result_text (SPEC §9.1)")
		assert.Nil(t, m["result"])
		assert.Equal(t, "", m["result_text"])
		assert.Equal(t, "c536a7804a3ee6fc1e44013c9550bcb8eb839e87df00f32e9462edc720f7771d", m["hash"])
	})
	t.Run("result verbatim", func(t *testing.T) {
		r := l2
		r.Result = `{"html":"<b>&</b>","u":"\u2028é"}`
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(r))
		assert.Contains(t, buf.String(), `"result":`+r.Result+`,`)
		var got chain.Receipt
		require.NoError(t, json.Unmarshal(buf.Bytes(), &got))
		assert.Equal(t, r.Result, got.Result)
	})
	t.Run("hostile strings", func(t *testing.T) {
		r := l1
		r.ExternalRef = "'; DROP TABLE receipts;--\x00\x1f\"\\\n"
		r.Note = "é\u2028<>&"
		b, err := json.Marshal(r)
		require.NoError(t, err)
		var got chain.Receipt
		require.NoError(t, json.Unmarshal(b, &got))
		assert.Equal(t, r.ExternalRef, got.ExternalRef)
		assert.Equal(t, r.Note, got.Note)
	})
	t.Run("result not as the ledger stores it", func(t *testing.T) {
		for _, tc := range []struct {
			desc, result, wantEnc string
		}{
			{desc: "compact JSON", result: `{"a":[1,"x y"]}`},
			{desc: "JSON string", result: `"text"`},
			{desc: "not JSON", result: `{oops`, wantEnc: chain.ResultText},
			{desc: "not compact", result: `{"a": 1}`, wantEnc: chain.ResultText},
			{desc: "leading space", result: ` {"a":1}`, wantEnc: chain.ResultText},
			{desc: "the literal null", result: `null`, wantEnc: chain.ResultText},
			{desc: "looks like an encoded string", result: `"e30="`},
			{desc: "control characters", result: "a\x00\n\"\\", wantEnc: chain.ResultText},
			{desc: "not UTF-8", result: "{\"a\":\"\xff\"}", wantEnc: chain.ResultBase64},
		} {
			t.Run(tc.desc, func(t *testing.T) {
				r := l2
				r.Result = tc.result
				b := r.AppendJSON(nil)
				assert.True(t, json.Valid(b) && utf8.Valid(b), "invalid JSON: %s", b)
				var m map[string]any
				require.NoError(t, json.Unmarshal(b, &m))
				if tc.wantEnc == "" {
					assert.NotContains(t, m, "result_encoding")
					assert.Contains(t, string(b), `"result":`+tc.result+`,`)
				} else {
					assert.Equal(t, tc.wantEnc, m["result_encoding"])
				}
				var got chain.Receipt
				require.NoError(t, json.Unmarshal(b, &got))
				assert.Equal(t, tc.result, got.Result, "the exact stored bytes come back")
				assert.Equal(t, r.ComputeHash(r.PrevHash), got.ComputeHash(got.PrevHash), "and hash as stored")
			})
		}
	})
	t.Run("ErrResultEncoding", func(t *testing.T) {
		b := string(l2.AppendJSON(nil))
		for _, bad := range []string{
			`"result":{"a":1},"result_encoding":"text"`,
			`"result":"!!","result_encoding":"base64"`,
			`"result":"x","result_encoding":"rot13"`,
		} {
			in := strings.Replace(b, `"result":{"amount":1200,"currency":"eur"}`, bad, 1)
			require.NotEqual(t, b, in)
			var got chain.Receipt
			assert.Error(t, json.Unmarshal([]byte(in), &got), bad)
		}
	})
	t.Run("malformed fields", func(t *testing.T) {
		r := l2
		r.Attempt, r.Hash = 0, chain.Hash{}
		r.Malformed = []chain.Malformed{{Field: "attempt", Value: "'abc'"}, {Field: "hash", Value: "X'00'"}}
		b := r.AppendJSON(nil)
		require.True(t, json.Valid(b), "%s", b)
		assert.Contains(t, string(b), `"attempt":null,`)
		assert.Contains(t, string(b), `"hash":null,"malformed":{"attempt":"'abc'","hash":"X'00'"}}`)
		var got chain.Receipt
		require.NoError(t, json.Unmarshal(b, &got))
		assert.Equal(t, r, got)
		assert.True(t, got.IsMalformed("hash"))
		assert.False(t, got.IsMalformed("seq"))

		var m map[string]any
		require.NoError(t, json.Unmarshal(b, &m))
		delete(m, "malformed")
		without, _ := json.Marshal(m)
		assert.Error(t, json.Unmarshal(without, &got), "a null field needs its malformed entry")
		m["malformed"] = map[string]string{"kind": "5"}
		m["attempt"], m["hash"] = 1, strings.Repeat("0", 64)
		bad, _ := json.Marshal(m)
		assert.Error(t, json.Unmarshal(bad, &got), "string fields are never malformed")
	})
	t.Run("ErrMissingField", func(t *testing.T) {
		b, _ := json.Marshal(l1)
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(b, &m))
		for name := range m {
			if name == "result_text" {
				continue // optional: a receipt without it is read as before (SPEC §9.1)
			}
			cp := map[string]json.RawMessage{}
			for k, v := range m {
				if k != name {
					cp[k] = v
				}
			}
			bad, _ := json.Marshal(cp)
			var got chain.Receipt
			assert.Error(t, json.Unmarshal(bad, &got), "without %s", name)
		}
	})
}

func TestIsCompactJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{`{"a":1}`, true},
		{`[1,"a b",{"c":null}]`, true},
		{`"x"`, true},
		{`12345678901234567890`, true},
		{`null`, true},
		{`"\" "`, true},
		{`{"a": 1}`, false},
		{"{\"a\":1}\n", false},
		{` 1`, false},
		{`{"a":1`, false},
		{`{oops`, false},
		{`1 2`, false},
		{``, false},
		{"\"\xff\"", false},
	} {
		assert.Equal(t, tc.want, chain.IsCompactJSON(tc.in), "%q", tc.in)
	}
}

func BenchmarkHasher_Hash(b *testing.B) {
	_, r2 := vector()
	var h chain.Hasher
	prev := chain.ZeroHash
	b.SetBytes(int64(len(chain.Prefix) + chain.HashSize + r2.BodySize()))
	b.ReportAllocs()
	for b.Loop() {
		prev = h.Hash(prev, &r2)
	}
}

func BenchmarkReceipt_AppendJSON(b *testing.B) {
	_, r2 := vector()
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = r2.AppendJSON(buf[:0])
	}
}
