package chain_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/effect-ledger/effect-ledger/chain"
)

// FuzzBody checks that the canonical encoding is injective on the fuzzed
// string fields (decoding the body gives the fields back) and that the JSON
// form is valid JSON and round-trips, result bytes included. Seeds live in testdata/fuzz/FuzzBody.
func FuzzBody(f *testing.F) {
	f.Add("refund-order-1234", "exec-1", uint64(1), "payments.refund", `{"amount":1200}`, "re_3Pq9", "note", true)
	f.Add("", "", uint64(0), "", "", "", "", false)
	f.Add("a\x00b", "\xff\xfe", uint64(1<<63), "é", `[1,2,3]`, "\"\\", "\u2028", false)
	f.Fuzz(func(t *testing.T, key, exec string, attempt uint64, tool, result, ref, note string, idem bool) {
		r := chain.Receipt{Seq: 7, Kind: chain.KindCommit, IdempotencyKey: key, ExecutionID: exec,
			Attempt: attempt, Tool: tool, Effect: chain.EffectWrite, Idempotent: idem,
			ExternalRef: ref, Result: result, Note: note, RecordedAt: 42}
		body := r.Body()
		if len(body) != r.BodySize() {
			t.Fatalf("BodySize %d, body %d bytes", r.BodySize(), len(body))
		}
		strs := decodeStrings(t, body)
		want := []string{chain.KindCommit, key, exec, tool, chain.EffectWrite, "", "", ref, result, "", "", "", note}
		if len(strs) != len(want) {
			t.Fatalf("got %d strings, want %d", len(strs), len(want))
		}
		for i := range want {
			if strs[i] != want[i] {
				t.Fatalf("string %d: got %q, want %q", i, strs[i], want[i])
			}
		}
		l := chain.Link(6, chain.ZeroHash, r)
		if err := l.Check(); err != nil {
			t.Fatal(err)
		}
		// Any stored result, JSON or not (an edited file), gives valid JSON
		// that carries the exact bytes back.
		if b := l.AppendJSON(nil); !json.Valid(b) || !utf8.Valid(b) {
			t.Fatalf("invalid JSON: %q", b)
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(l); err != nil {
			t.Fatal(err)
		}
		var got chain.Receipt
		if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
			t.Fatalf("decode %s: %v", buf.Bytes(), err)
		}
		if got.Seq != l.Seq || got.Hash != l.Hash || got.Attempt != attempt || got.Idempotent != idem {
			t.Fatalf("round trip changed fixed fields")
		}
		if got.Result != result {
			t.Fatalf("result %q came back as %q", result, got.Result)
		}
	})
}

// decodeStrings walks a canonical body and returns its 13 string fields.
func decodeStrings(t *testing.T, b []byte) []string {
	t.Helper()
	// u64, str and bool fields in the order of SPEC §2.
	layout := "u" + "s" + "s" + "b" + "s" + "u" + "s" + "s" + "b" + "s" + "s" + "s" + "s" + "s" + "s" + "b" + "u" + "u" + "s" + "s" + "u"
	var out []string
	for _, c := range layout {
		switch c {
		case 'u':
			if len(b) < 8 {
				t.Fatal("short u64")
			}
			b = b[8:]
		case 'b':
			if len(b) < 1 || b[0] > 1 {
				t.Fatal("bad bool")
			}
			b = b[1:]
		case 's':
			if len(b) < 4 {
				t.Fatal("short length")
			}
			n := binary.BigEndian.Uint32(b)
			b = b[4:]
			if uint32(len(b)) < n {
				t.Fatal("short string")
			}
			out = append(out, string(b[:n]))
			b = b[n:]
		}
	}
	if len(b) != 0 {
		t.Fatalf("%d trailing bytes", len(b))
	}
	return out
}

// FuzzReceiptJSON decodes arbitrary JSON as a receipt (what the online
// verifier does with server pages): no panic, and an accepted receipt
// encodes back to JSON that decodes to the same receipt.
func FuzzReceiptJSON(f *testing.F) {
	r1 := chain.Link(0, chain.ZeroHash, chain.Receipt{Kind: "reserve", IdempotencyKey: "k", Attempt: 1, Result: `{"a":[1,2]}`})
	b, _ := json.Marshal(r1)
	f.Add(b)
	f.Add([]byte(`{"seq":1}`))
	f.Add([]byte(`{"seq":-1,"result":"x"}`))
	// SPEC §9.1: result_text, equal to the result as JSON or not.
	f.Add([]byte(strings.Replace(string(b), `"result":{"a":[1,2]}`, `"result":{"a":[1.0,2e0]}`, 1)))
	f.Add([]byte(strings.Replace(string(b), `"result_text":"{"a":[1,2]}"`, `"result_text":"{"a":[2,1]}"`, 1)))
	// SPEC §14: a committed receipt shown with its values, one erased.
	c := chain.Receipt{Kind: "commit", IdempotencyKey: "k", Attempt: 1, ExternalRef: "ch_1", Result: `{"a":1}`, Note: "n"}
	open := chain.CommitFields(&c)
	open.Set(chain.FieldNote, &chain.Payload{ErasedBy: 7})
	c = chain.Link(1, chain.ZeroHash, c)
	c.Open = &open
	b, _ = json.Marshal(c)
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		var r chain.Receipt
		if err := json.Unmarshal(data, &r); err != nil {
			return
		}
		out, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		var back chain.Receipt
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("re-decode %s: %v", out, err)
		}
		if back.Hash != r.Hash || back.Seq != r.Seq || back.IdempotencyKey != r.IdempotencyKey ||
			back.Result != r.Result || back.Note != r.Note || (r.Open == nil) != (back.Open == nil) ||
			(r.Open != nil && !reflect.DeepEqual(*r.Open, *back.Open)) {
			t.Fatalf("round trip changed the receipt")
		}
	})
}

// FuzzEraseDecoders: the parsers of an erase receipt's result and of its
// ranges accept only the RFC 8785 form they print.
func FuzzEraseDecoders(f *testing.F) {
	f.Add(`{"count":2,"fields":["result","note"],"set":"sha256:` + strings.Repeat("0", 64) + `"}`)
	f.Add(`[[1,3],[7,7]]`)
	f.Add(`[[1,3],[2,7]]`)
	f.Fuzz(func(t *testing.T, text string) {
		if e, _, err := chain.ParseEraseResult(text); err == nil && e.Text() != text {
			t.Fatalf("accepted %q, prints %q", text, e.Text())
		}
		if rs, err := chain.ParseRanges(text); err == nil && chain.RangesText(rs) != text {
			t.Fatalf("accepted %q, prints %q", text, chain.RangesText(rs))
		}
		_ = chain.IsCommitment(text)
	})
}
