package sqlite_test

import (
	"strings"
	"testing"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// FuzzUnpack feeds arbitrary packed rows to the verifier's row decoder:
// it must never panic, and what it accepts must be well-formed. Seeds
// live in testdata/fuzz/FuzzUnpack.
func FuzzUnpack(f *testing.F) {
	h := strings.Repeat("h", 64)
	f.Add("1,0,1,1,0,1764475230000,0,1764475200000,7:reserve17:refund-order-12346:exec-115:payments.refund5:write0:0:0:0:0:0:0:0:32:"+h, true)
	f.Add("1,0,1,1,0,1764475230000,0,1764475200000,7:reserve17:refund-order-12346:exec-115:payments.refund5:write0:0:3:5:0:0:0:0:0:", false)
	f.Add("1,2,3,4,5,6,7,8,", true)
	f.Add("18446744073709551616,0,1,1,0,0,0,0,", false)
	f.Add("1,0,1,0,0,0,0,0,99999999999999999999:x", true)
	f.Fuzz(func(t *testing.T, packed string, full bool) {
		var r chain.Receipt
		if err := sqlite.Unpack(&r, packed, full); err != nil {
			return
		}
		for _, s := range []string{r.Kind, r.IdempotencyKey, r.ExecutionID, r.Tool, r.Note} {
			if len(s) > len(packed) {
				t.Fatalf("field longer than the input")
			}
		}
	})
}
