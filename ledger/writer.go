package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
)

// SQL of the write path.
const (
	sqlHead = `SELECT seq, hash FROM receipts ORDER BY seq DESC LIMIT 1`

	receiptColumns = `seq, kind, idempotency_key, key_generated, execution_id, attempt, tool,
		effect, idempotent, input_hash, outcome, external_ref, result, error_code, error_message,
		retryable, lease_expires_at, ref_seq, actor, note, recorded_at, prev_hash, hash`

	sqlInsertReceipt = `INSERT INTO receipts (` + receiptColumns + `)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

	sqlReceiptBySeq = `SELECT ` + receiptColumns + ` FROM receipts WHERE seq = ?`

	sqlKey = `SELECT key_generated, tool, effect, input_hash, idempotent, first_seq, reserve_seq,
		lease_expires_at, final_seq, token_hash FROM keys WHERE idempotency_key = ?`

	sqlPutKey = `INSERT OR REPLACE INTO keys (idempotency_key, key_generated, tool, effect,
		input_hash, idempotent, first_seq, reserve_seq, lease_expires_at, final_seq, token_hash)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

	// The execution index is the selective one: an execution has few receipts.
	sqlMaxAttempt = `SELECT max(attempt) FROM receipts INDEXED BY receipts_by_execution
		WHERE execution_id = ? AND idempotency_key = ?`
)

// writeStmts are the write path's statements, prepared once on the writer
// connection.
type writeStmts struct {
	key, putKey, insert, receipt, maxAttempt *sql.Stmt
	treeRead                                 *sql.Stmt    // tree.go
	treeInsert                               [8]*sql.Stmt // tree.go: 2^k rows each
}

func prepareWrite(ctx context.Context, w *sql.DB) (*writeStmts, error) {
	var s writeStmts
	for _, p := range []struct {
		dst **sql.Stmt
		sql string
	}{{&s.key, sqlKey}, {&s.putKey, sqlPutKey}, {&s.insert, sqlInsertReceipt},
		{&s.receipt, sqlReceiptBySeq}, {&s.maxAttempt, sqlMaxAttempt}} {
		st, err := w.PrepareContext(ctx, p.sql)
		if err != nil {
			return nil, fmt.Errorf("prepare: %w", classify(err))
		}
		*p.dst = st
	}
	return &s, nil
}

// writeOp is one queued write: fn runs inside the writer's transaction and
// its error (nil, a domain *Error, or an internal failure) is sent on done
// only after the transaction has committed or rolled back.
type writeOp struct {
	ctx  context.Context
	fn   func(ctx context.Context, t *writeTx) error
	done chan error
	err  error
}

