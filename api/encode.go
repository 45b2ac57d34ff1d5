package api

import (
	"strconv"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Receipts are encoded by hand, not through encoding/json, which would
// re-compact the embedded result: an online verifier must see the stored
// bytes. ledgerctl prints the same forms.

// AppendReceipts appends a JSON array of receipts.
func AppendReceipts(b []byte, rs []chain.Receipt) []byte {
	b = append(b, '[')
	for i := range rs {
		if i > 0 {
			b = append(b, ',')
		}
		b = rs[i].AppendJSON(b)
	}
	return append(b, ']')
}

// AppendReceiptPage appends the body of GET /v1/receipts.
func AppendReceiptPage(b []byte, rs []chain.Receipt, next *uint64) []byte {
	b = append(b, `{"receipts":`...)
	b = AppendReceipts(b, rs)
	b = append(b, `,"next_after":`...)
	if next == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendUint(b, *next, 10)
	}
	return append(b, '}')
}

// AppendKeyView appends the body of GET /v1/effects/{key}.
func AppendKeyView(b []byte, v *ledger.KeyView) []byte {
	b = append(b, `{"idempotency_key":`...)
	b = chain.AppendJSONString(b, v.IdempotencyKey)
	b = append(b, `,"state":`...)
	b = chain.AppendJSONString(b, string(v.State))
	b = append(b, `,"tool":`...)
	b = chain.AppendJSONString(b, v.Tool)
	b = append(b, `,"effect":`...)
	b = chain.AppendJSONString(b, v.Effect)
	b = append(b, `,"idempotent":`...)
	b = strconv.AppendBool(b, v.Idempotent)
	b = append(b, `,"input_hash":`...)
	b = chain.AppendJSONString(b, v.InputHash)
	if v.ExpiresAt != 0 {
		b = append(b, `,"expires_at":`...)
		b = strconv.AppendUint(b, v.ExpiresAt, 10)
	}
	b = append(b, `,"receipts":`...)
	b = AppendReceipts(b, v.Receipts)
	return append(b, '}')
}
