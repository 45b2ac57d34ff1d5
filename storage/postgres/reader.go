package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Chain is one namespace of a Store: its reads run on the pool without
// the head lock; Write takes it.
type Chain struct {
	s  *Store
	ns string
}

// Namespace is the chain's namespace.
func (c *Chain) Namespace() string { return c.ns }

// KeyTTL reads the namespace's key_ttl_ms (SPEC §12) from its row; a
// version 1 schema, read as it is, has none: 0, keys never expire.
func (c *Chain) KeyTTL(ctx context.Context) (uint64, error) {
	if c.s.version < 2 {
		return 0, nil
	}
	var ttl int64
	err := c.s.pool.QueryRow(ctx, `SELECT key_ttl_ms FROM namespaces WHERE name = $1`, c.ns).Scan(&ttl)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("read key ttl: %w: %s", ledger.ErrUnknownNamespace, c.ns)
	}
	if err != nil {
		return 0, fmt.Errorf("read key ttl: %w", classify(err))
	}
	return uint64(ttl), nil
}

// receiptColumns are the 23 columns of SPEC §2 plus the hashes, in order.
const receiptColumns = `seq, kind, idempotency_key, key_generated, execution_id, attempt, tool, effect,
	idempotent, input_hash, outcome, external_ref, result, error_code, error_message, retryable,
	lease_expires_at, ref_seq, actor, note, recorded_at, prev_hash, hash`

