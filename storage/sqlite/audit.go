package sqlite

import (
	"context"
	"fmt"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// sqlRepeatedFailures lists, for each (tool, non-empty input_hash) whose
// effect failed at least once, the first failure (a commit or resolve with
// outcome failed, or not_applied unless its code says nothing was
// attempted: ledger.CountsAsFailure) and then the first reserve (ref_seq
// 0) of every key reserved after it, and every reserve after a counted
// not_applied of its own key by another execution (a rerun, SPEC §4.1),
// ordered by tool, input_hash and seq. ?1 is the namespace, ?2 the tool
// to keep, or the empty string for all.
//
// first_failure is materialized: one row per failed (tool, input_hash),
// grouped by SQLite in a temp b-tree. The outer query then reads the
// chain in seq order from the earliest failure on (nothing at all when
// nothing failed) and looks each up in an automatic index on that table.
// CROSS JOIN keeps the chain the outer loop, and NOT INDEXED reads it in
// one pass, so no index by kind is needed. A reserve that consumed
// an approval (SPEC §13) is judged by what its ask references (the
// approval's ref_seq is the ask, the ask's what the reserve would have
// named) and memory does not grow
// with the ledger. A call that failed but was never run again yields its
// failure row alone; the reader drops it. A seq or recorded_at that is
// not an unsigned integer (an edited file) reads as 0; the chain pass
// reports it.
//
// A reconcile not_applied (SPEC §15) is exempt, like INPUT_REQUIRED: the
// kind clauses leave reconcile receipts out.
const sqlRepeatedFailures = withChain + `,
	first_failure(tool, input_hash, seq) AS MATERIALIZED (
		SELECT tool, input_hash, min(seq) FROM chain
		WHERE kind IN ('commit', 'resolve') AND input_hash != '' AND (?2 = '' OR tool = ?2)
		  AND (outcome = 'failed' OR (outcome = 'not_applied' AND error_code NOT IN ('INPUT_REQUIRED', 'CLIENT_CAPABILITY_MISSING')))
		GROUP BY tool, input_hash)
	SELECT r.tool, r.input_hash, r.kind, r.idempotency_key, r.execution_id, r.error_code,
		CASE WHEN typeof(r.seq) = 'integer' AND r.seq >= 0 THEN r.seq ELSE 0 END,
		CASE WHEN typeof(r.recorded_at) = 'integer' AND r.recorded_at >= 0 THEN r.recorded_at ELSE 0 END,
		r.kind = 'reserve' AND (CASE WHEN r.ref_seq = 0 THEN 0 ELSE coalesce((SELECT k.ref_seq FROM chain AS v, chain AS k
		WHERE v.seq = r.ref_seq AND v.kind = 'approval' AND k.seq = v.ref_seq AND k.kind = 'ask'), r.ref_seq) END) != 0
	FROM chain AS r NOT INDEXED CROSS JOIN first_failure AS f
	WHERE r.seq >= (SELECT min(seq) FROM first_failure)
	  AND r.input_hash != '' AND (?2 = '' OR r.tool = ?2)
	  AND r.kind IN ('reserve', 'commit', 'resolve')
	  AND f.tool = r.tool AND f.input_hash = r.input_hash
	  AND (r.seq = f.seq OR (r.kind = 'reserve' AND r.seq > f.seq AND ((CASE WHEN r.ref_seq = 0 THEN 0 ELSE coalesce((SELECT k.ref_seq FROM chain AS v, chain AS k
		WHERE v.seq = r.ref_seq AND v.kind = 'approval' AND k.seq = v.ref_seq AND k.kind = 'ask'), r.ref_seq) END) = 0 OR EXISTS (
		SELECT 1 FROM chain AS p WHERE p.seq = (CASE WHEN r.ref_seq = 0 THEN 0 ELSE coalesce((SELECT k.ref_seq FROM chain AS v, chain AS k
		WHERE v.seq = r.ref_seq AND v.kind = 'approval' AND k.seq = v.ref_seq AND k.kind = 'ask'), r.ref_seq) END) AND p.idempotency_key = r.idempotency_key
		  AND p.kind IN ('commit', 'resolve') AND p.outcome = 'not_applied'
		  AND p.error_code NOT IN ('INPUT_REQUIRED', 'CLIENT_CAPABILITY_MISSING') AND p.execution_id != r.execution_id))))
	ORDER BY r.tool, r.input_hash, r.seq`

// RepeatedFailures calls fn, for each (tool, non-empty input_hash) whose
// effect failed, with its first failure and then each key first reserved
// after that failure (and each rerun after a not_applied), ordered by
// tool, input_hash and seq. A failure that no later key repeated is
// skipped. tool, if not empty, keeps that tool only. SQLite does the grouping, so memory does not grow with the ledger.
func (rd *Reader) RepeatedFailures(ctx context.Context, tool string, fn func(*ledger.CallAfterFailure) error) error {
	rows, err := rd.r.QueryContext(ctx, sqlRepeatedFailures, rd.args(tool)...)
	if err != nil {
		return fmt.Errorf("repeated failures: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	// Rows come in groups: a failure row, then its repeats. A failure row
	// is held until its first repeat shows it was run again.
	var failure ledger.CallAfterFailure
	var held, sent bool
	var c ledger.CallAfterFailure
	var kind string
	for rows.Next() {
		if err := rows.Scan(&c.Tool, &c.InputHash, &kind, &c.Key, &c.ExecutionID, &c.ErrorCode, &c.Seq, &c.RecordedAt, &c.Rerun); err != nil {
			return fmt.Errorf("repeated failures: %w", err)
		}
		c.Failure = kind != "reserve"
		if c.Failure {
			failure, held, sent = c, true, false
			continue
		}
		if !held || c.Tool != failure.Tool || c.InputHash != failure.InputHash {
			continue // cannot happen: every group starts with its failure
		}
		if !sent {
			if err := fn(&failure); err != nil {
				return err
			}
			sent = true
		}
		c.ErrorCode = ""
		if err := fn(&c); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("repeated failures: %w", classify(err))
	}
	return nil
}
