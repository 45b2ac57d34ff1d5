package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// HashReader reads the stored tree hashes through the read pool (never
// the writer). A hash that is not stored yet is an error.
func (rd *Reader) HashReader(ctx context.Context) sumdb.HashReader {
	return sumdb.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(idx))
		for i, x := range idx {
			var b []byte
			args, off := rd.treeLoc(x)
			err := rd.r.QueryRowContext(ctx, sqlTreeHash, args...).Scan(&b)
			if errors.Is(err, sql.ErrNoRows) {
				return nil, fmt.Errorf("tree hash %d is not stored", x)
			}
			if err != nil {
				return nil, fmt.Errorf("read tree hash %d: %w", x, classify(err))
			}
			if b, err = treeHashIn(b, off, x); err != nil {
				return nil, err
			}
			if len(b) != len(out[i]) {
				return nil, fmt.Errorf("tree hash %d has %d bytes", x, len(b))
			}
			copy(out[i][:], b)
		}
		return out, nil
	})
}

// TreeSize returns the number of leaves whose hashes are stored.
func (rd *Reader) TreeSize(ctx context.Context) (int64, error) {
	return storedTreeSize(ctx, rd.r, rd.chainRef)
}

func (rd *Reader) scanCheckpoint(row *sql.Row) (*tlog.Signed, error) {
	var c tlog.Signed
	var root []byte
	err := row.Scan(&c.Size, &root, &c.Note, &c.SignedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", classify(err))
	}
	if len(root) != len(c.Root) {
		return nil, fmt.Errorf("checkpoint %d root has %d bytes", c.Size, len(root))
	}
	copy(c.Root[:], root)
	return &c, nil
}

// CheckpointCovering returns the largest stored checkpoint of size at
// least n, or nil if none.
func (rd *Reader) CheckpointCovering(ctx context.Context, n int64) (*tlog.Signed, error) {
	return rd.scanCheckpoint(rd.r.QueryRowContext(ctx, sqlCheckpointCover, rd.args(n)...))
}

// FirstCheckpointCovering returns the smallest stored checkpoint of
// size at least n, or nil if none.
func (rd *Reader) FirstCheckpointCovering(ctx context.Context, n int64) (*tlog.Signed, error) {
	return rd.scanCheckpoint(rd.r.QueryRowContext(ctx, sqlCheckpointFirst, rd.args(n)...))
}

// LatestCheckpoint returns the largest stored checkpoint, or nil if none.
func (rd *Reader) LatestCheckpoint(ctx context.Context) (*tlog.Signed, error) {
	return rd.scanCheckpoint(rd.r.QueryRowContext(ctx, sqlLatestCheckpoint, rd.args()...))
}

// CheckpointAt returns the stored checkpoint of size n, or nil if none.
func (rd *Reader) CheckpointAt(ctx context.Context, n int64) (*tlog.Signed, error) {
	return rd.scanCheckpoint(rd.r.QueryRowContext(ctx, sqlCheckpointAt, rd.args(n)...))
}

// PutCheckpoint stores a signed checkpoint in the batch; SQLite's trigger
// refuses a size that is not larger than every stored one, checked here
// first so that the refusal is ErrStaleCheckpoint.
func (t *writeTx) PutCheckpoint(ctx context.Context, c *tlog.Signed) error {
	var last int64
	if err := t.tx.QueryRowContext(ctx, sqlMaxCheckpoint, t.ref.args()...).Scan(&last); err != nil {
		return fmt.Errorf("store checkpoint: %w", classify(err))
	}
	if c.Size <= last {
		return fmt.Errorf("%w: size %d, stored %d", ledger.ErrStaleCheckpoint, c.Size, last)
	}
	if _, err := t.tx.ExecContext(ctx, sqlInsertCheckpoint, t.ref.args(c.Size, c.Root[:], c.Note, t.now)...); err != nil {
		return fmt.Errorf("store checkpoint %d: %w", c.Size, classify(err))
	}
	c.SignedAt = t.now
	return nil
}

// hashBytes scans a 32-byte BLOB.
type hashBytes [32]byte

func (h *hashBytes) Scan(v any) error {
	b, ok := v.([]byte)
	if !ok || len(b) != len(h) {
		return fmt.Errorf("hash is not 32 bytes")
	}
	copy(h[:], b)
	return nil
}