// SQL of the read path. $1 is always the namespace.
const (
	sqlReceiptBySeq = `SELECT ` + receiptColumns + ` FROM receipts WHERE namespace = $1 AND seq = $2`

	sqlHead = `SELECT seq, hash FROM head WHERE namespace = $1`

	sqlKeyView = `SELECT key_generated, tool, effect, input_hash, idempotent, first_seq, reserve_seq,
		lease_expires_at, final_seq, ` + sqlNowMS + ` FROM keys WHERE namespace = $1 AND idempotency_key = $2`

	sqlKeyReceipts = `SELECT ` + receiptColumns + ` FROM receipts
		WHERE namespace = $1 AND idempotency_key = $2 ORDER BY seq`

	sqlScanBySeq = `SELECT ` + receiptColumns + ` FROM receipts WHERE namespace = $1 AND seq > $2 ORDER BY seq`

	sqlScanByKey = `SELECT ` + receiptColumns + ` FROM receipts WHERE namespace = $1
		ORDER BY idempotency_key, seq`

	sqlScanByKeyAfter = `SELECT ` + receiptColumns + ` FROM receipts WHERE namespace = $1
		AND idempotency_key IN (SELECT idempotency_key FROM receipts WHERE namespace = $1 AND seq > $2)
		ORDER BY idempotency_key, seq`

	keysColumns = `idempotency_key, key_generated, tool, effect, input_hash, idempotent,
		first_seq, reserve_seq, lease_expires_at, final_seq`

	sqlScanKeys = `SELECT ` + keysColumns + ` FROM keys WHERE namespace = $1 ORDER BY idempotency_key`

	// One index lookup per hash (see sqlPreloadGroupKeys on "= ANY").
	sqlTreeHashes = `SELECT t.* FROM unnest($2::bigint[]) AS u(idx), LATERAL (
		SELECT idx, hash FROM tree_hashes WHERE namespace = $1 AND idx = u.idx LIMIT 1) AS t`

	sqlTreeCount = `SELECT coalesce(max(idx) + 1, 0) FROM tree_hashes WHERE namespace = $1`

	sqlReceiptHashes = `SELECT seq, hash FROM receipts WHERE namespace = $1 AND seq > $2 ORDER BY seq LIMIT $3`

	checkpointColumns   = `size, root, note, signed_at`
	sqlLatestCheckpoint = `SELECT ` + checkpointColumns + ` FROM checkpoints WHERE namespace = $1 ORDER BY size DESC LIMIT 1`
	sqlCheckpointAt     = `SELECT ` + checkpointColumns + ` FROM checkpoints WHERE namespace = $1 AND size = $2`
	sqlCheckpointCover  = `SELECT ` + checkpointColumns + ` FROM checkpoints WHERE namespace = $1 AND size >= $2
		ORDER BY size DESC LIMIT 1`
	sqlCheckpointFirst = `SELECT ` + checkpointColumns + ` FROM checkpoints WHERE namespace = $1 AND size >= $2
		ORDER BY size LIMIT 1`

	// sqlDuplicateSuccesses: the successes of keys that share their tool
	// and non-empty input_hash with another key that also succeeded.
	sqlDuplicateSuccesses = `
	SELECT tool, input_hash, idempotency_key, seq, recorded_at FROM receipts
	WHERE namespace = $1 AND kind IN ('commit', 'resolve', 'reconcile') AND outcome = 'succeeded' AND input_hash != ''
	  AND (tool, input_hash) IN (
		SELECT tool, input_hash FROM receipts
		WHERE namespace = $1 AND kind IN ('commit', 'resolve', 'reconcile') AND outcome = 'succeeded' AND input_hash != ''
		GROUP BY tool, input_hash HAVING count(DISTINCT idempotency_key) > 1)
	ORDER BY tool, input_hash, seq`

	// sqlRepeatedFailures: for each (tool, non-empty input_hash) that
	// failed (failed, or not_applied unless its code says nothing was
	// attempted: ledger.CountsAsFailure), its first failure and then the
	// first reserve (ref_seq 0) of every key reserved after it, and every
	// reserve after a counted not_applied of its own key by another
	// execution (a rerun, SPEC §4.1); a reserve that consumed an approval
	// is judged by what its ask references (SPEC §13). A reconcile
	// not_applied (SPEC §15) is exempt: the kind clauses leave it out. $2
	// is the tool to keep, or ''.
	sqlRepeatedFailures = `
	WITH first_failure AS MATERIALIZED (
		SELECT tool, input_hash, min(seq) AS seq FROM receipts
		WHERE namespace = $1 AND kind IN ('commit', 'resolve') AND input_hash != '' AND ($2 = '' OR tool = $2)
		  AND (outcome = 'failed' OR (outcome = 'not_applied' AND error_code NOT IN ('INPUT_REQUIRED', 'CLIENT_CAPABILITY_MISSING')))
		GROUP BY tool, input_hash)
	SELECT r.tool, r.input_hash, r.kind, r.idempotency_key, r.execution_id, r.error_code, r.seq, r.recorded_at,
		r.kind = 'reserve' AND (CASE WHEN r.ref_seq = 0 THEN 0 ELSE coalesce((SELECT k.ref_seq FROM receipts AS v JOIN receipts AS k
		ON k.namespace = v.namespace AND k.seq = v.ref_seq AND k.kind = 'ask'
		WHERE v.namespace = $1 AND v.seq = r.ref_seq AND v.kind = 'approval'), r.ref_seq) END) != 0
	FROM receipts AS r JOIN first_failure AS f ON f.tool = r.tool AND f.input_hash = r.input_hash
	WHERE r.namespace = $1 AND r.input_hash != '' AND ($2 = '' OR r.tool = $2)
	  AND r.kind IN ('reserve', 'commit', 'resolve')
	  AND (r.seq = f.seq OR (r.kind = 'reserve' AND r.seq > f.seq AND ((CASE WHEN r.ref_seq = 0 THEN 0 ELSE coalesce((SELECT k.ref_seq FROM receipts AS v JOIN receipts AS k
		ON k.namespace = v.namespace AND k.seq = v.ref_seq AND k.kind = 'ask'
		WHERE v.namespace = $1 AND v.seq = r.ref_seq AND v.kind = 'approval'), r.ref_seq) END) = 0 OR EXISTS (
		SELECT 1 FROM receipts AS p WHERE p.namespace = $1 AND p.seq = (CASE WHEN r.ref_seq = 0 THEN 0 ELSE coalesce((SELECT k.ref_seq FROM receipts AS v JOIN receipts AS k
		ON k.namespace = v.namespace AND k.seq = v.ref_seq AND k.kind = 'ask'
		WHERE v.namespace = $1 AND v.seq = r.ref_seq AND v.kind = 'approval'), r.ref_seq) END) AND p.idempotency_key = r.idempotency_key
		  AND p.kind IN ('commit', 'resolve') AND p.outcome = 'not_applied'
		  AND p.error_code NOT IN ('INPUT_REQUIRED', 'CLIENT_CAPABILITY_MISSING') AND p.execution_id != r.execution_id))))
	ORDER BY r.tool, r.input_hash, r.seq`

	sqlStoredKey = `SELECT key_generated, tool, effect, input_hash, idempotent, first_seq, reserve_seq,
		lease_expires_at, final_seq FROM keys WHERE namespace = $1 AND idempotency_key = $2`
)

