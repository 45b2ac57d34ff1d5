package sqlite_test

import (
	"encoding/binary"
	"testing"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// FuzzDecodeRow feeds arbitrary records to the verifier's scan decoder:
// it must never panic, never read past the record, and what it accepts
// must account for every byte it claims.
func FuzzDecodeRow(f *testing.F) {
	rec := func(flag uint64, lens []uint32, tail string) []byte {
		b := make([]byte, 9*8+13*4+64)
		binary.LittleEndian.PutUint64(b, 7)
		binary.LittleEndian.PutUint64(b[64:], flag)
		for i, n := range lens {
			binary.LittleEndian.PutUint32(b[72+4*i:], n)
		}
		return append(b, tail...)
	}
	f.Add(rec(0, []uint32{7, 3}, "reservekey"))
	f.Add(rec(1, nil, ""))
	f.Add(rec(0, []uint32{1 << 31}, "x"))
	f.Add([]byte("short"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r chain.Receipt
		size, err := sqlite.DecodeRow(&r, b)
		if err != nil {
			return
		}
		if size > len(b) {
			t.Fatalf("record of %d bytes claims %d", len(b), size)
		}
		n := 0
		for _, s := range []string{r.Kind, r.IdempotencyKey, r.ExecutionID, r.Tool, r.Effect, r.InputHash,
			r.Outcome, r.ExternalRef, r.Result, r.ErrorCode, r.ErrorMessage, r.Actor, r.Note} {
			n += len(s)
		}
		if r.Malformed == nil && n+9*8+13*4+64 != size {
			t.Fatalf("strings of %d bytes in a record of %d", n, size)
		}
	})
}
