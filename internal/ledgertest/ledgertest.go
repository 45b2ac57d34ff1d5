// Package ledgertest opens a real ledger for tests: the domain service
// (ledger.New) over the SQLite driver on a file, with the default
// namespace at hand and a settable clock. The SQLite driver only stores;
// this helper is where tests, tools' tests and examples' tests put the
// two together.
package ledgertest

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// T0 is the test clock's start, the SPEC test vector's recorded_at.
var T0 = time.UnixMilli(1764475200000)

// Quiet is a logger that discards everything.
var Quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// Clock is a settable test clock, safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock stopped at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// DB is a SQLite ledger: the domain service over the SQLite driver, with
// the default namespace embedded.
type DB struct {
	*ledger.Namespace // the default namespace
	*ledger.Ledger
	Store  *sqlite.Store
	Reader *sqlite.Reader // the default file's read pool
}

// OpenPath opens the ledger at path (creating it if missing) with the
// driver options opts and starts the domain service over it with the
// same clock and logger and the domain's defaults. Its errors are
// sqlite.OpenStore's and ledger.Ledger.Default's.
func OpenPath(ctx context.Context, path string, opts sqlite.Options) (*DB, error) {
	return OpenConfig(ctx, path, opts, ledger.Config{})
}

// OpenConfig is OpenPath with the domain's settings cfg; cfg's Now and
// Logger default to opts'.
func OpenConfig(ctx context.Context, path string, opts sqlite.Options, cfg ledger.Config) (*DB, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = opts.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = opts.Logger
	}
	s, err := sqlite.OpenStore(ctx, path, opts, false)
	if err != nil {
		return nil, err
	}
	l := ledger.New(s, cfg)
	n, err := l.Default(ctx)
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	return &DB{Namespace: n, Ledger: l, Store: s, Reader: s.Main()}, nil
}

// Open opens a new ledger file in tb's temp dir with a Clock stopped at
// T0 and no logs, and closes it when the test ends.
func Open(tb testing.TB) (*DB, *Clock) {
	tb.Helper()
	clock := NewClock(T0)
	return MustOpen(tb, filepath.Join(tb.TempDir(), "ledger.db"), sqlite.Options{Now: clock.Now, Logger: Quiet}, ledger.Config{}), clock
}

// OpenReal opens a new ledger file in tb's temp dir with the domain's
// settings cfg, on the real clock unless cfg.Now is set, for tests where
// leases end or batches linger in real time; it closes the ledger when
// the test ends.
func OpenReal(tb testing.TB, cfg ledger.Config) *DB {
	tb.Helper()
	return MustOpen(tb, filepath.Join(tb.TempDir(), "ledger.db"), sqlite.Options{Now: cfg.Now, Logger: Quiet}, cfg)
}

// MustOpen is OpenConfig that fails tb on error and closes the ledger
// when the test ends.
func MustOpen(tb testing.TB, path string, opts sqlite.Options, cfg ledger.Config) *DB {
	tb.Helper()
	db, err := OpenConfig(context.Background(), path, opts, cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// Head returns the default namespace's durable head (the writer's, held
// in memory, so it never fails).
func (db *DB) Head() ledger.Head {
	h, err := db.Namespace.Reader().Head(context.Background())
	if err != nil {
		panic("ledgertest: the default namespace's head: " + err.Error())
	}
	return h
}

// Path returns the absolute path of the ledger file.
func (db *DB) Path() string { return db.Store.Path() }

// Close closes the service and the files.
func (db *DB) Close() error { return db.Ledger.Close() }

// WriterStats returns the default file's writer work so far.
func (db *DB) WriterStats() sqlite.WriterStats { return db.Store.WriterStats() }

// RebuildIndex rebuilds the default file's part of the key index (see
// sqlite.Store.RebuildIndex).
func (db *DB) RebuildIndex(ctx context.Context) error { return db.Store.RebuildIndex(ctx) }
