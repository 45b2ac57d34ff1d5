package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/keyindex"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// writeStmts are the write path's statements, prepared once on the writer
// connection for every chain of the file.
type writeStmts struct {
	insert, receipt, token, treeRead, treeRow, pending *sql.Stmt
	payloads                                           [payloadBatch + 1]*sql.Stmt // [n]: the INSERT of n rows of ns_payloads
}

func prepareWrite(ctx context.Context, w *sql.DB) (*writeStmts, error) {
	type prep struct {
		dst **sql.Stmt
		sql string
	}
	var s writeStmts
	stmts := []prep{{&s.insert, sqlInsertReceipt}, {&s.receipt, sqlReceiptBySeq}, {&s.token, sqlInsertToken}, {&s.treeRead, sqlTreeHash},
		{&s.treeRow, sqlTreeRow}, {&s.pending, sqlPending}}
	for n := 1; n <= payloadBatch; n++ {
		stmts = append(stmts, prep{&s.payloads[n], insertPayloads(n)})
	}
	for _, p := range stmts {
		st, err := w.PrepareContext(ctx, p.sql)
		if err != nil {
			return nil, fmt.Errorf("prepare: %w", classify(err))
		}
		*p.dst = st
	}
	return &s, nil
}

// all lists the statements, for Close.
func (s *writeStmts) all() []*sql.Stmt {
	return append([]*sql.Stmt{s.insert, s.receipt, s.token, s.treeRead, s.treeRow, s.pending}, s.payloads[1:]...)
}

// insertPayloads is the INSERT of n rows of ns_payloads (1 ≤ n ≤
// payloadBatch).
func insertPayloads(n int) string {
	var b strings.Builder
	b.WriteString(sqlInsertPayloads)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?)")
	}
	return b.String()
}

// update runs fn in one BEGIN IMMEDIATE transaction of the file's single
// writer connection and returns after COMMIT. SQLite runs it once: the
// file has one writer (the lock file), so nothing can conflict. What the
// batch read or wrote enters the head, key and tree caches and the key
// index only after COMMIT, so a failed batch leaves them exactly as the
// database is.
func (c *chainWriter) update(ctx context.Context, fn func(ctx context.Context, tx ledger.Tx) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ledger.ErrClosed
	}
	if err := c.indexUsable(ctx); err != nil {
		return err
	}
	start := time.Now()
	t := c.newTx()
	tx, err := c.w.BeginTx(context.Background(), nil) // a request's end must not interrupt a shared transaction
	if err != nil {
		return fmt.Errorf("begin: %w", classify(err))
	}
	t.tx = tx
	err = fn(ctx, t)
	if err == nil {
		err = t.flushPayloads(ctx)
	}
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := c.commit(tx); err != nil {
		return err
	}
	c.committed(t)
	c.file().counted(start, t.appended)
	return nil
}

// file is the chain that owns the file's writer: c itself, or the ledger
// file's chain for a namespace of the shared tables.
func (c *chainWriter) file() *chainWriter {
	if c.main != nil {
		return c.main
	}
	return c
}

// newTx starts c's part of a batch (its sql.Tx is set by the caller).
// Called with c.mu held.
func (c *chainWriter) newTx() *writeTx {
	t := &writeTx{now: c.clock(), head: *c.head.Load(), stmts: c.stmts, cache: c.cache,
		idx: c.idx, ns: c.ns, ref: c.chainRef, policySeq: c.policySeq.Load(), gated: c.gated, pending: &c.pending,
		pruned: c.prunedMark()}
	t.base = t.head.Seq
	t.tree.cache = c.tree
	return t
}

