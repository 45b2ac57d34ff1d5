// Package ledgertest opens a real ledger for tests: the domain service
// (ledger.New) over the SQLite driver on a file, with the default
// namespace at hand and a settable clock (see testkit, which
// holds the clock, the epoch T0 and the requests). The SQLite driver only
// stores; this helper is where tests, tools' tests and examples' tests
// put the two together.
package ledgertest

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// Quiet is a logger that discards everything.
var Quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// DB is a SQLite ledger: the domain service over the SQLite driver, with
// the default namespace embedded (db.Reserve is the default namespace's).
type DB struct {
	*ledger.Namespace                // the default namespace
	Ledger            *ledger.Ledger // the service, for other namespaces and its own methods
	Store             *sqlite.Store
	Reader            *sqlite.Reader // the default file's read pool
	Clock             *testkit.Clock // the clock the ledger reads; nil when WithNow set another
}

// Option sets up the ledger Open opens.
type Option func(*setup)

type setup struct {
	path  string
	store sqlite.Options
	cfg   ledger.Config
	now   func() time.Time
}

// WithPath opens the ledger at path (creating it if missing) instead of
// a new file in the test's temp dir.
func WithPath(path string) Option { return func(s *setup) { s.path = path } }

// WithStore sets the SQLite driver's options. Their Now, if set, is the
// clock the driver and the domain read (as WithNow); their Logger, if
// unset, is Quiet.
func WithStore(opts sqlite.Options) Option { return func(s *setup) { s.store = opts } }

// Inline makes the default namespace of a new file keep its payloads
// inline (SPEC §14; new ledgers are committed by default): for the tests
// that write or edit the chain's own values.
func Inline() Option { return func(s *setup) { s.store.Payloads = ledger.PayloadsInline } }

// WithConfig sets the domain's settings. Their Now, if set, is the clock
// both read (as WithNow); their Logger, if unset, is the driver's.
func WithConfig(cfg ledger.Config) Option { return func(s *setup) { s.cfg = cfg } }

// WithNow sets the clock the driver and the domain read (time.Now for
// tests where leases end or batches linger in real time) in place of a
// testkit.Clock at T0.
func WithNow(now func() time.Time) Option { return func(s *setup) { s.now = now } }

// Open opens a ledger for tb (by default a new file in tb's temp dir, on
// a testkit.Clock stopped at T0, with no logs), fails tb on error and
// closes the ledger when the test ends.
func Open(tb testing.TB, opts ...Option) *DB {
	tb.Helper()
	db, err := TryOpen(tb, opts...)
	require.NoError(tb, err)
	return db
}

// TryOpen is Open for tests of opening: it returns the error, of
// sqlite.OpenStore or ledger.Ledger.Default, instead of failing tb.
func TryOpen(tb testing.TB, opts ...Option) (*DB, error) {
	tb.Helper()
	var s setup
	for _, o := range opts {
		o(&s)
	}
	if s.path == "" {
		s.path = filepath.Join(tb.TempDir(), "ledger.db")
	}
	if s.now == nil && s.store.Now != nil {
		s.now = s.store.Now
	}
	if s.now == nil && s.cfg.Now != nil {
		s.now = s.cfg.Now
	}
	var clock *testkit.Clock
	if s.now == nil {
		clock = testkit.NewClock()
		s.now = clock.Now
	}
	if s.store.Now == nil {
		s.store.Now = s.now
	}
	if s.store.Logger == nil {
		s.store.Logger = Quiet
	}
	if s.cfg.Now == nil {
		s.cfg.Now = s.now
	}
	if s.cfg.Logger == nil {
		s.cfg.Logger = s.store.Logger
	}
	st, err := sqlite.OpenStore(context.Background(), s.path, s.store, false)
	if err != nil {
		return nil, err
	}
	l := ledger.New(st, s.cfg)
	n, err := l.Default(context.Background())
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	tb.Cleanup(func() { _ = l.Close() })
	return &DB{Namespace: n, Ledger: l, Store: st, Reader: st.Main(), Clock: clock}, nil
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