// scanReceipt reads the columns of receiptColumns. The schema's types
// and checks make every stored value one a receipt can carry.
func scanReceipt(row pgx.Row) (chain.Receipt, error) {
	var r chain.Receipt
	var seq, attempt, lease, ref, rec int64
	var prev, hash []byte
	err := row.Scan(&seq, &r.Kind, &r.IdempotencyKey, &r.KeyGenerated, &r.ExecutionID, &attempt, &r.Tool,
		&r.Effect, &r.Idempotent, &r.InputHash, &r.Outcome, &r.ExternalRef, &r.Result, &r.ErrorCode,
		&r.ErrorMessage, &r.Retryable, &lease, &ref, &r.Actor, &r.Note, &rec, &prev, &hash)
	if err != nil {
		return r, err
	}
	r.Seq, r.Attempt, r.LeaseExpiresAt, r.RefSeq, r.RecordedAt = uint64(seq), uint64(attempt), uint64(lease), uint64(ref), uint64(rec)
	if r.PrevHash, err = chain.HashFromBytes(prev); err != nil {
		return r, fmt.Errorf("receipt %d: prev_hash: %w", r.Seq, err)
	}
	if r.Hash, err = chain.HashFromBytes(hash); err != nil {
		return r, fmt.Errorf("receipt %d: hash: %w", r.Seq, err)
	}
	return r, nil
}

// scanKey scans a keys row into k: the record's columns generated, tool,
// effect, input_hash, idempotent, first_seq, reserve_seq,
// lease_expires_at and final_seq, after k.Key when withKey, then extra.
func scanKey(row pgx.Row, k *ledger.KeyRecord, withKey bool, extra ...any) error {
	var first, reserve, lease, final int64
	dest := []any{&k.Generated, &k.Tool, &k.Effect, &k.InputHash, &k.Idempotent, &first, &reserve, &lease, &final}
	if withKey {
		dest = append([]any{&k.Key}, dest...)
	}
	if err := row.Scan(append(dest, extra...)...); err != nil {
		return err
	}
	k.FirstSeq, k.ReserveSeq, k.LeaseExpiresAt, k.FinalSeq = uint64(first), uint64(reserve), uint64(lease), uint64(final)
	return nil
}

// keyReceipts reads the receipts of key in tx.
func (c *Chain) keyReceipts(ctx context.Context, tx pgx.Tx, key string) ([]chain.Receipt, error) {
	rows, err := tx.Query(ctx, sqlKeyReceipts, c.ns, key)
	if err != nil {
		return nil, err
	}
	return collectReceipts(rows)
}

func collectReceipts(rows pgx.Rows) ([]chain.Receipt, error) {
	defer rows.Close()
	var out []chain.Receipt
	for rows.Next() {
		r, err := scanReceipt(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Head reads the namespace's durable head; a namespace whose head row
// is missing is lost (headcheck.go).
func (c *Chain) Head(ctx context.Context) (ledger.Head, error) {
	var h ledger.Head
	var seq int64
	var hash []byte
	err := c.s.pool.QueryRow(ctx, sqlHead, c.ns).Scan(&seq, &hash)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := c.checkHead(ctx); err != nil {
			return h, fmt.Errorf("read head: %w", err)
		}
		return h, fmt.Errorf("read head: %w", missingHead(c.ns)) // restored meanwhile
	}
	if err != nil {
		return h, fmt.Errorf("read head: %w", classify(err))
	}
	h.Seq = uint64(seq)
	if h.Hash, err = chain.HashFromBytes(hash); err != nil {
		return h, fmt.Errorf("read head: %w", err)
	}
	return h, nil
}

// GetKey returns a key's state and receipts, read in one snapshot.
// Errors: *ledger.Error with ECodeUnknownKey or ECodeInvalidKey.
func (c *Chain) GetKey(ctx context.Context, key string) (*ledger.KeyView, error) {
	if err := ledger.CheckKeyPath(key); err != nil {
		return nil, err
	}
	var view *ledger.KeyView
	err := pgx.BeginTxFunc(ctx, c.s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			k := ledger.KeyRecord{Key: key}
			var clock int64
			err := scanKey(tx.QueryRow(ctx, sqlKeyView, c.ns, key), &k, false, &clock)
			if errors.Is(err, pgx.ErrNoRows) {
				return &ledger.Error{Code: ledger.ECodeUnknownKey, Message: "no such idempotency key"}
			}
			if err != nil {
				return err
			}
			receipts, err := c.keyReceipts(ctx, tx, key)
			if err != nil {
				return err
			}
			var fin chain.Receipt
			for i := range receipts {
				if receipts[i].Seq == k.FinalSeq {
					fin = receipts[i]
				}
			}
			now := uint64(clock)
			if n, ok := c.s.now(); ok {
				now = n
			}
			view = &ledger.KeyView{IdempotencyKey: key, State: ledger.StateOf(&k, &fin, now),
				Tool: k.Tool, Effect: k.Effect, Idempotent: k.Idempotent, InputHash: k.InputHash,
				FirstSeq: k.FirstSeq, FinalSeq: k.FinalSeq, Receipts: receipts}
			return nil
		})
	var le *ledger.Error
	if errors.As(err, &le) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("get key: %w", classify(err))
	}
	return view, nil
}

