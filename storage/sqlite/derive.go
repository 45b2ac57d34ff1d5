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
	receipts, err := queryReceipts(ctx, tx, sqlKeyReceipts, rd.args(key)...)
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
// at path from the namespace's receipts, with its recorded head made to
// match its tail again, and then opens it normally to prove the repair
// (a namespace that still has a file of its own, FILE.ns/ns-NS.db, of a
// ledger made before version 6: in that file).
// ledgerd must not be serving the ledger (the file's lock). It returns
// the head the index now reflects.
func RebuildIndex(ctx context.Context, path, ns string, opts Options) (ledger.Head, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return ledger.Head{}, err
	}
	opts.defaults()
	if _, own, err := NamespaceFile(ctx, abs, ns); err != nil {
		return ledger.Head{}, fmt.Errorf("namespace %s: %w", ns, err)
	} else if !own && ns != ledger.DefaultNamespace {
		return rebuildShared(ctx, abs, ns, opts)
	}
	file := namespacePath(abs, ns)
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
	check, err := openChainWriter(ctx, file, ns, opts)
	if err != nil {
		return head, fmt.Errorf("after rebuilding: %w", err)
	}
	return head, check.Close()
}

// rebuildFile rebuilds the index of the namespace file at file and
// compacts the index.
func rebuildFile(ctx context.Context, ix *ledgerIndex, file, ns string, opts Options) (ledger.Head, error) {
	c, err := openChainWriter(ctx, file, ns, opts)
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
// tail was removed outside ledgerd), for RebuildIndex. The tree and token
// rows of receipts removed outside ledgerd go too: a receipt appended
// later may take the row id of one.
func (db *chainWriter) repairHead(ctx context.Context) error {
	tail, err := readTail(ctx, db.w, db.chainRef)
	if err != nil {
		return fmt.Errorf("repair head: %w", err)
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{sqlRepairHead, db.args(tail.Seq, tail.Hash[:])},
		{`DELETE FROM ns_tree WHERE NOT EXISTS (SELECT 1 FROM ns_receipts AS r WHERE r.rowid = ns_tree.rid)`, nil},
		{`DELETE FROM ns_tokens WHERE NOT EXISTS (SELECT 1 FROM ns_receipts AS r WHERE r.rowid = ns_tokens.rid)`, nil},
	} {
		if _, err := db.w.ExecContext(ctx, q.sql, q.args...); err != nil {
			return fmt.Errorf("repair head: %w", classify(err))
		}
	}
	return nil
}

// rebuildShared is RebuildIndex for a namespace other than default: the
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
	m, err := openChainWriter(ctx, abs, ledger.DefaultNamespace, opts)
	if err != nil {
		return ledger.Head{}, err
	}
	defer func() { _ = m.Close() }()
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
