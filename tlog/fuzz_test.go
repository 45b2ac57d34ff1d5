package tlog_test

import (
	"testing"

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
