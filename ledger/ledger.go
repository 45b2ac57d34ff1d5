package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Reserve reserves an idempotency key before an effect runs (SPEC §4
// reserve table). It returns a *ReserveResult for 200/201 outcomes, or an
// error: *Error with ECodeInvalidKey, ECodeInvalidRequest,
// ECodeFingerprintMismatch, ECodeInProgress, ECodeUnsafeResume,
// ECodeRetryNotAllowed or ECodeAttemptConflict; ErrUnavailable when the
// database cannot be written. A result reporting a receipt is durable.
func (db *DB) Reserve(ctx context.Context, req ReserveRequest) (*ReserveResult, error) {
	a, err := req.validate()
	if err != nil {
		return nil, err
	}
	var res *ReserveResult
	if a.effect == chain.EffectNone || a.effect == chain.EffectRead {
		res, err = decideReserve(ctx, nil, 0, &a) // no lookup, no receipt
	} else {
		err = db.submit(ctx, func(ctx context.Context, t *writeTx) error {
			var err error
			res, err = decideReserve(ctx, t, t.now, &a)
			return err
		})
	}
	if err != nil {
		reserveOutcomes.WithLabelValues(ErrorCode(err)).Inc()
		return nil, err
	}
	reserveOutcomes.WithLabelValues(reserveLabel(res)).Inc()
	return res, nil
}

func reserveLabel(r *ReserveResult) string {
	switch {
	case r.Takeover:
		return "takeover"
	case r.Retry:
		return "retry"
	}
	return r.Status
}

// Commit records the outcome of the reservation named by req.Reservation
// (SPEC §4 commit table). Errors: *Error with ECodeInvalidRequest,
// ECodeUnknownKey, ECodeStaleReservation or ECodeAlreadyFinalized;
// ErrUnavailable. A repeat of an identical commit returns the original
// result with Replayed set and appends nothing.
func (db *DB) Commit(ctx context.Context, req CommitRequest) (*CommitResult, error) {
	res, err := db.commit(ctx, req)
	label := ErrorCode(err)
	switch {
	case err != nil:
	case res.Replayed:
		label = "repeat"
	case res.Late:
		label = "late"
	default:
		label = StatusCommitted
	}
	commitOutcomes.WithLabelValues(label).Inc()
	return res, err
}

func (db *DB) commit(ctx context.Context, req CommitRequest) (*CommitResult, error) {
	if err := checkKeyPath(req.IdempotencyKey); err != nil {
		return nil, err
	}
	if req.Reservation == "" {
		return nil, invalid("reservation", "reservation is required")
	}
	o, err := validateOutcome(req.Outcome, req.ExternalRef, req.Result, req.Error)
	if err != nil {
		return nil, err
	}
	var res *CommitResult
	err = db.submit(ctx, func(ctx context.Context, t *writeTx) error {
		var err error
		res, err = decideCommit(ctx, t, t.now, req.IdempotencyKey, req.Reservation, req.Actor, &o)
		return err
	})
	return res, err
}

// Resolve records an operator's decision about an interrupted key. Errors:
// *Error with ECodeInvalidRequest, ECodeUnknownKey or ECodeNotInterrupted;
// ErrUnavailable.
func (db *DB) Resolve(ctx context.Context, req ResolveRequest) (*ResolveResult, error) {
	res, err := db.resolve(ctx, req)
	label := ErrorCode(err)
	if err == nil {
		label = StatusResolved
	}
	resolveOutcomes.WithLabelValues(label).Inc()
	return res, err
}

func (db *DB) resolve(ctx context.Context, req ResolveRequest) (*ResolveResult, error) {
	if err := checkKeyPath(req.IdempotencyKey); err != nil {
		return nil, err
	}
	if n := len([]rune(req.Note)); n < 1 || n > MaxNoteLen {
		return nil, invalid("note", "note is required: 1–%d characters", MaxNoteLen)
	}
	o, err := validateOutcome(req.Outcome, req.ExternalRef, req.Result, req.Error)
	if err != nil {
		return nil, err
	}
	var res *ResolveResult
	err = db.submit(ctx, func(ctx context.Context, t *writeTx) error {
		var err error
		res, err = decideResolve(ctx, t, t.now, req.IdempotencyKey, req.Actor, req.Note, &o)
		return err
	})
	return res, err
}

// Ready reports whether the database accepts writes: it runs an empty
// transaction through the writer.
func (db *DB) Ready(ctx context.Context) error {
	return db.submit(ctx, func(context.Context, *writeTx) error { return nil })
}

// SQL of the read path.
const (
	sqlKeyReceipts = `SELECT ` + receiptColumns + ` FROM receipts INDEXED BY receipts_by_key
		WHERE idempotency_key = ? ORDER BY seq`
)

// GetKey returns a key's state and receipts. Errors: *Error with
// ECodeUnknownKey or ECodeInvalidKey.
func (db *DB) GetKey(ctx context.Context, key string) (*KeyView, error) {
	if err := checkKeyPath(key); err != nil {
		return nil, err
	}
	tx, err := db.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("get key: %w", classify(err))
	}
	defer func() { _ = tx.Rollback() }()
	k := keyRecord{Key: key}
	err = tx.QueryRowContext(ctx, sqlKey, key).Scan(&k.Generated, &k.Tool, &k.Effect, &k.InputHash,
		&k.Idempotent, &k.FirstSeq, &k.ReserveSeq, &k.LeaseExpiresAt, &k.FinalSeq)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, Errorf(ECodeUnknownKey, "no such idempotency key")
	}
	if err != nil {
		return nil, fmt.Errorf("get key: %w", classify(err))
	}
	receipts, err := queryReceipts(ctx, tx, sqlKeyReceipts, key)
	if err != nil {
		return nil, fmt.Errorf("get key: %w", err)
	}
	var final chain.Receipt
	for i := range receipts {
		if receipts[i].Seq == k.FinalSeq {
			final = receipts[i]
		}
	}
	return &KeyView{IdempotencyKey: key, State: stateOf(&k, &final, uint64(db.now().UnixMilli())),
		Tool: k.Tool, Effect: k.Effect, Idempotent: k.Idempotent, InputHash: k.InputHash,
		Receipts: receipts}, nil
}

