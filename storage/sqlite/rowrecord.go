package sqlite

import (
	"encoding/binary"
	"errors"

	"github.com/effect-ledger/effect-ledger/chain"
)

// The records of the verifier's scans (cscan.go: the cgo driver steps
// SQLite from C and copies a batch of rows into one Go buffer), decoded
// here; the fuzz test feeds the decoder under either driver.

// shape describes the rows of a scan for el_put: the kind of each column
// (kInt, kBool, kText, kHash) and the count of each sort.
type shape struct {
	kinds               []byte
	nInts, nStrs, nHash int
}

const (
	kInt = iota
	kBool
	kText
	kHash
)

// receiptShape is the shape of receiptColumns.
var receiptShape = shape{kinds: []byte{kInt, kText, kText, kBool, kText, kInt, kText, kText, kBool, kText, kText,
	kText, kText, kText, kText, kBool, kInt, kInt, kText, kText, kInt, kHash, kHash}, nInts: 8, nStrs: 13, nHash: 2}

// head is the size of the fixed part of a record.
func (sh *shape) head() int { return (sh.nInts+1)*8 + sh.nStrs*4 + sh.nHash*chain.HashSize }

// parse reads the record at the start of b into ints and strs (which
// share one new allocation) and returns its size, whether its flag is
// set (then ints and strs are not filled) and its hashes.
func (sh *shape) parse(b []byte, ints []uint64, strs []string) (size int, bad bool, hashes []byte, err error) {
	head := sh.head()
	if len(b) < head {
		return 0, false, nil, errors.New("scan: short record")
	}
	le := binary.LittleEndian
	lens := b[(sh.nInts+1)*8:]
	total := 0
	for i := range sh.nStrs {
		total += int(le.Uint32(lens[4*i:]))
	}
	if len(b)-head < total {
		return 0, false, nil, errors.New("scan: short record")
	}
	if le.Uint64(b[8*sh.nInts:]) != 0 {
		return head + total, true, nil, nil
	}
	for i := range sh.nInts {
		ints[i] = le.Uint64(b[8*i:])
	}
	all := string(b[head : head+total])
	off := 0
	for i := range sh.nStrs {
		n := int(le.Uint32(lens[4*i:]))
		strs[i] = all[off : off+n]
		off += n
	}
	return head + total, false, b[head-sh.nHash*chain.HashSize : head], nil
}

// rowNeedsReread marks a record whose flag is set.
var rowNeedsReread = []chain.Malformed{{Field: "row"}}

// decodeRow fills r from the receipt record at the start of b and returns
// the record's size. The strings share one new allocation. A record whose
// flag is set leaves r.Malformed non-nil and only r.Seq meaningful.
func decodeRow(r *chain.Receipt, b []byte) (int, error) {
	var ints [8]uint64
	var strs [13]string
	size, bad, h, err := receiptShape.parse(b, ints[:], strs[:])
	if err != nil {
		return 0, err
	}
	if bad {
		*r = chain.Receipt{Seq: binary.LittleEndian.Uint64(b), Malformed: rowNeedsReread}
		return size, nil
	}
	*r = chain.Receipt{
		Seq: ints[0], KeyGenerated: ints[1] == 1, Attempt: ints[2], Idempotent: ints[3] == 1,
		Retryable: ints[4] == 1, LeaseExpiresAt: ints[5], RefSeq: ints[6], RecordedAt: ints[7],
		Kind: strs[0], IdempotencyKey: strs[1], ExecutionID: strs[2], Tool: strs[3], Effect: strs[4],
		InputHash: strs[5], Outcome: strs[6], ExternalRef: strs[7], Result: strs[8], ErrorCode: strs[9],
		ErrorMessage: strs[10], Actor: strs[11], Note: strs[12],
	}
	copy(r.PrevHash[:], h[:chain.HashSize])
	copy(r.Hash[:], h[chain.HashSize:])
	return size, nil
}
