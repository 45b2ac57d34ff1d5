package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Reader reads a ledger through a read-only connection pool. It never
// takes a write lock, so it is safe to use while ledgerd runs, and on a
// copy of the file. A Store holds one per open file.
type Reader struct {
	path     string
	r        *sql.DB
	now      func() time.Time
	busy     time.Duration // the busy timeout of the scans' own connections
	chainRef               // the chain's rows in the file (tables.go)
	ns       string        // the namespace, for messages; "" for default
	borrowed bool          // r is another Reader's, which closes it
	cleanup  func()        // removes a migrated copy, on Close
}

// ledgerPath is the absolute path of the ledger file named by path.
func ledgerPath(path string) (string, error) {
	if path == "" {
		return "", errors.New("open ledger: empty database path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("open ledger: %w", err)
	}
	return abs, nil
}

// OpenReader opens the ledger at path read-only; the file must exist. A
// file of an older schema is read through a migrated copy in a temporary
// directory (migratedCopy), so that it is left exactly as it is.
func OpenReader(ctx context.Context, path string, opts Options) (*Reader, error) {
	abs, err := ledgerPath(path)
	if err != nil {
		return nil, err
	}
	opts.defaults()
	rd, err := openReader(ctx, abs, opts)
	if err != nil {
		return nil, err
	}
	var version int
	if err := rd.r.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&version); err != nil {
		_ = rd.Close()
		return nil, fmt.Errorf("open ledger %s: %w", abs, classify(err))
	}
	switch {
	case version == SchemaVersion:
		return rd, nil
	case version == 0:
		_ = rd.Close()
		return nil, fmt.Errorf("open ledger %s: %w", abs, ledger.ErrNotLedger)
	case version < SchemaVersion:
		_ = rd.Close()
		return migratedCopy(ctx, abs, opts)
	default:
		_ = rd.Close()
		return nil, fmt.Errorf("open ledger %s: %w: file has %d, this build knows %d", abs, ledger.ErrSchemaVersion, version, SchemaVersion)
	}
}

func openReader(ctx context.Context, abs string, opts Options) (*Reader, error) {
	r, err := sql.Open("sqlite3", dsn(abs, "ro", opts.BusyTimeout, 0))
	if err != nil {
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	r.SetMaxOpenConns(opts.ReadConns)
	r.SetMaxIdleConns(opts.ReadConns)
	if err := r.PingContext(ctx); err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("open ledger %s: read pool: %w", abs, classify(err))
	}
	return &Reader{path: abs, r: r, now: opts.Now, busy: opts.BusyTimeout}, nil
}

// Close closes the read pool.
func (rd *Reader) Close() error {
	if rd.borrowed {
		return nil // the ledger file's pool, which its own Reader closes
	}
	err := rd.r.Close()
	if rd.cleanup != nil {
		rd.cleanup()
	}
	return err
}

// Path returns the absolute path of the database file.
func (rd *Reader) Path() string { return rd.path }

// ReadHead returns the latest receipt's seq and hash as stored in the file.
func (rd *Reader) ReadHead(ctx context.Context) (ledger.Head, error) {
	var h ledger.Head
	var hash []byte
	err := rd.r.QueryRowContext(ctx, sqlHead, rd.args()...).Scan(&h.Seq, &hash)
	if errors.Is(err, sql.ErrNoRows) {
		return h, nil
	}
	if err != nil {
		return h, fmt.Errorf("read head: %w", classify(err))
	}
	if h.Hash, err = chain.HashFromBytes(hash); err != nil {
		return h, fmt.Errorf("read head: %w", err)
	}
	return h, nil
}

// KeyTTL reads the namespace's key_ttl_ms (SPEC §12).
func (rd *Reader) KeyTTL(ctx context.Context) (uint64, error) {
	var ttl uint64
	err := rd.r.QueryRowContext(ctx, sqlKeyTTL, rd.args()...).Scan(&ttl)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read key ttl: %w", classify(err))
	}
	return ttl, nil
}

// ListReceipts returns up to f.Limit receipts with seq > f.After that match
// the filters, oldest first, and the seq to pass as After for the next
// page, or nil when no matching receipt follows. Errors: *Error with
// ECodeInvalidRequest.
func (rd *Reader) ListReceipts(ctx context.Context, f ledger.ReceiptFilter) ([]chain.Receipt, *uint64, error) {
	if err := f.Check(); err != nil {
		return nil, nil, err
	}
	var where []string
	args := []any{f.After}
	for _, c := range []struct{ col, v string }{
		{"idempotency_key", f.Key}, {"execution_id", f.ExecutionID}, {"tool", f.Tool}, {"kind", f.Kind},
	} {
		if c.v != "" {
			where = append(where, fmt.Sprintf(" AND %s = ?%d", c.col, len(args)+2))
			args = append(args, c.v)
		}
	}
	q := `SELECT ` + receiptColumns + ` FROM ns_receipts WHERE ns = ?1 AND seq > ?2` + strings.Join(where, "") +
		fmt.Sprintf(` ORDER BY seq LIMIT ?%d`, len(args)+2)
	args = append(args, f.Limit+1)
	rs, err := queryReceipts(ctx, rd.r, q, rd.args(args...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("list receipts: %w", err)
	}
	rs, next := page(rs, f.Limit)
	return rs, next, nil
}

// page cuts rs, read with one receipt more than limit, to a page, and
// returns the seq to pass as After for the next page (nil: none follows).
func page(rs []chain.Receipt, limit int) ([]chain.Receipt, *uint64) {
	if len(rs) <= limit {
		return rs, nil
	}
	rs = rs[:limit]
	next := rs[len(rs)-1].Seq
	return rs, &next
}

// GetReceipt returns the receipt at seq. Errors: *Error with
// ECodeUnknownReceipt.
func (rd *Reader) GetReceipt(ctx context.Context, seq uint64) (*chain.Receipt, error) {
	r, err := scanReceipt(rd.r.QueryRowContext(ctx, sqlReceiptBySeq, rd.args(seq)...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ledger.Errorf(ledger.ECodeUnknownReceipt, "no receipt with seq %d", seq)
	}
	if err != nil {
		return nil, fmt.Errorf("get receipt: %w", classify(err))
	}
	return &r, nil
}

// querier is *sql.DB or *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func queryReceipts(ctx context.Context, q querier, query string, args ...any) ([]chain.Receipt, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, classify(err)
	}
	defer func() { _ = rows.Close() }()
	var out []chain.Receipt
	for rows.Next() {
		r, err := scanReceipt(rows)
		if err != nil {
			return nil, classify(err)
		}
		out = append(out, r)
	}
	return out, classify(rows.Err())
}

// flags names the reader's chain the way ledgerctl does (dbFlags).
func (rd *Reader) flags() string {
	if rd.ns == "" {
		return dbFlags(rd.path, ledger.DefaultNamespace)
	}
	return dbFlags(rd.path, rd.ns)
}
