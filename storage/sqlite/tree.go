package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// sqlTreeSchema adds the verifiable log's tables (SPEC §9) to a ledger;
// it is applied at every open, so that a ledger made by an earlier build
// gains them (and its tree is then back-filled) without a schema version
// change that would lock older builds out.
//
// tree_hashes holds the RFC 6962 tree over the receipts' chain hashes in
// golang.org/x/mod/sumdb/tlog's stored-hash layout: the row idx is
// sumdb.StoredHashIndex(level, n). Leaf seq-1's hashes are written in the
// same transaction as receipt seq, so the tree always has exactly the
// chain's receipts. checkpoints holds each signed checkpoint, stored
// before it is served. Both are append-only. Each namespace is its own
// file, so neither table names a namespace.
const sqlTreeSchema = `
CREATE TABLE IF NOT EXISTS tree_hashes (
	idx  INTEGER PRIMARY KEY CHECK (idx >= 0),
	hash BLOB    NOT NULL CHECK (length(hash) = 32)
);
CREATE TABLE IF NOT EXISTS checkpoints (
	size      INTEGER PRIMARY KEY CHECK (size >= 1),
	root      BLOB    NOT NULL CHECK (length(root) = 32),
	note      TEXT    NOT NULL, -- the signed note, as served
	signed_at INTEGER NOT NULL  -- unix ms
);
CREATE TRIGGER IF NOT EXISTS tree_hashes_no_update BEFORE UPDATE ON tree_hashes
BEGIN SELECT RAISE(ABORT, 'tree hashes are append-only'); END;
CREATE TRIGGER IF NOT EXISTS tree_hashes_no_delete BEFORE DELETE ON tree_hashes
BEGIN SELECT RAISE(ABORT, 'tree hashes are append-only'); END;
CREATE TRIGGER IF NOT EXISTS checkpoints_no_update BEFORE UPDATE ON checkpoints
BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only'); END;
CREATE TRIGGER IF NOT EXISTS checkpoints_no_delete BEFORE DELETE ON checkpoints
BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only'); END;
CREATE TRIGGER IF NOT EXISTS checkpoints_grow BEFORE INSERT ON checkpoints
BEGIN
	SELECT RAISE(ABORT, 'a checkpoint must be larger than the last one')
	WHERE NEW.size <= (SELECT coalesce(max(size), 0) FROM checkpoints);
END;`

const (
	sqlTreeHash      = `SELECT hash FROM tree_hashes WHERE idx = ?`
	sqlTreeCount     = `SELECT coalesce(max(idx) + 1, 0) FROM tree_hashes`
	sqlReceiptHashes = `SELECT seq, hash FROM receipts WHERE seq > ? ORDER BY seq LIMIT ?`
	sqlHashAt        = `SELECT hash FROM receipts WHERE seq = ?`
)

// treeCacheMax bounds the writer's cache of tree hashes. The next leaf
// needs only the O(log n) roots of the complete subtrees to its left, all
// written recently or read once: when full, the cache keeps those roots
// (frontier) and nothing else.
const treeCacheMax = 4096

// sharedTreeCacheMax bounds it for a namespace of the shared tables, of
// which hundreds may be open: a few more than the roots a leaf needs.
const sharedTreeCacheMax = 128

// treeMax is the bound of the chain's tree cache.
func (db *fileChain) treeMax() int {
	if db.main != nil {
		return sharedTreeCacheMax
	}
	return treeCacheMax
}

// treeCache is the writer's copy of recently written or read tree hashes.
// Stored hashes never change, so a cached value is always right; only
// hashes of committed batches enter it.
type treeCache map[int64]tlog.Hash

// treeTx is the tree part of one write batch: the hashes it stored, which
// enter the writer's cache only after COMMIT.
type treeTx struct {
	read    *sql.Stmt // bound to the batch transaction on first use
	cache   treeCache
	added   map[int64]tlog.Hash
	from    int64       // stored-hash index of pending[0]
	pending []tlog.Hash // computed, stored by flushTree
}