// GetReceipt returns the receipt at seq. Errors: *ledger.Error with
// ECodeUnknownReceipt.
func (c *Chain) GetReceipt(ctx context.Context, seq uint64) (*chain.Receipt, error) {
	rows, err := c.s.pool.Query(ctx, sqlReceiptBySeq, c.ns, int64(seq))
	if err != nil {
		return nil, fmt.Errorf("get receipt: %w", classify(err))
	}
	rs, err := collectReceipts(rows)
	if err != nil {
		return nil, fmt.Errorf("get receipt: %w", classify(err))
	}
	if len(rs) == 0 {
		return nil, &ledger.Error{Code: ledger.ECodeUnknownReceipt, Message: fmt.Sprintf("no receipt with seq %d", seq)}
	}
	return &rs[0], nil
}

// ListReceipts returns up to f.Limit receipts with seq > f.After that
// match the filters, oldest first, and the seq to pass as After for the
// next page, or nil when no matching receipt follows. Errors:
// *ledger.Error with ECodeInvalidRequest.
func (c *Chain) ListReceipts(ctx context.Context, f ledger.ReceiptFilter) ([]chain.Receipt, *uint64, error) {
	if err := f.Check(); err != nil {
		return nil, nil, err
	}
	var where strings.Builder
	args := []any{c.ns, int64(f.After)}
	for _, col := range []struct{ name, v string }{
		{"idempotency_key", f.Key}, {"execution_id", f.ExecutionID}, {"tool", f.Tool}, {"kind", f.Kind},
	} {
		if col.v != "" {
			args = append(args, col.v)
			fmt.Fprintf(&where, " AND %s = $%d", col.name, len(args))
		}
	}
	args = append(args, f.Limit+1)
	q := `SELECT ` + receiptColumns + ` FROM receipts WHERE namespace = $1 AND seq > $2` + where.String() +
		fmt.Sprintf(` ORDER BY seq LIMIT $%d`, len(args))
	rows, err := c.s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("list receipts: %w", classify(err))
	}
	rs, err := collectReceipts(rows)
	if err != nil {
		return nil, nil, fmt.Errorf("list receipts: %w", classify(err))
	}
	if len(rs) <= f.Limit {
		return rs, nil, nil
	}
	rs = rs[:f.Limit]
	next := rs[len(rs)-1].Seq
	return rs, &next, nil
}

// scan streams the receipts of query to fn.
func (c *Chain) scan(ctx context.Context, what string, fn func(*chain.Receipt) error, query string, args ...any) error {
	rows, err := c.s.pool.Query(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, classify(err))
	}
	defer rows.Close()
	for rows.Next() {
		r, err := scanReceipt(rows)
		if err != nil {
			return fmt.Errorf("%s: %w", what, classify(err))
		}
		if err := fn(&r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, classify(err))
	}
	return nil
}

// Receipts calls fn for each receipt after seq, in seq order, streaming,
// from one snapshot.
func (c *Chain) Receipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	return c.scan(ctx, "scan receipts", fn, sqlScanBySeq, c.ns, int64(after))
}

// KeyReceipts calls fn for every receipt of each key that has a receipt
// with seq > after, grouped by key (byte order) and in seq order within a
// key — the grouping of the SQLite driver. Unlike SQLite's, the receipts
// are complete (hashes and bodies included).
func (c *Chain) KeyReceipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	if after == 0 {
		return c.scan(ctx, "scan key receipts", fn, sqlScanByKey, c.ns)
	}
	return c.scan(ctx, "scan key receipts", fn, sqlScanByKeyAfter, c.ns, int64(after))
}

