package sqlite

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// keyScanColumns are receiptColumns with 32 zero bytes for prev_hash and
// hash: the key-ordered scan feeds only the state checks.
const keyScanColumns = `seq, kind, idempotency_key, key_generated, execution_id, attempt, tool,
	effect, idempotent, input_hash, outcome, external_ref, result, error_code, error_message,
	retryable, lease_expires_at, ref_seq, actor, note, recorded_at, zeroblob(32), zeroblob(32)`

// SQL of the verifier's scans; their columns are receiptColumns (see
// cScan in cscan.go for how they are read).
const (
	sqlScanBySeq = `SELECT ` + receiptColumns + ` FROM receipts WHERE seq > ? ORDER BY seq`

	sqlScanBySeqRange = `SELECT ` + receiptColumns + ` FROM receipts WHERE seq > ? AND seq <= ? ORDER BY seq`

	sqlScanByKey = `SELECT ` + keyScanColumns + ` FROM receipts INDEXED BY receipts_by_key
		ORDER BY idempotency_key, seq`

	sqlScanByKeyAfter = `SELECT ` + keyScanColumns + ` FROM receipts INDEXED BY receipts_by_key
		WHERE idempotency_key IN (SELECT idempotency_key FROM receipts WHERE seq > ?)
		ORDER BY idempotency_key, seq`

	sqlScanKeys = `SELECT ` + keysColumns + ` FROM keys ORDER BY idempotency_key`

	sqlScanKeysAfter = `SELECT ` + keysColumns + ` FROM keys WHERE idempotency_key > ? ORDER BY idempotency_key`
)

// Receipts calls fn for every receipt with seq > after, in seq order,
// streaming: memory does not grow with the ledger. fn must not retain the
// pointer it is given.
func (rd *Reader) Receipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	return rd.scan(ctx, fn, sqlScanBySeq, after)
}

// ReceiptsRange calls fn for every receipt with after < seq <= through,
// in seq order, like Receipts. Ranges read concurrently each use a
// connection (and a read snapshot) of their own.
func (rd *Reader) ReceiptsRange(ctx context.Context, after, through uint64, fn func(*chain.Receipt) error) error {
	return rd.scan(ctx, fn, sqlScanBySeqRange, after, through)
}

// KeyReceipts calls fn for every receipt of each key that has a receipt
// with seq > after, grouped by key (in byte order) and in seq order within
// a key, so that a key's state can be dropped when the next key starts.
// The receipts lack their hashes (zero, and never listed in Malformed).
func (rd *Reader) KeyReceipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	if after == 0 {
		return rd.scan(ctx, fn, sqlScanByKey)
	}
	return rd.scan(ctx, fn, sqlScanByKeyAfter, after)
}

// scanCacheKiB sizes the page cache of a scanning connection. The
// seq-ordered scan reads each page once, so a large cache buys nothing;
// the key-ordered one revisits table pages at random.
func scanCacheKiB(query string) int {
	if query == sqlScanBySeq || query == sqlScanBySeqRange {
		return 2048
	}
	return 32768
}

func (rd *Reader) scan(ctx context.Context, fn func(*chain.Receipt) error, query string, args ...uint64) error {
	s, err := openCScan(rd.path, rd.busy, scanCacheKiB(query), query, args...)
	if err != nil {
		return fmt.Errorf("scan receipts: %w", err)
	}
	defer s.close()
	// A row that is not what the ledger writes is read again through the
	// driver, column by column, and comes back with Malformed set.
	reread := func(seq uint64, r *chain.Receipt) error {
		got, err := scanReceipt(rd.r.QueryRowContext(ctx, sqlReceiptBySeq, int64(seq))) // as stored, even negative
		if err != nil {
			return fmt.Errorf("read malformed row: %w", classify(err))
		}
		if query != sqlScanBySeq && query != sqlScanBySeqRange { // no hashes in key order
			got.PrevHash, got.Hash = chain.Hash{}, chain.Hash{}
			got.Malformed = slices.DeleteFunc(got.Malformed, func(m chain.Malformed) bool {
				return m.Field == "prev_hash" || m.Field == "hash"
			})
			if len(got.Malformed) == 0 {
				got.Malformed = nil
			}
		}
		*r = got
		return nil
	}
	if err := s.each(ctx, reread, fn); err != nil {
		return fmt.Errorf("scan receipts: %w", err)
	}
	return nil
}