// ReadHashes reads stored tree hashes from the batch, the writer's cache
// and the tree_hashes table.
func (t *writeTx) ReadHashes(ctx context.Context, idx []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	for i, x := range idx {
		if h, ok := t.tree.added[x]; ok {
			out[i] = h
			continue
		}
		if h, ok := t.tree.cache[x]; ok {
			out[i] = h
			continue
		}
		if t.tree.read == nil {
			t.tree.read = t.tx.StmtContext(ctx, t.stmts.treeRead)
		}
		var b []byte
		args, off := t.ref.treeLoc(x)
		if err := t.tree.read.QueryRowContext(ctx, args...).Scan(&b); err != nil {
			return nil, fmt.Errorf("read tree hash %d: %w", x, classify(err))
		}
		b, err := treeHashIn(b, off, x)
		if err != nil {
			return nil, err
		}
		if len(b) != len(out[i]) {
			return nil, fmt.Errorf("tree hash %d has %d bytes", x, len(b))
		}
		copy(out[i][:], b)
		t.addTreeHash(x, out[i])
	}
	return out, nil
}

func (t *writeTx) addTreeHash(idx int64, h tlog.Hash) {
	if t.tree.added == nil {
		t.tree.added = make(map[int64]tlog.Hash, 8)
	}
	t.tree.added[idx] = h
}

// addLeaf takes the stored hashes of leaf seq-1, computed by the domain;
// they are stored by flushTree before the batch commits. A leaf's stored
// hashes directly follow the previous leaf's, so a batch's are one run.
func (t *writeTx) addLeaf(seq uint64, hs []tlog.Hash) error {
	n := tlog.LeafIndex(seq)
	base := sumdb.StoredHashIndex(0, n)
	if want := sumdb.StoredHashIndex(0, n+1) - base; int64(len(hs)) != want {
		return fmt.Errorf("tree leaf %d: %d stored hashes, want %d", n, len(hs), want)
	}
	if t.ref.q.shared { // stored with the receipt (Append, backfillTree)
		for i := range hs {
			t.addTreeHash(base+int64(i), hs[i])
		}
		return nil
	}
	if len(t.tree.pending) == 0 {
		t.tree.from = base
	} else if base != t.tree.from+int64(len(t.tree.pending)) {
		return fmt.Errorf("tree leaf %d: stored hashes start at %d, want %d", n, base, t.tree.from+int64(len(t.tree.pending)))
	}
	for i := range hs {
		t.addTreeHash(base+int64(i), hs[i])
	}
	t.tree.pending = append(t.tree.pending, hs...)
	return nil
}

// treeInsertMax is 2^(len(writeStmts.treeInsert)-1): the most rows one
// tree INSERT writes.
const treeInsertMax = 1 << 7

// sqlInsertTreeHashes returns the INSERT of n rows.
func sqlInsertTreeHashes(n int) string {
	return `INSERT INTO tree_hashes (idx, hash) VALUES ` + strings.TrimSuffix(strings.Repeat(`(?, ?), `, n), `, `)
}

// flushTree stores the batch's tree hashes with multi-row INSERTs of
// 2^k rows (statements prepared at open), a few statements per batch
// instead of about two per receipt.
func (t *writeTx) flushTree(ctx context.Context) error {
	rows := t.tree.pending
	idx := t.tree.from
	args := make([]any, 0, 1+2*min(len(rows), treeInsertMax))
	for len(rows) > 0 {
		k := len(t.stmts.treeInsert) - 1
		for 1<<k > len(rows) {
			k--
		}
		args = args[:0]
		if t.ref.q.shared {
			args = append(args, t.ref.id)
		}
		for i := range 1 << k {
			args = append(args, idx+int64(i), rows[i][:])
		}
		if _, err := t.tx.StmtContext(ctx, t.stmts.treeInsert[k]).ExecContext(ctx, args...); err != nil {
			return fmt.Errorf("store tree hashes %d…: %w", idx, classify(err))
		}
		rows, idx = rows[1<<k:], idx+int64(1<<k)
	}
	t.tree.pending = t.tree.pending[:0]
	return nil
}