// submit queues fn for the writer and waits for the durable outcome.
func (db *DB) submit(ctx context.Context, fn func(ctx context.Context, t *writeTx) error) error {
	op := &writeOp{ctx: ctx, fn: fn, done: make(chan error, 1)}
	db.mu.RLock()
	if db.closed {
		db.mu.RUnlock()
		return ErrClosed
	}
	select {
	case db.ops <- op:
	case <-ctx.Done():
		db.mu.RUnlock()
		return ctx.Err()
	}
	db.mu.RUnlock()
	select {
	case err := <-op.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writer owns the chain head. It drains the queue in batches: each batch
// is one BEGIN IMMEDIATE transaction in which the ops run in order, so each
// decision sees the effects of the ones before it. It never waits for a
// batch to fill: a lone request is written at once.
func (db *DB) writer() {
	defer close(db.done)
	batch := make([]*writeOp, 0, db.maxBatch)
	for op := range db.ops {
		batch = append(batch[:0], op)
	fill:
		for len(batch) < db.maxBatch {
			select {
			case op, ok := <-db.ops:
				if !ok {
					break fill
				}
				batch = append(batch, op)
			default:
				break fill
			}
		}
		db.runBatch(batch)
		clear(batch)
	}
}

// runBatch runs ops in one transaction and replies to each after COMMIT.
// A domain error of one op touches nothing (decisions are made before any
// write); any other failure rolls back the whole batch and fails every op
// in it, leaving the head as it was.
func (db *DB) runBatch(ops []*writeOp) {
	ctx := context.Background() // request contexts must not interrupt a shared transaction
	start := time.Now()
	head := *db.head.Load()
	t := &writeTx{now: uint64(db.now().UnixMilli()), head: head, stmts: db.stmts, cache: db.cache}
	t.tree.cache = db.tree
	fail := func(err error) {
		db.lastWriteErr.Store(&err)
		writerReady.Set(0)
		batchFailures.Inc()
		db.logger.Error("write batch failed", "ops", len(ops), "err", err)
		for _, op := range ops {
			var de *Error
			if !errors.As(op.err, &de) {
				op.err = err
			}
			op.done <- op.err
		}
	}
	tx, err := db.w.BeginTx(ctx, nil)
	if err != nil {
		fail(fmt.Errorf("begin: %w", classify(err)))
		return
	}
	t.tx = tx
	for _, op := range ops {
		if err := op.ctx.Err(); err != nil {
			op.err = err
			continue
		}
		op.err = op.fn(ctx, t)
		var de *Error
		if op.err != nil && !errors.As(op.err, &de) {
			_ = tx.Rollback()
			fail(op.err)
			return
		}
	}
	if err := t.flushTree(ctx); err != nil {
		_ = tx.Rollback()
		fail(err)
		return
	}
	if db.beforeCommit != nil {
		if err := db.beforeCommit(); err != nil {
			_ = tx.Rollback()
			fail(fmt.Errorf("commit: %w", err))
			return
		}
	}
	if err := tx.Commit(); err != nil {
		_ = tx.Rollback()
		fail(fmt.Errorf("commit: %w", classify(err)))
		return
	}
	db.lastWriteErr.Store(nil)
	writerReady.Set(1)
	db.head.Store(&t.head)
	if t.resetCache {
		db.cache = newKeyCache(db.cache.max)
	}
	if t.resetCache {
		db.cache = newKeyCache(db.cache.max)
	}
	db.cache.merge(t.dirtyKeys, t.dirtyReceipts)
	db.commitTree(t)
	db.waits.notify(t.ended) // after COMMIT: a woken reserve sees the outcome
	for _, op := range ops {
		op.done <- op.err
	}
	busy := time.Since(start)
	batchSize.Observe(float64(len(ops)))
	batchSeconds.Observe(busy.Seconds())
	writerBusy.Add(busy.Seconds())
	writerOps.Add(float64(len(ops)))
	db.busyNanos.Add(int64(busy))
	db.opsDone.Add(int64(len(ops)))
	db.kickCheckpoint()
	for _, kind := range t.kinds {
		receiptsAppended.WithLabelValues(kind).Inc()
	}
	headSeq.Set(float64(t.head.Seq))
}

// writeTx is the writer's view of one batch transaction; it implements
// writeStore. Reads look at this batch's own writes first, then the
// writer's key cache, then SQLite; what the batch reads or writes is
// merged into the cache only after COMMIT, so a failed batch leaves the
// cache exactly as the database is.
type writeTx struct {
	tx    *sql.Tx
	now   uint64 // unix ms, read once per batch
	head  Head   // head including this batch's appends
	kinds []string
	ended []string // keys whose reservation this batch committed or resolved

	stmts         *writeStmts
	bound         [5]*sql.Stmt // stmts bound to tx, made on first use
	cache         *keyCache
	dirtyKeys     map[string]*keyRecord
	dirtyReceipts map[uint64]*chain.Receipt
	resetCache    bool // the batch rewrote the keys table behind the cache
	tree          treeTx
}

var _ writeStore = (*writeTx)(nil)

// stmt returns statement i of stmts bound to the transaction.
func (t *writeTx) stmt(ctx context.Context, i int) *sql.Stmt {
	if t.bound[i] == nil {
		st := [...]*sql.Stmt{t.stmts.key, t.stmts.putKey, t.stmts.insert, t.stmts.receipt, t.stmts.maxAttempt}[i]
		t.bound[i] = t.tx.StmtContext(ctx, st)
	}
	return t.bound[i]
}

const (
	stKey = iota
	stPutKey
	stInsert
	stReceipt
	stMaxAttempt
)

func (t *writeTx) key(ctx context.Context, key string) (keyRecord, bool, error) {
	if k, ok := t.dirtyKeys[key]; ok {
		return *k, true, nil
	}
	if k, ok := t.cache.keys[key]; ok {
		return *k, true, nil
	}
	k := keyRecord{Key: key}
	var token []byte
	err := t.stmt(ctx, stKey).QueryRowContext(ctx, key).Scan(&k.Generated, &k.Tool, &k.Effect, &k.InputHash,
		&k.Idempotent, &k.FirstSeq, &k.ReserveSeq, &k.LeaseExpiresAt, &k.FinalSeq, &token)
	if errors.Is(err, sql.ErrNoRows) {
		return k, false, nil
	}
	if err != nil {
		return k, false, fmt.Errorf("read key: %w", classify(err))
	}
	k.TokenHash = string(token)
	t.markKey(&k)
	return k, true, nil
}

func (t *writeTx) markKey(k *keyRecord) {
	if t.dirtyKeys == nil {
		t.dirtyKeys = map[string]*keyRecord{}
	}
	c := *k
	t.dirtyKeys[k.Key] = &c
}

func (t *writeTx) markReceipt(r *chain.Receipt) {
	if t.dirtyReceipts == nil {
		t.dirtyReceipts = map[uint64]*chain.Receipt{}
	}
	c := *r
	t.dirtyReceipts[r.Seq] = &c
}

func (t *writeTx) receipt(ctx context.Context, seq uint64) (chain.Receipt, error) {
	if r, ok := t.dirtyReceipts[seq]; ok {
		return *r, nil
	}
	if r, ok := t.cache.receipts[seq]; ok {
		return *r, nil
	}
	r, err := scanReceipt(t.stmt(ctx, stReceipt).QueryRowContext(ctx, seq))
	if err != nil {
		return r, fmt.Errorf("read receipt %d: %w", seq, classify(err))
	}
	t.markReceipt(&r)
	return r, nil
}

func (t *writeTx) maxAttempt(ctx context.Context, key, execution string) (uint64, bool, error) {
	var max sql.NullInt64
	if err := t.stmt(ctx, stMaxAttempt).QueryRowContext(ctx, execution, key).Scan(&max); err != nil {
		return 0, false, fmt.Errorf("read attempts: %w", classify(err))
	}
	return uint64(max.Int64), max.Valid, nil
}

func (t *writeTx) append(ctx context.Context, r chain.Receipt) (chain.Receipt, error) {
	r = chain.Link(t.head.Seq, t.head.Hash, r)
	_, err := t.stmt(ctx, stInsert).ExecContext(ctx,
		r.Seq, r.Kind, r.IdempotencyKey, r.KeyGenerated, r.ExecutionID, r.Attempt, r.Tool,
		r.Effect, r.Idempotent, r.InputHash, r.Outcome, r.ExternalRef, r.Result, r.ErrorCode,
		r.ErrorMessage, r.Retryable, r.LeaseExpiresAt, r.RefSeq, r.Actor, r.Note, r.RecordedAt,
		r.PrevHash[:], r.Hash[:])
	if err != nil {
		return r, fmt.Errorf("append receipt %d: %w", r.Seq, classify(err))
	}
	if err := t.appendLeaf(ctx, &r); err != nil {
		return r, err
	}
	t.head = Head{Seq: r.Seq, Hash: r.Hash}
	t.kinds = append(t.kinds, r.Kind)
	if r.Kind == chain.KindCommit || r.Kind == chain.KindResolve {
		t.ended = append(t.ended, r.IdempotencyKey)
	}
	if r.Kind != chain.KindReplay { // decisions read reserves and outcomes, never replays
		t.markReceipt(&r)
	}
	return r, nil
}

func (t *writeTx) putKey(ctx context.Context, k *keyRecord) error {
	_, err := t.stmt(ctx, stPutKey).ExecContext(ctx, k.Key, k.Generated, k.Tool, k.Effect, k.InputHash,
		k.Idempotent, k.FirstSeq, k.ReserveSeq, k.LeaseExpiresAt, k.FinalSeq, []byte(k.TokenHash))
	if err != nil {
		return fmt.Errorf("write key: %w", classify(err))
	}
	t.markKey(k)
	return nil
}

// rowScanner is *sql.Row or *sql.Rows.
type rowScanner interface{ Scan(dest ...any) error }