// Keys calls fn for every row of the derived keys table, in key byte
// order (the order of KeyReceipts). Rows are stepped from C like the
// receipts; from a row with a value of another type on (an edited file),
// the table is read through the driver, which converts such a value or
// fails as it always did.
func (rd *Reader) Keys(ctx context.Context, fn func(*ledger.KeyRecord) error) error {
	s, err := openCScan(rd.path, rd.busy, 2048, sqlScanKeys)
	if err != nil {
		return fmt.Errorf("scan keys: %w", err)
	}
	defer s.close()
	var k ledger.KeyRecord
	var ints [6]uint64
	var strs [4]string
	var last *string // the key of the last row given to fn
	err = s.records(ctx, &keysShape, func(rec []byte) (int, error) {
		size, bad, _, err := keysShape.parse(rec, ints[:], strs[:])
		if err != nil {
			return 0, err
		}
		if bad {
			return 0, errOddRow
		}
		k = ledger.KeyRecord{Key: strs[0], Generated: ints[0] == 1, Tool: strs[1], Effect: strs[2], InputHash: strs[3],
			Idempotent: ints[1] == 1, FirstSeq: ints[2], ReserveSeq: ints[3], LeaseExpiresAt: ints[4], FinalSeq: ints[5]}
		last = &k.Key
		return size, fn(&k)
	})
	if errors.Is(err, errOddRow) {
		s.close()
		return rd.keysFrom(ctx, last, fn)
	}
	if err != nil {
		return fmt.Errorf("scan keys: %w", err)
	}
	return nil
}

// errOddRow ends a C scan at a row to be read through the driver.
var errOddRow = errors.New("row to read through the driver")

// keysFrom reads the keys table through the driver, from the row after
// key after (nil: from the start).
func (rd *Reader) keysFrom(ctx context.Context, after *string, fn func(*ledger.KeyRecord) error) error {
	q, args := sqlScanKeys, []any{}
	if after != nil {
		q, args = sqlScanKeysAfter, []any{*after}
	}
	rows, err := rd.r.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("scan keys: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var k ledger.KeyRecord
	for rows.Next() {
		if err := rows.Scan(&k.Key, &k.Generated, &k.Tool, &k.Effect, &k.InputHash, &k.Idempotent,
			&k.FirstSeq, &k.ReserveSeq, &k.LeaseExpiresAt, &k.FinalSeq); err != nil {
			return fmt.Errorf("scan keys: %w", err)
		}
		if err := fn(&k); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("scan keys: %w", classify(err))
	}
	return nil
}

// sqlDuplicateSuccesses lists the successes (commit or resolve) of keys
// that share their tool and non-empty input_hash with another key that
// also succeeded, grouped by (tool, input_hash). SQLite groups with a temp
// b-tree, so memory does not grow with the ledger; when no group has two
// keys (the usual case) the successes are not read a second time. A
// recorded_at that is not an unsigned integer (an edited file) reads as 0
// here; the chain pass reports it.
const sqlDuplicateSuccesses = `
	WITH dup(tool, input_hash) AS MATERIALIZED (
		SELECT tool, input_hash FROM receipts
		WHERE kind IN ('commit', 'resolve') AND outcome = 'succeeded' AND input_hash != ''
		GROUP BY tool, input_hash HAVING count(DISTINCT idempotency_key) > 1)
	SELECT tool, input_hash, idempotency_key, max(seq, 0),
		CASE WHEN typeof(recorded_at) = 'integer' AND recorded_at >= 0 THEN recorded_at ELSE 0 END
	FROM receipts
	WHERE EXISTS (SELECT 1 FROM dup)
	  AND kind IN ('commit', 'resolve') AND outcome = 'succeeded' AND input_hash != ''
	  AND (tool, input_hash) IN (SELECT tool, input_hash FROM dup)
	ORDER BY tool, input_hash, seq`

// DuplicateSuccesses calls fn for each success whose tool and input_hash
// another key also succeeded with, ordered by tool, input_hash and seq.
func (rd *Reader) DuplicateSuccesses(ctx context.Context, fn func(*ledger.Success) error) error {
	rows, err := rd.r.QueryContext(ctx, sqlDuplicateSuccesses)
	if err != nil {
		return fmt.Errorf("duplicate successes: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var s ledger.Success
	for rows.Next() {
		if err := rows.Scan(&s.Tool, &s.InputHash, &s.Key, &s.Seq, &s.RecordedAt); err != nil {
			return fmt.Errorf("duplicate successes: %w", err)
		}
		if err := fn(&s); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("duplicate successes: %w", classify(err))
	}
	return nil
}
