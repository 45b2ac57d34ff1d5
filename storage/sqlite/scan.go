package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

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
	sqlScanBySeq = `SELECT ` + receiptColumns + ` FROM ns_receipts WHERE ns = ?1 AND seq > ?2 ORDER BY seq`

	sqlScanBySeqRange = `SELECT ` + receiptColumns + ` FROM ns_receipts WHERE ns = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq`

	// The key-ordered scans sort (SQLite's external merge sort: the file
	// has no index by key, its writes only append).
	sqlScanByKey = `SELECT ` + keyScanColumns + ` FROM ns_receipts WHERE ns = ?1
		ORDER BY idempotency_key, seq`

	sqlScanByKeyAfter = `SELECT ` + keyScanColumns + ` FROM ns_receipts
		WHERE ns = ?1 AND idempotency_key IN (SELECT idempotency_key FROM ns_receipts WHERE ns = ?1 AND seq > ?2)
		ORDER BY idempotency_key, seq`

	// The nth row (from 0) whose seq is not an integer, in the order of
	// the seq-ordered scans and of the key-ordered ones: such a row (an
	// edited file) cannot be read again by its seq. It sorts after every
	// integer seq, so every scan that reads one reads all of them, in this
	// order.
	sqlNonIntegerSeqBySeq = `SELECT ` + receiptColumns + ` FROM ns_receipts
		WHERE ns = ?1 AND typeof(seq) != 'integer' ORDER BY seq LIMIT 1 OFFSET ?2`
	sqlNonIntegerSeqByKey = `SELECT ` + receiptColumns + ` FROM ns_receipts
		WHERE ns = ?1 AND typeof(seq) != 'integer' ORDER BY idempotency_key, seq LIMIT 1 OFFSET ?2`
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
	if !strings.Contains(query, "ORDER BY idempotency_key") {
		return 2048
	}
	return 32768
}

func (rd *Reader) scan(ctx context.Context, fn func(*chain.Receipt) error, query string, args ...uint64) error {
	s, err := openCScan(rd.path, rd.busy, scanCacheKiB(query), query, rd.scanArgs(args...)...)
	if err != nil {
		return fmt.Errorf("scan receipts: %w", err)
	}
	defer s.close()
	// A row that is not what the ledger writes is read again through the
	// driver, column by column, and comes back with Malformed set (the
	// verifier reports each value as invalid_field). A row whose seq is
	// not an integer is found by its place among such rows.
	byKey := strings.Contains(query, "ORDER BY idempotency_key")
	nonInteger := int64(0)
	reread := func(seq uint64, r *chain.Receipt) error {
		got, err := scanReceipt(rd.r.QueryRowContext(ctx, sqlReceiptBySeq, rd.args(int64(seq))...)) // as stored, even negative
		if errors.Is(err, sql.ErrNoRows) {
			q := sqlNonIntegerSeqBySeq
			if byKey {
				q = sqlNonIntegerSeqByKey
			}
			got, err = scanReceipt(rd.r.QueryRowContext(ctx, q, rd.args(nonInteger)...))
			nonInteger++
		}
		if err != nil {
			return fmt.Errorf("read malformed row: %w", classify(err))
		}
		if byKey { // no hashes in key order
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

// Keys lists no key records: their state is in the key index, which only
// the writer opens (chainWriter.Keys reads it there). What the file itself
// derives is its recorded head: Keys returns ledger.ErrDerivedState when
// that differs from the receipts' tail (receipts removed or added behind
// ledgerd's back), and ledger.ErrNoKeyTable otherwise.
func (rd *Reader) Keys(ctx context.Context, _ func(*ledger.KeyRecord) error) error {
	if _, err := checkTail(ctx, rd.r, rd.chainRef, rd.flags()); err != nil {
		return err
	}
	return ledger.ErrNoKeyTable
}

// KeyDrift has no key record to compare, for the same reason
// (chainWriter.KeyDrift reads the index).
func (rd *Reader) KeyDrift(context.Context, string) ([]string, error) {
	return nil, ledger.ErrNoKeyTable
}

// sqlDuplicateSuccesses lists the successes (commit or resolve) of keys
// that share their tool and non-empty input_hash with another key that
// also succeeded, grouped by (tool, input_hash). SQLite groups with a temp
// b-tree, so memory does not grow with the ledger; when no group has two
// keys (the usual case) the successes are not read a second time. A seq
// or recorded_at that is not an unsigned integer (an edited file) reads
// as 0 here; the chain pass reports it.
const sqlDuplicateSuccesses = withChain + `,
	dup(tool, input_hash) AS MATERIALIZED (
		SELECT tool, input_hash FROM chain
		WHERE kind IN ('commit', 'resolve', 'reconcile') AND outcome = 'succeeded' AND input_hash != ''
		GROUP BY tool, input_hash HAVING count(DISTINCT idempotency_key) > 1)
	SELECT tool, input_hash, idempotency_key, CASE WHEN typeof(seq) = 'integer' AND seq >= 0 THEN seq ELSE 0 END,
		CASE WHEN typeof(recorded_at) = 'integer' AND recorded_at >= 0 THEN recorded_at ELSE 0 END
	FROM chain
	WHERE EXISTS (SELECT 1 FROM dup)
	  AND kind IN ('commit', 'resolve', 'reconcile') AND outcome = 'succeeded' AND input_hash != ''
	  AND (tool, input_hash) IN (SELECT tool, input_hash FROM dup)
	ORDER BY tool, input_hash, seq`

// DuplicateSuccesses calls fn for each success whose tool and input_hash
// another key also succeeded with, ordered by tool, input_hash and seq.
func (rd *Reader) DuplicateSuccesses(ctx context.Context, fn func(*ledger.Success) error) error {
	rows, err := rd.r.QueryContext(ctx, sqlDuplicateSuccesses, rd.args()...)
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