// commit runs the test hook, then COMMITs tx (rolled back if that fails).
func (c *chainWriter) commit(tx *sql.Tx) error {
	if f := c.file().beforeCommit; f != nil {
		if err := f(); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("commit: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("commit: %w", classify(err))
	}
	return nil
}

// committed takes a committed batch's part t into c's head, caches and
// key index, and wakes those waiting on the keys it ended.
func (c *chainWriter) committed(t *writeTx) {
	c.record(t)
	if f := c.file().afterCommit; f != nil {
		f()
	}
	c.applyIndex(t)
	c.settle(t)
}

// record takes a committed part t into c's head and gate state.
func (c *chainWriter) record(t *writeTx) {
	c.head.Store(&t.head)
	c.policySeq.Store(t.policySeq)
	if t.pruned != c.prunedMark() {
		c.pruned.Store(&t.pruned)
	}
	c.gated = t.gated // loaded by this batch, or the file's (a map: shared)
	for _, r := range t.receipts {
		if (r.Kind == chain.KindAsk || r.Kind == chain.KindDeny) && c.gated != nil {
			c.gated[r.IdempotencyKey] = struct{}{}
		}
	}
	if len(t.receipts) > 0 {
		held := c.held.Load()
		for _, r := range t.receipts {
			held = max(held, r.RecordedAt)
		}
		c.held.Store(held)
	}
}

// settle takes a committed part t (already in the key index) into c's
// caches and wakes those waiting on the keys it ended.
func (c *chainWriter) settle(t *writeTx) {
	c.cache.merge(c.id, t.dirtyKeys, t.dirtyReceipts)
	c.commitTree(t)
	if c.onEnded != nil && len(t.ended) > 0 {
		c.onEnded(c.ns, t.ended) // after COMMIT: a woken reserve sees the outcome
	}
	if t.erased {
		c.file().kickPurge() // the file's checkpointer
	}
}

// counted adds a committed transaction to the writer's work and wakes the
// checkpointer.
func (c *chainWriter) counted(start time.Time, appended int) {
	c.busyNanos.Add(int64(time.Since(start)))
	c.opsDone.Add(int64(appended) + 1)
	c.batches.Add(1)
	c.kickCheckpoint()
}

// writeTx is the writer's view of one batch transaction: the ledger.Tx
// of a Write. Reads look at this batch's own writes first, then the
// writer's key cache, then the key index (which holds every committed
// batch: the writer applies each after its COMMIT); what the batch reads
// or writes is merged into the cache and the index only after COMMIT, so
// a failed batch leaves both exactly as the database is.
type writeTx struct {
	erased   bool         // the batch erased payloads: purge the WAL after COMMIT (SPEC §14)
	pending  *pendingFlag // the chain's: may it have pending erasure marks
	tx       *sql.Tx
	now      uint64      // unix ms, read once per batch, never before the chain's last recorded_at
	head     ledger.Head // head including this batch's appends
	base     uint64      // the head's seq before this batch
	appended int
	ended    []string // keys whose reservation this batch committed or resolved

	stmts         *writeStmts
	bound         [5]*sql.Stmt     // stmts bound to tx, made on first use
	payloadArgs   []any            // the payload rows not yet inserted (putOpening)
	rids          map[uint64]int64 // the rowid of each receipt appended, by seq
	cache         *keyCache
	idx           *keyindex.Index
	ns            string
	ref           chainRef // the chain's tables
	dirtyKeys     map[string]*ledger.KeyRecord
	putKeys       []string // the keys PutKey wrote, in order (repeats possible)
	dirtyReceipts map[uint64]*chain.Receipt
	receipts      []*chain.Receipt // every receipt appended, replays included
	tree          treeTx
	policySeq     uint64              // the latest policy receipt, this batch's included (gate.go)
	pruned        ledger.PruneMark    // the pruned prefix, this batch's prune included (prune.go)
	gated         map[string]struct{} // the keys with an ask or a deny before this batch (gate.go)
}

var _ ledger.Tx = (*writeTx)(nil)

// Locked returns the head (this transaction's appends included), the
// batch's time and the latest policy receipt's seq.
func (t *writeTx) Locked(context.Context) (ledger.Locked, error) {
	return ledger.Locked{Head: t.head, Now: t.now, PolicySeq: t.policySeq, Pruned: t.pruned}, nil
}

// stmt returns statement i of stmts bound to the transaction.
func (t *writeTx) stmt(ctx context.Context, i int) *sql.Stmt {
	if t.bound[i] == nil {
		st := [...]*sql.Stmt{t.stmts.insert, t.stmts.receipt, t.stmts.token, t.stmts.treeRow, t.stmts.pending}[i]
		t.bound[i] = t.tx.StmtContext(ctx, st)
	}
	return t.bound[i]
}

const (
	stInsert = iota
	stReceipt
	stToken
	stTreeRow
	stPending
)

// Key reads a key record: this batch's writes, the key cache, the index
// (whose record lacks the fingerprint: it is the first reserve's).
func (t *writeTx) Key(ctx context.Context, key string) (ledger.KeyRecord, bool, error) {
	if k, ok := t.dirtyKeys[key]; ok {
		return *k, true, nil
	}
	if k, ok := t.cache.key(t.ref.id, key); ok {
		return *k, k.FirstSeq > t.pruned.Through, nil
	}
	k, found, err := t.idx.Key(t.ns, key)
	if err != nil {
		return k, false, fmt.Errorf("read key: %w: %w", ledger.ErrIO, err)
	}
	if !found || k.FirstSeq <= t.pruned.Through {
		return ledger.KeyRecord{}, false, nil // a pruned key is a new one (SPEC §16)
	}
	first, err := t.Receipt(ctx, k.FirstSeq)
	if err != nil {
		return k, false, fmt.Errorf("read key: %w", err)
	}
	k.Tool, k.Effect, k.InputHash = first.Tool, first.Effect, first.InputHash
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
	c.Open = nil
	t.dirtyReceipts[r.Seq] = &c
}

// Receipt reads a receipt: this batch's, the key cache's, SQLite's.
func (t *writeTx) Receipt(ctx context.Context, seq uint64) (chain.Receipt, error) {
	if r, ok := t.dirtyReceipts[seq]; ok {
		return *r, nil
	}
	if r, ok := t.cache.receipt(t.ref.id, seq); ok {
		return *r, nil
	}
	r, err := scanReceipt(t.stmt(ctx, stReceipt).QueryRowContext(ctx, t.ref.args(seq)...))
	if err != nil {
		return r, fmt.Errorf("read receipt %d: %w", seq, classify(err))
	}
	t.markReceipt(&r)
	return r, nil
}

// MaxAttempt reads the highest attempt of execution on key from seq
// since on: the key's receipts in the index (a key has few; only
// takeovers and retries ask), then this batch's.
func (t *writeTx) MaxAttempt(ctx context.Context, key, execution string, since uint64) (uint64, bool, error) {
	var top uint64
	var found bool
	var readErr error
	after := max(since, 1) - 1
	err := t.idx.Seqs(t.ns, keyindex.ByKey, key, after, func(seq uint64, _ []byte) (bool, error) {
		r, err := t.Receipt(ctx, seq)
		if err != nil {
			readErr = err
			return false, nil
		}
		if r.ExecutionID == execution && ledger.CountsForAttempts(r.Kind) && (!found || r.Attempt > top) {
			top, found = r.Attempt, true
		}
		return true, nil
	})
	if err != nil {
		return 0, false, fmt.Errorf("read attempts: %w: %w", ledger.ErrIO, err)
	}
	if readErr != nil {
		return 0, false, fmt.Errorf("read attempts: %w", readErr)
	}
	for _, r := range t.receipts {
		if r.Seq >= since && r.ExecutionID == execution && r.IdempotencyKey == key && ledger.CountsForAttempts(r.Kind) &&
			(!found || r.Attempt > top) {
			top, found = r.Attempt, true
		}
	}
	return top, found, nil
}

// LastSeq reads the seq of key's latest receipt (only a reserve of an
// expired key asks).
func (t *writeTx) LastSeq(_ context.Context, key string) (uint64, error) {
	for i := len(t.receipts) - 1; i >= 0; i-- {
		if t.receipts[i].IdempotencyKey == key {
			return t.receipts[i].Seq, nil
		}
	}
	seq, found, err := t.idx.LastSeq(t.ns, key)
	if err != nil {
		return 0, fmt.Errorf("read last receipt of key: %w: %w", ledger.ErrIO, err)
	}
	if !found {
		return 0, fmt.Errorf("read last receipt of key: key %q has no receipt", key)
	}
	return seq, nil
}

// Append stores a linked receipt and its tree hashes.
func (t *writeTx) Append(ctx context.Context, r *chain.Receipt, hashes []tlog.Hash) error {
	if r.Seq != t.head.Seq+1 || r.PrevHash != t.head.Hash {
		return fmt.Errorf("append receipt %d: not linked to the head %d", r.Seq, t.head.Seq)
	}
	res, err := t.stmt(ctx, stInsert).ExecContext(ctx, t.ref.args(
		r.Seq, r.Kind, r.IdempotencyKey, r.KeyGenerated, r.ExecutionID, r.Attempt, r.Tool,
		r.Effect, r.Idempotent, r.InputHash, r.Outcome, r.ExternalRef, r.Result, r.ErrorCode,
		r.ErrorMessage, r.Retryable, r.LeaseExpiresAt, r.RefSeq, r.Actor, r.Note, r.RecordedAt,
		r.PrevHash[:], r.Hash[:])...)
	if err != nil && strings.Contains(err.Error(), headMissingAbort) {
		// the head row was deleted outside ledgerd: nothing is appended
		// (never a chain started again): damaged storage
		return &lostHead{fmt.Sprintf("append receipt %d: the head row is missing (removed outside ledgerd); nothing is written: "+
			"check the chain with `ledgerctl verify`, then recompute the head with `ledgerctl rebuild-index`", r.Seq)}
	}
	if err != nil {
		return fmt.Errorf("append receipt %d: %w", r.Seq, classify(err))
	}
	if err := t.addLeaf(r.Seq, hashes); err != nil {
		return err
	}
	// The leaf's hashes in one row keyed by the receipt's rowid.
	rid, err := res.LastInsertId()
	if err != nil {
		return fmt.Errorf("append receipt %d: %w", r.Seq, err)
	}
	if t.rids == nil {
		t.rids = map[uint64]int64{}
	}
	t.rids[r.Seq] = rid
	if _, err := t.stmt(ctx, stTreeRow).ExecContext(ctx, rid, leafRow(hashes)); err != nil {
		return fmt.Errorf("store tree hashes of receipt %d: %w", r.Seq, classify(err))
	}
	if !r.Open.Empty() {
		if err := t.putOpening(ctx, rid, r.Open); err != nil {
			return fmt.Errorf("receipt %d: %w", r.Seq, err)
		}
	}
	t.head = ledger.Head{Seq: r.Seq, Hash: r.Hash}
	t.appended++
	switch r.Kind {
	case chain.KindCommit, chain.KindResolve, chain.KindReconcile, chain.KindApproval:
		t.ended = append(t.ended, r.IdempotencyKey)
	case chain.KindPolicy:
		t.policySeq = r.Seq
	}
	c := *r
	c.Open = nil // kept receipts are in the chain form (SPEC §14)
	t.receipts = append(t.receipts, &c)
	if r.Kind != chain.KindReplay { // decisions read reserves and outcomes, never replays
		t.markReceipt(r)
	}
	return nil
}

// PutKey inserts or replaces a key record. The token hash of a reserve
// appended in this batch is stored beside the receipt; the record itself
// goes to the key index after COMMIT.
func (t *writeTx) PutKey(ctx context.Context, k *ledger.KeyRecord) error {
	if k.TokenHash != "" && k.ReserveSeq > t.base {
		rid, ok := t.rids[k.ReserveSeq] // keyed by the reserve's row, appended in this batch
		if !ok {
			return fmt.Errorf("write reservation token: receipt %d was not appended in this batch", k.ReserveSeq)
		}
		if _, err := t.stmt(ctx, stToken).ExecContext(ctx, rid, []byte(k.TokenHash)); err != nil {
			return fmt.Errorf("write reservation token: %w", classify(err))
		}
	}
	t.markKey(k)
	t.putKeys = append(t.putKeys, k.Key)
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

// leafRow is the value of a leaf's row in ns_tree: its stored hashes,
// concatenated in order.
func leafRow(hs []tlog.Hash) []byte {
	b := make([]byte, 0, len(hs)*len(tlog.Hash{}))
	for _, h := range hs {
		b = append(b, h[:]...)
	}
	return b
}
