//go:build modernc || !cgo

package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"modernc.org/sqlite"

	"github.com/effect-ledger/effect-ledger/chain"
)

// The pure-Go driver (modernc.org/sqlite, SQLite translated to Go), built
// with the tag modernc or without cgo: the macOS, Windows and static Linux
// release binaries. It takes the driver name "sqlite3" and the same DSNs
// as the cgo default (driver_cgo.go); what differs is here: the page
// cache size, the writer's pragmas, the backup and the verifier's scans.

func init() {
	sql.Register("sqlite3", newDriver(nil))
	sql.Register(writerDriver, newDriver(writerPragmas))
}

func writerDriverName() string { return writerDriver }

// newDriver returns a driver that runs pragmas, and the DSN's _cache_size
// (which modernc does not read), on every new connection.
func newDriver(pragmas []string) *sqlite.Driver {
	d := &sqlite.Driver{}
	d.RegisterConnectionHook(func(c sqlite.ExecQuerierContext, dsn string) error {
		all := pragmas
		if _, query, ok := strings.Cut(dsn, "?"); ok {
			q, err := url.ParseQuery(query)
			if err != nil {
				return fmt.Errorf("dsn: %w", err)
			}
			if v := q.Get("_cache_size"); v != "" {
				n, err := strconv.Atoi(v)
				if err != nil {
					return fmt.Errorf("dsn: _cache_size: %w", err)
				}
				all = append([]string{fmt.Sprintf("PRAGMA cache_size = %d", n)}, all...)
			}
			if q.Get("_secure_delete") == "on" { // which modernc does not read either
				all = append([]string{"PRAGMA secure_delete = ON"}, all...)
			}
		}
		for _, p := range all {
			if _, err := c.ExecContext(context.Background(), p, nil); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		}
		return nil
	})
	return d
}

// sqliteCode returns the primary result code of an SQLite error in err.
func sqliteCode(err error) (int, bool) {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return 0, false
	}
	return se.Code() & 0xff, true
}

// withBackup starts SQLite's online backup of src's database into the
// database dst names (modernc opens its own connection to it) and calls
// fn with it.
func withBackup(src, _ *sql.Conn, dst string, fn func(pageCopier) error) error {
	return src.Raw(func(s any) error {
		c, ok := s.(interface {
			NewBackup(string) (*sqlite.Backup, error)
		})
		if !ok {
			return errors.New("not an SQLite connection")
		}
		b, err := c.NewBackup(dst)
		if err != nil {
			return fmt.Errorf("start: %w", err)
		}
		return fn(backup{b})
	})
}

// backup adapts modernc's Backup to pageCopier.
type backup struct{ *sqlite.Backup }

func (b backup) Step(n int) (bool, error) {
	more, err := b.Backup.Step(int32(n))
	if code, ok := sqliteCode(err); ok && (code == codeBusy || code == codeLocked) {
		return false, nil // as the cgo driver: try again
	}
	return err == nil && !more, err
}

// Finish ends the backup on modernc's own connection to the copy, the only
// one that knows the copy's pages now carry the source's WAL flag: it
// leaves WAL there (copyDatabase then finds the rollback journal it wants).
func (b backup) Finish() error {
	c, err := b.Backup.Commit()
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	ex, ok := c.(driver.ExecerContext)
	if !ok {
		return errors.New("not an SQLite connection")
	}
	if _, err := ex.ExecContext(context.Background(), `PRAGMA journal_mode=DELETE`, nil); err != nil {
		return fmt.Errorf("journal mode: %w", err)
	}
	return nil
}

// cScan is the verifier's scan (cscan.go in the cgo build) on a read-only
// connection of its own, read through database/sql row by row.
type cScan struct {
	db    *sql.DB
	conn  *sql.Conn
	query string
	args  []any
}

// openCScan opens path read-only for query (its columns are
// receiptColumns, or keyScanColumns) with args bound in order. cacheKiB
// sizes the connection's page cache.
func openCScan(path string, busy time.Duration, cacheKiB int, query string, args ...uint64) (*cScan, error) {
	db, err := sql.Open("sqlite3", dsn(path, "ro", busy, 0))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	s := &cScan{db: db, query: query}
	if s.conn, err = db.Conn(context.Background()); err != nil {
		s.close()
		return nil, fmt.Errorf("open %s: %w", path, classify(err))
	}
	pragma := fmt.Sprintf("PRAGMA cache_size = -%d; PRAGMA query_only = 1;", cacheKiB)
	if _, err := s.conn.ExecContext(context.Background(), pragma); err != nil {
		s.close()
		return nil, fmt.Errorf("scan pragmas: %w", classify(err))
	}
	for _, a := range args {
		s.args = append(s.args, int64(a))
	}
	return s, nil
}

func (s *cScan) close() {
	if s.conn != nil {
		_ = s.conn.Close()
	}
	_ = s.db.Close()
}

// each calls fn for every receipt of the scan. Each row is read as stored
// (scanReceipt, which marks what does not fit the receipt format), which
// is what the cgo scan's reread returns for such a row, so reread is not
// needed. fn must not retain the pointer.
func (s *cScan) each(ctx context.Context, _ func(seq uint64, r *chain.Receipt) error, fn func(*chain.Receipt) error) error {
	rows, err := s.conn.QueryContext(ctx, s.query, s.args...)
	if err != nil {
		return classify(err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		r, err := scanReceipt(rows)
		if err != nil {
			return classify(err)
		}
		if err := fn(&r); err != nil {
			return err
		}
	}
	return classify(rows.Err())
}