// commitTree merges a committed batch's tree hashes into the writer's
// cache; past its bound, the cache keeps only the frontier of the tree of
// t.head.Seq leaves.
func (db *fileChain) commitTree(t *writeTx) {
	if len(db.tree)+len(t.tree.added) <= db.treeMax() {
		for k, v := range t.tree.added {
			db.tree[k] = v
		}
		return
	}
	next := make(treeCache, db.treeMax())
	for _, x := range frontier(int64(t.head.Seq)) {
		if h, ok := t.tree.added[x]; ok {
			next[x] = h
		} else if h, ok := db.tree[x]; ok {
			next[x] = h
		}
	}
	db.tree = next
}

// frontier returns the stored-hash indexes of the roots of the complete
// subtrees of a tree of n leaves: all that the hashes of later leaves
// read (each level's left sibling is one of them, or a node stored
// after them).
func frontier(n int64) []int64 {
	var out []int64
	for level := 0; n>>level > 0; level++ {
		if (n>>level)&1 == 1 {
			out = append(out, sumdb.StoredHashIndex(level, (n>>level)-1))
		}
	}
	return out
}

// initTree creates the tree tables if needed, checks that the stored tree
// ends on a leaf no later than the chain and that its last leaf is the
// chain's last receipt, and back-fills the hashes of receipts that have
// none (a ledger made before the tree existed), in batches, before the
// writer starts.
func (db *fileChain) initTree(ctx context.Context, head ledger.Head, repair bool) error {
	db.tree = make(treeCache, db.treeMax())
	size, err := db.checkTree(ctx, head)
	if errors.Is(err, ledger.ErrDerivedState) && repair {
		// rebuild-index: the chain was cut or changed outside ledgerd; the
		// tree follows the chain as it is now. A checkpoint signed before
		// still shows the difference (the signer refuses to sign a tree
		// that is not its extension, and verify --checkpoint reports it).
		db.logger.Warn("the Merkle tree does not match the chain; rebuilding it", "err", err)
		if err := db.dropTree(ctx); err != nil {
			return err
		}
		size, err = 0, nil
	}
	if err != nil {
		return err
	}
	if uint64(size) == head.Seq {
		return nil
	}
	return db.backfillTree(ctx, size, head.Seq)
}

// checkTree returns the stored tree's size after checking that it is no
// larger than the chain and that its last leaf is the hash of the
// receipt at its size (both index lookups).
func (db *fileChain) checkTree(ctx context.Context, head ledger.Head) (int64, error) {
	size, err := storedTreeSize(ctx, db.w, db.chainRef)
	if err != nil {
		return 0, err
	}
	if uint64(size) > head.Seq {
		return 0, fmt.Errorf("%w: the Merkle tree has %d leaves but the chain ends at %d (receipts were removed outside ledgerd; "+
			"check the chain with `ledgerctl verify`, then run `ledgerctl rebuild-index`)", ledger.ErrDerivedState, size, head.Seq)
	}
	if size == 0 {
		return 0, nil
	}
	var stored, last chain.Hash
	x := sumdb.StoredHashIndex(0, size-1)
	args, off := db.treeLoc(x)
	var b []byte
	if err := db.w.QueryRowContext(ctx, db.q.treeHash, args...).Scan(&b); err != nil {
		return 0, fmt.Errorf("tree: %w", classify(err))
	}
	b, err = treeHashIn(b, off, x)
	if err == nil {
		stored, err = chain.HashFromBytes(b)
	}
	if err != nil {
		return 0, fmt.Errorf("tree: %w", err)
	}
	if err := db.w.QueryRowContext(ctx, db.q.hashAt, db.args(size)...).Scan(hashScanner{&last}); err != nil {
		return 0, fmt.Errorf("tree: %w", classify(err))
	}
	if tlog.LeafHash(last) != tlog.Hash(stored) {
		return 0, fmt.Errorf("%w: Merkle leaf %d is not the hash of receipt %d (the receipts were changed outside ledgerd; "+
			"check the chain with `ledgerctl verify`, then run `ledgerctl rebuild-index`)", ledger.ErrDerivedState, size-1, size)
	}
	return size, nil
}

// hashScanner scans a 32-byte BLOB into a chain.Hash.
type hashScanner struct{ h *chain.Hash }

