package tlog_test

import (
	"encoding/json"
	"fmt"
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
// receipt whose disclosures can be checked without a panic, a disclosure
// that checks opens the commitment the receipt holds, and a field said
// erased by S has its erase receipt S included, with ranges holding the
// receipt that open its set and fields listing the field.
func FuzzParsePortable(f *testing.F) {
	f.Add(`{"receipt":{"seq":2,"kind":"commit","external_ref":"pc1:` + strings.Repeat("0", 64) + `","result":null,"result_text":""},` +
		`"leaf_index":1,"inclusion":[],"checkpoint":"x","payloads":{"external_ref":{"value":"re_1","salt":"` + strings.Repeat("ab", 16) + `"}},"erased":{"result":3}}`)
	f.Add(`{"receipt":{},"payloads":{}}`)
	b, err := json.Marshal(newEraseLog(f).bundle(f, 2, 5)) // receipt 2, whose result and note receipt 5 erased
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(b))
	f.Add(`{"receipt":{},"payloads":{},"erased":{"result":2},"erased_by":{"receipt":{},"inclusion":[],"ranges":[[1,1]],"salt":"00"}}`)
	f.Add(`{"receipt":{},"erased_by":{"receipt":{},"inclusion":[],"ranges":[[1,2,3]],"salt":"","salt":""}}`)
	f.Add(`{"receipt":{},"payloads":{"result":{"value":"a","salt":"00","value":"b"}}}`)
	f.Fuzz(func(t *testing.T, doc string) {
		p, err := tlog.ParsePortable([]byte(doc))
		if err != nil {
			return
		}
		// The checkpoint's text unsigned: the fuzzer may build a tree.
		c, _ := tlog.ParseCheckpoint(tlog.NoteText([]byte(p.Checkpoint)))
		fields, err := tlog.CheckDisclosures(p, c)
		if err != nil || p.Payloads == nil {
			return
		}
		for name, verdict := range fields {
			if strings.HasPrefix(verdict, tlog.FieldErasedBy) {
				checkErasedVerdict(t, p, c, name, verdict)
				continue
			}
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

// checkErasedVerdict fails unless p proves that its field name was erased
// by the seq verdict names.
func checkErasedVerdict(t *testing.T, p *tlog.PortableReceipt, c tlog.Checkpoint, name, verdict string) {
	e := p.ErasedBy
	if e == nil || verdict != fmt.Sprintf("%s %d", tlog.FieldErasedBy, e.Receipt.Seq) || p.Erased[name] != e.Receipt.Seq {
		t.Fatalf("%s %s without its erase receipt", name, verdict)
	}
	res, fields, err := chain.ParseEraseResult(e.Receipt.Result)
	salt, serr := chain.ParseSalt(e.Salt)
	f, _ := chain.ParsePayloadField(name)
	switch {
	case err != nil || serr != nil || e.Receipt.Kind != chain.KindErase || !fields.Has(f):
		t.Fatalf("%s %s by a receipt that is no erase of it: %+v", name, verdict, e.Receipt)
	case chain.SetDigest(salt, e.Ranges) != res.Set || !chain.RangesHold(e.Ranges, p.Receipt.Seq) || e.Receipt.Seq <= p.Receipt.Seq:
		t.Fatalf("%s %s, but the ranges %v do not open its set or hold %d", name, verdict, e.Ranges, p.Receipt.Seq)
	case tlog.CheckInclusion(tlog.FromHex(e.Inclusion), c.Size, c.Root, tlog.LeafIndex(e.Receipt.Seq), e.Receipt.Hash) != nil:
		t.Fatalf("%s %s, but the erase receipt is not included in the tree of size %d", name, verdict, c.Size)
	}
}
