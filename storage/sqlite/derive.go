package sqlite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/keyindex"
)

// sqlKeyReceipts reads one key's receipts: a scan of the file (it has no
// index by key; its writes only append).
const sqlKeyReceipts = `SELECT ` + receiptColumns + ` FROM receipts WHERE idempotency_key = ? ORDER BY seq`

// sqlRepairHead sets the recorded head.
const sqlRepairHead = `INSERT OR REPLACE INTO head (id, seq, hash) VALUES (1, ?, ?)`

// GetKey returns a key's state and receipts, derived from a scan of the
// receipts. Errors: *Error with ECodeUnknownKey or ECodeInvalidKey.
func (rd *Reader) GetKey(ctx context.Context, key string) (*ledger.KeyView, error) {
	if err := ledger.CheckKeyPath(key); err != nil {
		return nil, err
	}
	tx, err := rd.r.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("get key: %w", classify(err))
	}
	defer func() { _ = tx.Rollback() }()
	receipts, err := queryReceipts(ctx, tx, rd.q.keyReceipts, rd.args(key)...)
	if err != nil {
		return nil, fmt.Errorf("get key: %w", err)
	}
	ttl, err := rd.KeyTTL(ctx)
	if err != nil {
		return nil, fmt.Errorf("get key: %w", err)
	}
	k, found, err := deriveKey(ctx, rd, key, receipts, ttl)
	if err != nil {
		return nil, fmt.Errorf("get key: %w", err)
	}
	if !found {
		return nil, ledger.Errorf(ledger.ECodeUnknownKey, "no such idempotency key")
	}
	return keyView(&k, receipts, uint64(rd.now().UnixMilli())), nil
}

// RebuildIndex rebuilds namespace ns's part of the key index of the ledger
// at path from the namespace's receipts (its own file, FILE.ns/ns-NS.db;
// FILE itself for default), with the file's recorded head made to match
// its tail again, and then opens the file normally to prove the repair.
// ledgerd must not be serving the ledger (the file's lock). It returns
// the head the index now reflects.
func RebuildIndex(ctx context.Context, path, ns string, opts Options) (ledger.Head, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return ledger.Head{}, err
	}
	opts.defaults()
	if own, err := HasOwnFile(ctx, abs, ns); err != nil {
		return ledger.Head{}, fmt.Errorf("namespace %s: %w", ns, err)
	} else if !own && ns != ledger.DefaultNamespace {
		return rebuildShared(ctx, abs, ns, opts)
	}
	file := NamespacePath(abs, ns)
	if _, err := os.Stat(file); err != nil {
		return ledger.Head{}, fmt.Errorf("namespace %s: %w", ns, err)
	}
	for _, f := range []string{abs, file} { // refused files get nothing beside them
		if err := precheck(f); err != nil {
			return ledger.Head{}, fmt.Errorf("open ledger %s: %w", f, err)
		}
	}
	opts.rebuildIndex = true // a bulk load: one compaction at the end
	ix, err := openIndex(abs, opts)
	if err != nil {
		return ledger.Head{}, err
	}
	defer func() { _ = ix.close() }()
	opts.index, opts.Repair = ix.Index, true
	head, err := rebuildFile(ctx, ix, file, ns, opts)
	if errors.Is(err, keyindex.ErrCorrupt) {
		// Corruption met on the way (a table the open did not read):
		// Repair moves the index aside, and the rebuild starts again on a
		// new one. The other namespaces are rebuilt as they next open.
		if rerr := ix.Repair(); rerr != nil {
			return head, fmt.Errorf("%w (and reopening it failed: %w)", err, rerr)
		}
		head, err = rebuildFile(ctx, ix, file, ns, opts)
	}
	if err != nil {
		return head, err
	}
	opts.Repair, opts.rebuildIndex = false, false
	check, err := openFileChain(ctx, file, ns, opts)
	if err != nil {
		return head, fmt.Errorf("after rebuilding: %w", err)
	}
	return head, check.Close()
}

// rebuildFile rebuilds the index of the namespace file at file and
// compacts the index.
func rebuildFile(ctx context.Context, ix *ledgerIndex, file, ns string, opts Options) (ledger.Head, error) {
	c, err := openFileChain(ctx, file, ns, opts)
	if err != nil {
		return ledger.Head{}, err
	}
	head := *c.head.Load()
	if err := c.Close(); err != nil {
		return head, err
	}
	start := time.Now()
	if err := ix.Compact(ctx); err != nil {
		return head, err
	}
	opts.Logger.Info("key index compacted", "duration", time.Since(start))
	return head, nil
}

// repairHead makes the recorded head match the receipts' tail (after a
// tail was removed outside ledgerd), for RebuildIndex.
func (db *fileChain) repairHead(ctx context.Context) error {
	tail, err := readTail(ctx, db.w, db.chainRef)
	if err != nil {
		return fmt.Errorf("repair head: %w", err)
	}
	if _, err := db.w.ExecContext(ctx, db.q.repairHead, db.args(tail.Seq, tail.Hash[:])...); err != nil {
		return fmt.Errorf("repair head: %w", classify(err))
	}
	return nil
}

// rebuildShared is RebuildIndex for namespace ns of the shared tables: the
// ledger file opens as ledgerd opens it (its own chain checked), then the
// namespace opens repairing, and once more normally to prove the repair.
func rebuildShared(ctx context.Context, abs, ns string, opts Options) (ledger.Head, error) {
	if err := precheck(abs); err != nil {
		return ledger.Head{}, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	iopts := opts
	iopts.rebuildIndex = true // a bulk load: one compaction at the end
	ix, err := openIndex(abs, iopts)
	if err != nil {
		return ledger.Head{}, err
	}
	defer func() { _ = ix.close() }()
	opts.index = ix.Index
	m, err := openFileChain(ctx, abs, ledger.DefaultNamespace, opts)
	if err != nil {
		return ledger.Head{}, err
	}
	defer func() { _ = m.Close() }()
	if err := ensureRegistry(ctx, m.w); err != nil {
		return ledger.Head{}, err
	}
	if err := ensureShared(ctx, m.w); err != nil {
		return ledger.Head{}, err
	}
	if m.nsStmts, err = prepareWrite(ctx, m.w, sharedSQL); err != nil {
		return ledger.Head{}, err
	}
	id, _, err := namespaceID(ctx, m.r, ns)
	if err != nil {
		return ledger.Head{}, err
	}
	s := &Store{path: abs, opts: opts, main: m, reader: m.Reader}
	s.opts.Repair, s.opts.rebuildIndex = true, true
	c, err := s.openShared(ctx, ns, id)
	if err != nil {
		return ledger.Head{}, err
	}
	head := *c.head.Load()
	_ = c.Close()
	s.opts.Repair, s.opts.rebuildIndex = false, false
	if c, err = s.openShared(ctx, ns, id); err != nil {
		return head, fmt.Errorf("after rebuilding: %w", err)
	}
	_ = c.Close()
	start := time.Now()
	if err := ix.Compact(ctx); err != nil {
		return head, err
	}
	opts.Logger.Info("key index compacted", "duration", time.Since(start))
	return head, nil
}
