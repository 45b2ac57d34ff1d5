package keyindex

import "github.com/effect-ledger/effect-ledger/ledger"

// EncodeRecord and DecodeRecord expose the record encoding to the fuzz
// test.
func EncodeRecord(k *ledger.KeyRecord) []byte { return encodeRecord(nil, k) }

func DecodeRecord(v []byte) (ledger.KeyRecord, error) {
	var k ledger.KeyRecord
	err := decodeRecord(v, &k)
	return k, err
}
