package tlog_test

import (
	"strings"
	"testing"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// FuzzParseCheckpoint: whatever parses prints back to the same text (up to
// extension lines), so two different texts never mean the same checkpoint.
func FuzzParseCheckpoint(f *testing.F) {
	f.Add("ex.test/default\n5\ntCS2rPnjvtlyctRxzwWfXm8RlxfU1r3swpbOPmxrZNo=\n")
	f.Add("o/default\n0\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\next\n")
	f.Add("o\n-1\n\n")
	f.Fuzz(func(t *testing.T, text string) {
		c, err := tlog.ParseCheckpoint(text)
		if err != nil {
			return
		}
		back := c.Text()
		if len(back) > len(text) || text[:len(back)] != back {
			t.Fatalf("parsed %q as %+v, which prints as %q", text, c, back)
		}
	})
}

// FuzzParsePortable: any document either is refused or parses into a
// receipt whose disclosures can be checked without a panic, and a
// disclosure that checks opens the commitment the receipt holds.
func FuzzParsePortable(f *testing.F) {
	f.Add(`{"receipt":{"seq":2,"kind":"commit","external_ref":"pc1:` + strings.Repeat("0", 64) + `","result":null,"result_text":""},` +
		`"leaf_index":1,"inclusion":[],"checkpoint":"x","payloads":{"external_ref":{"value":"re_1","salt":"` + strings.Repeat("ab", 16) + `"}},"erased":{"result":3}}`)
	f.Add(`{"receipt":{},"payloads":{}}`)
	f.Add(`{"receipt":{},"payloads":{"result":{"value":"a","salt":"00","value":"b"}}}`)
	f.Fuzz(func(t *testing.T, doc string) {
		p, err := tlog.ParsePortable([]byte(doc))
		if err != nil {
			return
		}
		fields, err := tlog.CheckDisclosures(p)
		if err != nil || p.Payloads == nil {
			return
		}
		for name, verdict := range fields {
			if verdict != tlog.FieldDisclosed {
				continue
			}
			f, _ := chain.ParsePayloadField(name)
			d := (*p.Payloads)[name]
			salt, err := chain.ParseSalt(d.Salt)
			if err != nil || chain.Commit(f, salt, d.Value) != p.Receipt.Field(f) {
				t.Fatalf("%s disclosed, but its value does not open %q", name, p.Receipt.Field(f))
			}
		}
	})
}
