package sqlite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// Compacted is what Compact gave back: the bytes of the ledger file, its
// WAL and its key index before and after.
type Compacted struct {
	Before, After int64
}

// Compact rewrites the ledger file at path without its free pages (a
// VACUUM, after the WAL is checkpointed and truncated) and compacts its
// key index: the bytes a prune freed (SPEC §16) go back to the file
// system. It opens the ledger for writing, so ledgerd must be stopped (the
// open fails while it holds the file).
func Compact(ctx context.Context, path string, opts Options) (*Compacted, error) {
	abs, err := ledgerPath(path)
	if err != nil {
		return nil, err
	}
	res := &Compacted{Before: ledgerBytes(abs)}
	s, err := OpenStore(ctx, abs, opts, false)
	if err != nil {
		return nil, err
	}
	m := s.main
	m.mu.Lock()
	for _, q := range []string{`PRAGMA wal_checkpoint(TRUNCATE)`, `VACUUM`, `PRAGMA wal_checkpoint(TRUNCATE)`} {
		if _, err = m.w.ExecContext(ctx, q); err != nil {
			err = fmt.Errorf("compact %s: %s: %w", abs, q, classify(err))
			break
		}
	}
	m.mu.Unlock()
	if err == nil && m.idx != nil {
		err = m.idx.Compact(ctx)
	}
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	res.After = ledgerBytes(abs)
	return res, nil
}

// ledgerBytes is the size of the ledger file, its WAL and its key index.
func ledgerBytes(abs string) int64 {
	var n int64
	for _, p := range []string{abs, abs + "-wal"} {
		if fi, err := os.Stat(p); err == nil {
			n += fi.Size()
		}
	}
	_ = filepath.WalkDir(IndexPath(abs), func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
