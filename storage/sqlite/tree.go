package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
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
func (db *chainWriter) treeMax() int {
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
	read  *sql.Stmt // bound to the batch transaction on first use
	cache treeCache
	added map[int64]tlog.Hash
}

// ReadHashes reads stored tree hashes from the batch, the writer's cache
// and the ns_tree table.
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

// addLeaf takes the stored hashes of leaf seq-1, computed by the domain
// and stored with its receipt, into the batch's tree.
func (t *writeTx) addLeaf(seq uint64, hs []tlog.Hash) error {
	n := tlog.LeafIndex(seq)
	base := sumdb.StoredHashIndex(0, n)
	if want := sumdb.StoredHashIndex(0, n+1) - base; int64(len(hs)) != want {
		return fmt.Errorf("tree leaf %d: %d stored hashes, want %d", n, len(hs), want)
	}
	for i := range hs {
		t.addTreeHash(base+int64(i), hs[i])
	}
	return nil
}

// commitTree merges a committed batch's tree hashes into the writer's
// cache; past its bound, the cache keeps only the frontier of the tree of
// t.head.Seq leaves.
func (db *chainWriter) commitTree(t *writeTx) {
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
func (db *chainWriter) initTree(ctx context.Context, head ledger.Head, repair bool) error {
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
func (db *chainWriter) checkTree(ctx context.Context, head ledger.Head) (int64, error) {
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
	if err := db.w.QueryRowContext(ctx, sqlTreeHash, args...).Scan(&b); err != nil {
		return 0, fmt.Errorf("tree: %w", classify(err))
	}
	b, err = treeHashIn(b, off, x)
	if err == nil {
		stored, err = chain.HashFromBytes(b)
	}
	if err != nil {
		return 0, fmt.Errorf("tree: %w", err)
	}
	if err := db.w.QueryRowContext(ctx, sqlHashAt, db.args(size)...).Scan(hashScanner{&last}); err != nil {
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

func (db *chainWriter) backfillTree(ctx context.Context, from int64, to uint64) error {
	start := time.Now()
	db.logger.Info("building the Merkle tree of existing receipts", "from_leaf", from, "receipts", to)
	for n := from; uint64(n) < to; {
		tx, err := db.w.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("tree back-fill: %w", classify(err))
		}
		t := &writeTx{tx: tx, stmts: db.stmts, ref: db.chainRef}
		t.tree.cache = db.tree
		rows, err := tx.QueryContext(ctx, sqlReceiptHashes, db.args(n, backfillChunk)...)
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
			if err == nil {
				_, err = tx.ExecContext(ctx, sqlTreeRowBySeq, db.id, batch[i].Seq, leafRow(hs))
			}
			if err != nil {
				_ = tx.Rollback()
				return fmt.Errorf("tree back-fill: %w", err)
			}
			n++
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
	var n int64
	err := q.QueryRowContext(ctx, sqlTreeSize, ref.args()...).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("tree size: %w", classify(err))
	}
	return n, nil
}

// dropTree removes the chain's stored tree hashes, for rebuild-index to
// build them again, in one transaction that lifts the append-only trigger
// only meanwhile.
func (db *chainWriter) dropTree(ctx context.Context) error {
	tx, err := db.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("tree: %w", classify(err))
	}
	defer func() { _ = tx.Rollback() }()
	var trigger string
	if err := tx.QueryRowContext(ctx, `SELECT sql FROM sqlite_schema WHERE type = 'trigger' AND name = 'ns_tree_no_delete'`).Scan(&trigger); err != nil {
		return fmt.Errorf("tree: %w", classify(err))
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{{`DROP TRIGGER ns_tree_no_delete`, nil},
		{`DELETE FROM ns_tree WHERE rid IN (SELECT rowid FROM ns_receipts WHERE ns = ?1)`, db.args()}, {trigger, nil}} {
		if _, err := tx.ExecContext(ctx, q.sql, q.args...); err != nil {
			return fmt.Errorf("tree: %w", classify(err))
		}
	}
	return classify(tx.Commit())
}