// ListReceipts returns up to f.Limit receipts with seq > f.After that match
// the filters, oldest first, and the seq to pass as After for the next
// page, or nil when no matching receipt follows. Errors: *Error with
// ECodeInvalidRequest.
func (db *DB) ListReceipts(ctx context.Context, f ReceiptFilter) ([]chain.Receipt, *uint64, error) {
	if f.Limit == 0 {
		f.Limit = DefaultPageLimit
	}
	if f.Limit < 1 || f.Limit > MaxPageLimit {
		return nil, nil, invalid("limit", "limit must be from 1 to %d", MaxPageLimit)
	}
	switch f.Kind {
	case "", chain.KindReserve, chain.KindCommit, chain.KindReplay, chain.KindResolve:
	default:
		return nil, nil, invalid("kind", "kind must be reserve, commit, replay or resolve")
	}
	var where []string
	args := []any{f.After}
	for _, c := range []struct{ col, v string }{
		{"idempotency_key", f.Key}, {"execution_id", f.ExecutionID}, {"tool", f.Tool}, {"kind", f.Kind},
	} {
		if c.v != "" {
			where = append(where, " AND "+c.col+" = ?")
			args = append(args, c.v)
		}
	}
	q := `SELECT ` + receiptColumns + ` FROM receipts WHERE seq > ?` + strings.Join(where, "") +
		` ORDER BY seq LIMIT ?`
	args = append(args, f.Limit+1)
	rs, err := queryReceipts(ctx, db.r, q, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("list receipts: %w", err)
	}
	if len(rs) <= f.Limit {
		return rs, nil, nil
	}
	rs = rs[:f.Limit]
	next := rs[len(rs)-1].Seq
	return rs, &next, nil
}

// GetReceipt returns the receipt at seq. Errors: *Error with
// ECodeUnknownReceipt.
func (db *DB) GetReceipt(ctx context.Context, seq uint64) (*chain.Receipt, error) {
	r, err := scanReceipt(db.r.QueryRowContext(ctx, sqlReceiptBySeq, seq))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, Errorf(ECodeUnknownReceipt, "no receipt with seq %d", seq)
	}
	if err != nil {
		return nil, fmt.Errorf("get receipt: %w", classify(err))
	}
	return &r, nil
}

// querier is *sql.DB or *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func queryReceipts(ctx context.Context, q querier, query string, args ...any) ([]chain.Receipt, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, classify(err)
	}
	defer func() { _ = rows.Close() }()
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
