package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// What the gate of SPEC §13 reads and writes in a Write (its part of
// ledger.StateReader and ledger.TxWriter), and the asked inputs' read
// (ledger.ChainReader.AskInput).

const (
	// sqlTxKeyHistory reads on receipts_by_key.
	sqlTxKeyHistory = `SELECT ` + receiptColumns + ` FROM receipts
		WHERE namespace = $1 AND idempotency_key = $2 AND seq >= $3 ORDER BY seq`

	// sqlTxRecentOutcomes reads on receipts_outcomes_by_input, whose
	// predicate the kind clause repeats word for word.
	sqlTxRecentOutcomes = `SELECT ` + receiptColumns + ` FROM receipts
		WHERE namespace = $1 AND tool = $2 AND input_hash = $3 AND kind IN ('commit', 'resolve', 'reconcile')
		AND recorded_at >= $4 ORDER BY seq`

	sqlAskInput = `SELECT input, delete_after FROM approval_inputs WHERE namespace = $1 AND ask_seq = $2`
)

// askInputOp is a buffered write of approval_inputs: an upsert (put) or a
// new deadline.
type askInputOp struct {
	put         bool
	seq         uint64
	input       string
	deleteAfter uint64
}

// KeyHistory returns key's receipts with seq >= since, in seq order, this
// transaction's appends included, in one query.
func (t *tx) KeyHistory(ctx context.Context, key string, since uint64) ([]chain.Receipt, error) {
	var out []chain.Receipt
	if since <= t.oldHead.Seq {
		rows, err := t.conn.Query(ctx, sqlTxKeyHistory, t.c.ns, key, int64(since))
		if err != nil {
			return nil, t.dbFail("read key history", err)
		}
		if out, err = collectReceipts(rows); err != nil {
			return nil, t.dbFail("read key history", err)
		}
	}
	for i := range t.receipts {
		if r := &t.receipts[i]; r.IdempotencyKey == key && r.Seq >= since {
			out = append(out, *r)
		}
	}
	return out, nil
}

// RecentOutcomes calls fn, in seq order, for the commit, resolve and
// reconcile receipts of tool and inputHash recorded at notBefore or later, this
// transaction's appends included, until fn returns false. The stored ones
// are read in one query and in full before fn runs, so that fn may use
// the transaction.
func (t *tx) RecentOutcomes(ctx context.Context, tool, inputHash string, notBefore uint64, fn func(*chain.Receipt) bool) error {
	rows, err := t.conn.Query(ctx, sqlTxRecentOutcomes, t.c.ns, tool, inputHash, int64(notBefore))
	if err != nil {
		return t.dbFail("read recent outcomes", err)
	}
	stored, err := collectReceipts(rows)
	if err != nil {
		return t.dbFail("read recent outcomes", err)
	}
	for i := range stored {
		if !fn(&stored[i]) {
			return nil
		}
	}
	for i := range t.receipts {
		r := t.receipts[i] // a copy: fn must not change the buffered receipt
		if (r.Kind == chain.KindCommit || r.Kind == chain.KindResolve || r.Kind == chain.KindReconcile) && r.Tool == tool &&
			r.InputHash == inputHash && r.RecordedAt >= notBefore && !fn(&r) {
			return nil
		}
	}
	return nil
}

// PutAskInput buffers the keeping of the ask's input until deleteAfter
// (an upsert: a re-run of the domain's function on a new transaction
// writes it once) and the deletion of the inputs past their delete_after
// at now; write sends both with the batch.
func (t *tx) PutAskInput(ctx context.Context, seq uint64, input string, deleteAfter, now uint64) error {
	if seq == 0 {
		return errors.New("keep the asked input: seq 0")
	}
	if len(input) > ledger.MaxAskInput {
		return ledger.Invalid("input", "input must be at most %d bytes", ledger.MaxAskInput)
	}
	if strings.IndexByte(input, 0) >= 0 || !utf8.ValidString(input) {
		// PostgreSQL text holds neither: refuse here rather than fail
		// the whole batch at write time.
		return ledger.Invalid("input", "input must be UTF-8 text without a NUL character")
	}
	t.askInputs = append(t.askInputs, askInputOp{put: true, seq: seq, input: input, deleteAfter: deleteAfter})
	t.purgeBefore = max(t.purgeBefore, now)
	return nil
}

// SetAskInputDeadline buffers the move of the ask's input deletion (if it
// is still kept) to deleteAfter and the deletion of the inputs past their
// delete_after at now.
func (t *tx) SetAskInputDeadline(ctx context.Context, seq, deleteAfter, now uint64) error {
	t.askInputs = append(t.askInputs, askInputOp{seq: seq, deleteAfter: deleteAfter})
	t.purgeBefore = max(t.purgeBefore, now)
	return nil
}

// MayHaveGateReceipts is always true: another replica may have asked, and
// the key's history is one query anyway.
func (t *tx) MayHaveGateReceipts(context.Context, string) (bool, error) { return true, nil }

// PurgeAskInputs buffers the deletion of the asked inputs past their
// delete_after at now.
func (t *tx) PurgeAskInputs(_ context.Context, now uint64) error {
	t.purgeBefore = max(t.purgeBefore, now)
	return nil
}

// AskInput returns the input kept for the ask at seq, or found false when
// none is kept or its delete_after is before now. A schema older than 3
// (read as it is by a read-only store) keeps none.
func (c *Chain) AskInput(ctx context.Context, seq, now uint64) (string, bool, error) {
	if c.s.version < 3 {
		return "", false, nil
	}
	var input string
	var deleteAfter int64
	err := c.s.pool.QueryRow(ctx, sqlAskInput, c.ns, int64(seq)).Scan(&input, &deleteAfter)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read asked input %d: %w", seq, classify(err))
	}
	if uint64(deleteAfter) < now {
		return "", false, nil
	}
	return input, true, nil
}
