package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
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
		WHERE execution_id = ? AND idempotency_key = ? AND seq >= ?`

	sqlLastSeq = `SELECT max(seq) FROM receipts INDEXED BY receipts_by_key WHERE idempotency_key = ?`
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

// Update runs fn in one BEGIN IMMEDIATE transaction of the file's single
// writer connection and returns after COMMIT. SQLite runs it once: the
// file has one writer (the lock file), so nothing can conflict.
func (c *fileChain) Update(ctx context.Context, fn func(ctx context.Context, tx ledger.Tx) error) error {
	return c.update(ctx, func(ctx context.Context, t *writeTx) error { return fn(ctx, t) })
}

// update is Update with the SQLite transaction at hand (rebuild-keys and
// the tree back-fill use it). What the batch read or wrote enters the
// head, key and tree caches only after COMMIT, so a failed batch leaves
// them exactly as the database is.
func (c *fileChain) update(ctx context.Context, fn func(ctx context.Context, t *writeTx) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ledger.ErrClosed
	}
	start := time.Now()
	t := &writeTx{now: uint64(c.now().UnixMilli()), head: *c.head.Load(), stmts: c.stmts, cache: c.cache}
	t.tree.cache = c.tree
	tx, err := c.w.BeginTx(context.Background(), nil) // a request's end must not interrupt a shared transaction
	if err != nil {
		return fmt.Errorf("begin: %w", classify(err))
	}
	t.tx = tx
	if err := fn(ctx, t); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := t.flushTree(ctx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if c.beforeCommit != nil {
		if err := c.beforeCommit(); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("commit: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("commit: %w", classify(err))
	}
	c.head.Store(&t.head)
	if t.resetCache {
		c.cache = newKeyCache(c.cache.max, c.cache.maxBytes)
	}
	c.cache.merge(t.dirtyKeys, t.dirtyReceipts)
	c.commitTree(t)
	if c.onEnded != nil && len(t.ended) > 0 {
		c.onEnded(c.ns, t.ended) // after COMMIT: a woken reserve sees the outcome
	}
	c.busyNanos.Add(int64(time.Since(start)))
	c.opsDone.Add(int64(t.appended) + 1)
	c.batches.Add(1)
	c.kickCheckpoint()
	return nil
}

// writeTx is the writer's view of one batch transaction: the ledger.Tx
// of an Update. Reads look at this batch's own writes first, then the
// writer's key cache, then SQLite; what the batch reads or writes is
// merged into the cache only after COMMIT, so a failed batch leaves the
// cache exactly as the database is.
type writeTx struct {
	tx       *sql.Tx
	now      uint64      // unix ms, read once per batch
	head     ledger.Head // head including this batch's appends
	appended int
	ended    []string // keys whose reservation this batch committed or resolved

	stmts         *writeStmts
	bound         [5]*sql.Stmt // stmts bound to tx, made on first use
	cache         *keyCache
	dirtyKeys     map[string]*ledger.KeyRecord
	dirtyReceipts map[uint64]*chain.Receipt
	resetCache    bool // the batch rewrote the keys table behind the cache
	tree          treeTx
}

var _ ledger.Tx = (*writeTx)(nil)

// Head is the head including this transaction's appends.
func (t *writeTx) Head() ledger.Head { return t.head }

// Now is the batch's time, unix ms.
func (t *writeTx) Now() uint64 { return t.now }

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

// Key reads a key record: this batch's writes, the key cache, SQLite.
func (t *writeTx) Key(ctx context.Context, key string) (ledger.KeyRecord, bool, error) {
	if k, ok := t.dirtyKeys[key]; ok {
		return *k, true, nil
	}
	if k, ok := t.cache.keys[key]; ok {
		return *k, true, nil
	}
	k := ledger.KeyRecord{Key: key}
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

func (t *writeTx) markKey(k *ledger.KeyRecord) {
	if t.dirtyKeys == nil {
		t.dirtyKeys = map[string]*ledger.KeyRecord{}
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

// Receipt reads a receipt: this batch's, the key cache's, SQLite's.
func (t *writeTx) Receipt(ctx context.Context, seq uint64) (chain.Receipt, error) {
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

// MaxAttempt reads the highest attempt of execution on key from seq
// since on.
func (t *writeTx) MaxAttempt(ctx context.Context, key, execution string, since uint64) (uint64, bool, error) {
	var max sql.NullInt64
	if err := t.stmt(ctx, stMaxAttempt).QueryRowContext(ctx, execution, key, since).Scan(&max); err != nil {
		return 0, false, fmt.Errorf("read attempts: %w", classify(err))
	}
	return uint64(max.Int64), max.Valid, nil
}

// LastSeq reads the seq of key's latest receipt (only a reserve of an
// expired key asks).
func (t *writeTx) LastSeq(ctx context.Context, key string) (uint64, error) {
	var seq sql.NullInt64
	if err := t.tx.QueryRowContext(ctx, sqlLastSeq, key).Scan(&seq); err != nil {
		return 0, fmt.Errorf("read last receipt of key: %w", classify(err))
	}
	if !seq.Valid {
		return 0, fmt.Errorf("read last receipt of key: key %q has no receipt", key)
	}
	return uint64(seq.Int64), nil
}

// Append stores a linked receipt and its tree hashes (flushed before
// COMMIT).
func (t *writeTx) Append(ctx context.Context, r *chain.Receipt, hashes []tlog.Hash) error {
	if r.Seq != t.head.Seq+1 || r.PrevHash != t.head.Hash {
		return fmt.Errorf("append receipt %d: not linked to the head %d", r.Seq, t.head.Seq)
	}
	_, err := t.stmt(ctx, stInsert).ExecContext(ctx,
		r.Seq, r.Kind, r.IdempotencyKey, r.KeyGenerated, r.ExecutionID, r.Attempt, r.Tool,
		r.Effect, r.Idempotent, r.InputHash, r.Outcome, r.ExternalRef, r.Result, r.ErrorCode,
		r.ErrorMessage, r.Retryable, r.LeaseExpiresAt, r.RefSeq, r.Actor, r.Note, r.RecordedAt,
		r.PrevHash[:], r.Hash[:])
	if err != nil {
		return fmt.Errorf("append receipt %d: %w", r.Seq, classify(err))
	}
	if err := t.addLeaf(r.Seq, hashes); err != nil {
		return err
	}
	t.head = ledger.Head{Seq: r.Seq, Hash: r.Hash}
	t.appended++
	if r.Kind == chain.KindCommit || r.Kind == chain.KindResolve {
		t.ended = append(t.ended, r.IdempotencyKey)
	}
	if r.Kind != chain.KindReplay { // decisions read reserves and outcomes, never replays
		t.markReceipt(r)
	}
	return nil
}

// PutKey inserts or replaces a key record.
func (t *writeTx) PutKey(ctx context.Context, k *ledger.KeyRecord) error {
	_, err := t.stmt(ctx, stPutKey).ExecContext(ctx, k.Key, k.Generated, k.Tool, k.Effect, k.InputHash,
		k.Idempotent, k.FirstSeq, k.ReserveSeq, k.LeaseExpiresAt, k.FinalSeq, []byte(k.TokenHash))
	if err != nil {
		return fmt.Errorf("write key: %w", classify(err))
	}
	t.markKey(k)
	return nil
}

// Probe writes 1 MiB outside the chain (the readiness probe).
func (t *writeTx) Probe(ctx context.Context) error {
	if _, err := t.tx.ExecContext(ctx, sqlReadyProbe); err != nil {
		return fmt.Errorf("ready probe: %w", classify(err))
	}
	return nil
}

// rowScanner is *sql.Row or *sql.Rows.
type rowScanner interface{ Scan(dest ...any) error }
