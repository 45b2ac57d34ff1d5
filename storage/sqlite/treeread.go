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

// ErrNoTree means the file has no Merkle tree yet: it was written by a
// build before the verifiable log and has not been opened by ledgerd since.
var ErrNoTree = errors.New("the ledger has no Merkle tree yet (start ledgerd on it once to build it)")

const (
	sqlLatestCheckpoint = `SELECT size, root, note, signed_at FROM checkpoints ORDER BY size DESC LIMIT 1`
	sqlCheckpointAt     = `SELECT size, root, note, signed_at FROM checkpoints WHERE size = ?`
	sqlCheckpointCover  = `SELECT size, root, note, signed_at FROM checkpoints WHERE size >= ? ORDER BY size DESC LIMIT 1`
	sqlInsertCheckpoint = `INSERT INTO checkpoints (size, root, note, signed_at) VALUES (?, ?, ?, ?)`
	sqlMaxCheckpoint    = `SELECT coalesce(max(size), 0) FROM checkpoints`
)

// treeErr returns ErrNoTree for a failed query on a file that has no tree
// tables, and the classified error otherwise.
func (rd *Reader) treeErr(err error) error {
	var n int
	if qerr := rd.r.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE name = 'tree_hashes'`).Scan(&n); qerr == nil && n == 0 {
		return ErrNoTree
	}
	return classify(err)
}

// HashReader reads the stored tree hashes through the read pool (never
// the writer). A hash that is not stored yet is an error.
func (rd *Reader) HashReader(ctx context.Context) sumdb.HashReader {
	return sumdb.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(idx))
		for i, x := range idx {
			var b []byte
			args, off := rd.treeLoc(x)
			err := rd.r.QueryRowContext(ctx, rd.q.treeHash, args...).Scan(&b)
			if errors.Is(err, sql.ErrNoRows) {
				return nil, fmt.Errorf("tree hash %d is not stored", x)
			}
			if err != nil {
				return nil, fmt.Errorf("read tree hash %d: %w", x, rd.treeErr(err))
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
	if rd.q.shared {
		return storedTreeSize(ctx, rd.r, rd.chainRef)
	}
	var count int64
	if err := rd.r.QueryRowContext(ctx, rd.q.treeCount, rd.args()...).Scan(&count); err != nil {
		return 0, fmt.Errorf("tree size: %w", rd.treeErr(err))
	}
	return tlog.SizeFromStoredCount(count)
}

func (rd *Reader) scanCheckpoint(row *sql.Row) (*tlog.Signed, error) {
	var c tlog.Signed
	var root []byte
	err := row.Scan(&c.Size, &root, &c.Note, &c.SignedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", rd.treeErr(err))
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
	return rd.scanCheckpoint(rd.r.QueryRowContext(ctx, rd.q.checkpointCover, rd.args(n)...))
}

// LatestCheckpoint returns the largest stored checkpoint, or nil if none.
func (rd *Reader) LatestCheckpoint(ctx context.Context) (*tlog.Signed, error) {
	return rd.scanCheckpoint(rd.r.QueryRowContext(ctx, rd.q.latestCheckpoint, rd.args()...))
}

// CheckpointAt returns the stored checkpoint of size n, or nil if none.
func (rd *Reader) CheckpointAt(ctx context.Context, n int64) (*tlog.Signed, error) {
	return rd.scanCheckpoint(rd.r.QueryRowContext(ctx, rd.q.checkpointAt, rd.args(n)...))
}

// PutCheckpoint stores a signed checkpoint in the batch; SQLite's trigger
// refuses a size that is not larger than every stored one, checked here
// first so that the refusal is ErrStaleCheckpoint.
func (t *writeTx) PutCheckpoint(ctx context.Context, c *tlog.Signed) error {
	var last int64
	if err := t.tx.QueryRowContext(ctx, t.ref.q.maxCheckpoint, t.ref.args()...).Scan(&last); err != nil {
		return fmt.Errorf("store checkpoint: %w", classify(err))
	}
	if c.Size <= last {
		return fmt.Errorf("%w: size %d, stored %d", ledger.ErrStaleCheckpoint, c.Size, last)
	}
	if _, err := t.tx.ExecContext(ctx, t.ref.q.insertCheckpoint, t.ref.args(c.Size, c.Root[:], c.Note, t.now)...); err != nil {
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