func (s hashScanner) Scan(v any) error {
	b, ok := v.([]byte)
	if !ok {
		return fmt.Errorf("hash is a %T", v)
	}
	h, err := chain.HashFromBytes(b)
	*s.h = h
	return err
}

// backfillChunk is how many leaves one back-fill transaction adds (a
// variable for tests).
var backfillChunk = 10_000

func (db *fileChain) backfillTree(ctx context.Context, from int64, to uint64) error {
	start := time.Now()
	db.logger.Info("building the Merkle tree of existing receipts", "from_leaf", from, "receipts", to)
	for n := from; uint64(n) < to; {
		tx, err := db.w.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("tree back-fill: %w", classify(err))
		}
		t := &writeTx{tx: tx, stmts: db.stmts, ref: db.chainRef}
		t.tree.cache = db.tree
		rows, err := tx.QueryContext(ctx, db.q.receiptHashes, db.args(n, backfillChunk)...)
		if err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("tree back-fill: %w", classify(err))
		}
		var batch []chain.Receipt
		for rows.Next() {
			var r chain.Receipt
			if err := rows.Scan(&r.Seq, hashScanner{&r.Hash}); err != nil {
				_ = rows.Close()
				_ = tx.Rollback()
				return fmt.Errorf("tree back-fill: %w", err)
			}
			batch = append(batch, r)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("tree back-fill: %w", classify(err))
		}
		for i := range batch {
			if batch[i].Seq != uint64(n)+1 {
				_ = tx.Rollback()
				return fmt.Errorf("tree back-fill: receipt %d follows leaf %d", batch[i].Seq, n)
			}
			hs, err := ledger.LeafHashes(ctx, batch[i].Seq, batch[i].Hash, t.ReadHashes)
			if err == nil {
				err = t.addLeaf(batch[i].Seq, hs)
			}
			if err == nil && db.q.shared {
				_, err = tx.ExecContext(ctx, db.q.treeRowBySeq, db.id, batch[i].Seq, leafRow(hs))
			}
			if err != nil {
				_ = tx.Rollback()
				return fmt.Errorf("tree back-fill: %w", err)
			}
			n++
		}
		if err := t.flushTree(ctx); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("tree back-fill: %w", err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("tree back-fill: %w", classify(err))
		}
		db.commitTree(t)
		db.logger.Info("Merkle tree back-fill", "leaves", n, "of", to)
	}
	db.logger.Info("built the Merkle tree of existing receipts", "leaves", to, "duration", time.Since(start))
	return nil
}

// storedTreeSize is the number of leaves whose hashes are stored.
func storedTreeSize(ctx context.Context, q queryRower, ref chainRef) (int64, error) {
	var count int64
	err := q.QueryRowContext(ctx, ref.q.treeCount, ref.args()...).Scan(&count)
	if ref.q.shared { // the size in leaves
		if errors.Is(err, sql.ErrNoRows) {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("tree size: %w", classify(err))
		}
		return count, nil
	}
	if err != nil {
		return 0, fmt.Errorf("tree size: %w", classify(err))
	}
	n, err := tlog.SizeFromStoredCount(count)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ledger.ErrDerivedState, err)
	}
	return n, nil
}

// dropTree removes the chain's stored tree hashes, for rebuild-index to
// build them again: the default namespace drops its table and makes it
// again; a namespace of the shared tables deletes its rows, in one
// transaction that lifts the append-only trigger only meanwhile.
func (db *fileChain) dropTree(ctx context.Context) error {
	stmts := []string{`DROP TABLE tree_hashes`, sqlTreeSchema}
	if db.q.shared {
		stmts = []string{`DROP TRIGGER ns_tree_no_delete`,
			fmt.Sprintf(`DELETE FROM ns_tree WHERE rid IN (SELECT rowid FROM ns_receipts WHERE ns = %d)`, db.id), sqlSharedSchema}
	}
	tx, err := db.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("tree: %w", classify(err))
	}
	defer func() { _ = tx.Rollback() }()
	for _, q := range stmts {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("tree: %w", classify(err))
		}
	}
	return classify(tx.Commit())
}