// Keys calls fn for each key record in key byte order (TokenHash left
// empty). fn must not retain the pointer. First it compares the head
// row with the last receipt: ledger.ErrDerivedState (the verifier's
// derived_state) when the row is missing or is not the chain's tail.
func (c *Chain) Keys(ctx context.Context, fn func(*ledger.KeyRecord) error) error {
	if err := c.checkHead(ctx); err != nil {
		return err
	}
	rows, err := c.s.pool.Query(ctx, sqlScanKeys, c.ns)
	if err != nil {
		return fmt.Errorf("scan keys: %w", classify(err))
	}
	defer rows.Close()
	var k ledger.KeyRecord
	for rows.Next() {
		if err := scanKey(rows, &k, true); err != nil {
			return fmt.Errorf("scan keys: %w", classify(err))
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

// DuplicateSuccesses calls fn for each success whose tool and input_hash
// another key also succeeded with, ordered by tool, input_hash and seq.
func (c *Chain) DuplicateSuccesses(ctx context.Context, fn func(*ledger.Success) error) error {
	rows, err := c.s.pool.Query(ctx, sqlDuplicateSuccesses, c.ns)
	if err != nil {
		return fmt.Errorf("duplicate successes: %w", classify(err))
	}
	defer rows.Close()
	var s ledger.Success
	for rows.Next() {
		var seq, rec int64
		if err := rows.Scan(&s.Tool, &s.InputHash, &s.Key, &seq, &rec); err != nil {
			return fmt.Errorf("duplicate successes: %w", classify(err))
		}
		s.Seq, s.RecordedAt = uint64(seq), uint64(rec)
		if err := fn(&s); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("duplicate successes: %w", classify(err))
	}
	return nil
}

// RepeatedFailures calls fn, for each (tool, non-empty input_hash) whose
// effect failed, with its first failure and then each key first reserved
// after that failure (and each rerun after a not_applied), ordered by
// tool, input_hash and seq. A failure that
// no later key repeated is skipped; tool, if not empty, keeps that tool.
func (c *Chain) RepeatedFailures(ctx context.Context, tool string, fn func(*ledger.CallAfterFailure) error) error {
	rows, err := c.s.pool.Query(ctx, sqlRepeatedFailures, c.ns, tool)
	if err != nil {
		return fmt.Errorf("repeated failures: %w", classify(err))
	}
	defer rows.Close()
	// Rows come in groups: a failure row, then its repeats. A failure row
	// is held until its first repeat shows it was run again.
	var failure, r ledger.CallAfterFailure
	var held, sent bool
	var kind string
	for rows.Next() {
		var seq, rec int64
		if err := rows.Scan(&r.Tool, &r.InputHash, &kind, &r.Key, &r.ExecutionID, &r.ErrorCode, &seq, &rec, &r.Rerun); err != nil {
			return fmt.Errorf("repeated failures: %w", classify(err))
		}
		r.Seq, r.RecordedAt = uint64(seq), uint64(rec)
		r.Failure = kind != chain.KindReserve
		if r.Failure {
			failure, held, sent = r, true, false
			continue
		}
		if !held || r.Tool != failure.Tool || r.InputHash != failure.InputHash {
			continue // cannot happen: every group starts with its failure
		}
		if !sent {
			if err := fn(&failure); err != nil {
				return err
			}
			sent = true
		}
		r.ErrorCode = ""
		if err := fn(&r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("repeated failures: %w", classify(err))
	}
	return nil
}

// KeyDrift returns the differences between the stored keys row of key and
// what its receipts derive (ledger.DeriveRecord, the rule the write path
// keeps), read in one snapshot; none when they agree.
func (c *Chain) KeyDrift(ctx context.Context, key string) ([]string, error) {
	ttl, err := c.KeyTTL(ctx)
	if err != nil {
		return nil, fmt.Errorf("key drift: %w", err)
	}
	var out []string
	err = pgx.BeginTxFunc(ctx, c.s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			stored := ledger.KeyRecord{Key: key}
			err := scanKey(tx.QueryRow(ctx, sqlStoredKey, c.ns, key), &stored, false)
			found := err == nil
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			receipts, err := c.keyReceipts(ctx, tx, key)
			if err != nil {
				return err
			}
			derived, dfound, err := ledger.DeriveRecord(key, receipts, ttl, func(uint64) (*chain.Receipt, error) {
				return nil, nil // a key's receipts name only receipts of the key
			})
			if err != nil {
				return err
			}
			out = ledger.RecordDrift(&stored, found, &derived, dfound)
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("key drift: %w", classify(err))
	}
	return out, nil
}
