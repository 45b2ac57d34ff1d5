package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// The reads of a namespace's Merkle tree and signed checkpoints.

// TreeSize is the number of leaves whose hashes are stored.
func (c *Chain) TreeSize(ctx context.Context) (int64, error) {
	var count int64
	if err := c.s.pool.QueryRow(ctx, sqlTreeCount, c.ns).Scan(&count); err != nil {
		return 0, fmt.Errorf("tree size: %w", classify(err))
	}
	return tlog.SizeFromStoredCount(count)
}

// querier is a pool, a connection or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// readHashes reads the tree hashes idx of ns; a missing one is an error.
func readHashes(ctx context.Context, q querier, ns string, idx []int64) (map[int64]tlog.Hash, error) {
	rows, err := q.Query(ctx, sqlTreeHashes, ns, idx)
	if err != nil {
		return nil, fmt.Errorf("read tree hashes: %w", classify(err))
	}
	defer rows.Close()
	got := make(map[int64]tlog.Hash, len(idx))
	for rows.Next() {
		var x int64
		var b []byte
		if err := rows.Scan(&x, &b); err != nil {
			return nil, fmt.Errorf("read tree hashes: %w", classify(err))
		}
		if len(b) != len(tlog.Hash{}) {
			return nil, fmt.Errorf("tree hash %d has %d bytes", x, len(b))
		}
		got[x] = tlog.Hash(b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read tree hashes: %w", classify(err))
	}
	for _, x := range idx {
		if _, ok := got[x]; !ok {
			return nil, fmt.Errorf("tree hash %d is not stored", x)
		}
	}
	return got, nil
}

// HashReader reads stored tree hashes through the pool (and the cache of
// committed ones); a missing one is an error.
func (c *Chain) HashReader(ctx context.Context) sumdb.HashReader {
	return sumdb.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		tc := c.s.treeCache(c.ns)
		out := make([]tlog.Hash, len(idx))
		var missing []int64
		for i, x := range idx {
			if h, ok := tc.get(x); ok {
				out[i] = h
			} else {
				missing = append(missing, x)
			}
		}
		if len(missing) == 0 {
			return out, nil
		}
		got, err := readHashes(ctx, c.s.pool, c.ns, missing)
		if err != nil {
			return nil, err
		}
		tc.fill(out, idx, got)
		return out, nil
	})
}

// ReceiptHashes returns the chain hashes of receipts from+1 … from+n, or
// fewer when the chain ends sooner: those of deleted receipts (SPEC §16)
// from their kept tiles, the rest from receipts. The receipts are read
// first: a receipt deleted after that read has its hash kept by then (the
// deletion keeps it in the same transaction), and kept tiles only grow.
func (c *Chain) ReceiptHashes(ctx context.Context, from uint64, n int) ([]chain.Hash, error) {
	rows, err := c.s.pool.Query(ctx, sqlReceiptHashes, c.ns, int64(from), n)
	if err != nil {
		return nil, fmt.Errorf("receipt hashes: %w", classify(err))
	}
	defer rows.Close()
	var seqs []uint64
	var stored []chain.Hash
	for rows.Next() {
		var seq int64
		var b []byte
		if err := rows.Scan(&seq, &b); err != nil {
			return nil, fmt.Errorf("receipt hashes: %w", classify(err))
		}
		h, err := chain.HashFromBytes(b)
		if err != nil {
			return nil, fmt.Errorf("receipt hashes: receipt %d: %w", seq, err)
		}
		seqs, stored = append(seqs, uint64(seq)), append(stored, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("receipt hashes: %w", classify(err))
	}
	rows.Close()
	// Receipts from+1 … gap are deleted, their hashes kept.
	gap := from
	switch {
	case len(seqs) > 0:
		gap = min(seqs[0]-1, from+uint64(n))
	case c.s.version >= pruneSchema && n > 0:
		m, err := c.Pruned(ctx)
		if err != nil {
			return nil, fmt.Errorf("receipt hashes: %w", err)
		}
		gap = max(from, min(m.Kept, from+uint64(n)))
	}
	out := make([]chain.Hash, 0, n)
	if gap > from {
		kept, err := keptHashes(ctx, c.s.pool, c.s.version, c.ns, from, gap)
		if err != nil {
			return nil, fmt.Errorf("receipt hashes: %w", classify(err))
		}
		out = append(out, kept...)
	}
	for i, seq := range seqs {
		if len(out) == n {
			break
		}
		if want := from + uint64(len(out)) + 1; seq != want {
			return nil, fmt.Errorf("receipt hashes: receipt %d follows %d", seq, want-1)
		}
		out = append(out, stored[i])
	}
	return out, nil
}

func (c *Chain) checkpoint(ctx context.Context, query string, args ...any) (*tlog.Signed, error) {
	var s tlog.Signed
	var root []byte
	var signedAt int64
	err := c.s.pool.QueryRow(ctx, query, args...).Scan(&s.Size, &root, &s.Note, &signedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", classify(err))
	}
	if len(root) != len(s.Root) {
		return nil, fmt.Errorf("checkpoint %d root has %d bytes", s.Size, len(root))
	}
	copy(s.Root[:], root)
	s.SignedAt = uint64(signedAt)
	return &s, nil
}

// LatestCheckpoint returns the largest stored checkpoint, or nil if none.
func (c *Chain) LatestCheckpoint(ctx context.Context) (*tlog.Signed, error) {
	return c.checkpoint(ctx, sqlLatestCheckpoint, c.ns)
}

// CheckpointAt returns the stored checkpoint of size n, or nil if none.
func (c *Chain) CheckpointAt(ctx context.Context, n int64) (*tlog.Signed, error) {
	return c.checkpoint(ctx, sqlCheckpointAt, c.ns, n)
}

// CheckpointCovering returns the largest stored checkpoint of size at
// least n, or nil if none.
func (c *Chain) CheckpointCovering(ctx context.Context, n int64) (*tlog.Signed, error) {
	return c.checkpoint(ctx, sqlCheckpointCover, c.ns, n)
}

// FirstCheckpointCovering returns the smallest stored checkpoint of size
// at least n, or nil if none.
func (c *Chain) FirstCheckpointCovering(ctx context.Context, n int64) (*tlog.Signed, error) {
	return c.checkpoint(ctx, sqlCheckpointFirst, c.ns, n)
}
