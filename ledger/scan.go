package ledger

import (
	"context"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
)

// SQL of the verifier's scans.
const (
	sqlScanBySeq = `SELECT ` + receiptColumns + ` FROM receipts WHERE seq > ? ORDER BY seq`

	sqlScanByKey = `SELECT ` + receiptColumns + ` FROM receipts INDEXED BY receipts_by_key
		ORDER BY idempotency_key, seq`

	sqlScanByKeyAfter = `SELECT ` + receiptColumns + ` FROM receipts INDEXED BY receipts_by_key
		WHERE idempotency_key IN (SELECT idempotency_key FROM receipts WHERE seq > ?)
		ORDER BY idempotency_key, seq`
)

// Receipts calls fn for every receipt with seq > after, in seq order,
// streaming: memory does not grow with the ledger. fn must not retain the
// pointer it is given.
func (rd *Reader) Receipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	return rd.scan(ctx, fn, sqlScanBySeq, after)
}

// KeyReceipts calls fn for every receipt of each key that has a
// receipt with seq > after, grouped by key and in seq order within a key,
// so that a key's state can be dropped when the next key starts.
func (rd *Reader) KeyReceipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	if after == 0 {
		return rd.scan(ctx, fn, sqlScanByKey)
	}
	return rd.scan(ctx, fn, sqlScanByKeyAfter, after)
}

func (rd *Reader) scan(ctx context.Context, fn func(*chain.Receipt) error, query string, args ...any) error {
	rows, err := rd.r.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("scan receipts: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		r, err := scanReceipt(rows)
		if err != nil {
			return fmt.Errorf("scan receipts: %w", err)
		}
		if err := fn(&r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("scan receipts: %w", classify(err))
	}
	return nil
}

// KeysDrift returns one line per difference between the stored keys table
// and the keys derived from the receipts; none when they agree.
func (rd *Reader) KeysDrift(ctx context.Context) ([]string, error) {
	rows, err := rd.r.QueryContext(ctx, SQLKeysDrift)
	if err != nil {
		return nil, fmt.Errorf("keys drift: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var out []string
	for rows.Next() {
		var side, key, tool, effect, inputHash string
		var generated, idempotent bool
		var first, reserve, lease, final uint64
		if err := rows.Scan(&side, &key, &generated, &tool, &effect, &inputHash, &idempotent,
			&first, &reserve, &lease, &final); err != nil {
			return nil, fmt.Errorf("keys drift: %w", err)
		}
		out = append(out, fmt.Sprintf("%s row for key %q: tool=%s effect=%s input_hash=%s idempotent=%t first_seq=%d reserve_seq=%d lease_expires_at=%d final_seq=%d",
			side, key, tool, effect, inputHash, idempotent, first, reserve, lease, final))
	}
	return out, rows.Err()
}
