package keyindex

import (
	"bytes"
	"encoding/binary"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Field names a posting list of receipts.
type Field byte

// The posting lists.
const (
	ByKey       Field = 'K'
	ByExecution Field = 'e'
	ByTool      Field = 't'
	ByKind      Field = 'c'
)

const (
	tagWatermark = 'w'
	tagRecord    = 'k'
)

// prefix is the key prefix of namespace ns with tag.
func prefix(ns string, tag byte) []byte {
	b := make([]byte, 0, len(ns)+2+48)
	b = append(b, byte(len(ns)))
	b = append(b, ns...)
	return append(b, tag)
}

// esc appends field, escaped and terminated, to b.
func esc(b []byte, field string) []byte {
	for i := 0; i < len(field); i++ {
		if field[i] == 0 {
			b = append(b, 0, 0xff)
			continue
		}
		b = append(b, field[i])
	}
	return append(b, 0, 1)
}

// postingPrefix is the prefix of the posting list of value in f.
func postingPrefix(ns string, f Field, value string) []byte {
	b := prefix(ns, byte(f))
	if f == ByKind {
		return append(b, kindByte(value))
	}
	return esc(b, value)
}

func kindByte(kind string) byte {
	switch kind {
	case chain.KindReserve:
		return 'r'
	case chain.KindCommit:
		return 'c'
	case chain.KindReplay:
		return 'p'
	case chain.KindResolve:
		return 's'
	case chain.KindPolicy:
		return 'y'
	case chain.KindAsk:
		return 'a'
	case chain.KindApproval:
		return 'v'
	case chain.KindDeny:
		return 'd'
	case chain.KindKey:
		return 'k'
	case chain.KindErase:
		return 'x'
	case chain.KindReconcile:
		return 'n'
	case chain.KindPrune:
		return 'u'
	}
	return '?'
}

func appendSeq(b []byte, seq uint64) []byte { return binary.BigEndian.AppendUint64(b, seq) }

// upper is the smallest key after every key that starts with p.
func upper(p []byte) []byte {
	u := bytes.Clone(p)
	for i := len(u) - 1; i >= 0; i-- {
		if u[i] < 0xff {
			u[i]++
			return u[:i+1]
		}
	}
	return nil // p is all 0xff: no upper bound
}
