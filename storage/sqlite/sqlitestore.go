package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// The SQLite driver keeps one file per namespace: the ledger file named by
// --db is the namespace default and holds the registry of namespaces and
// the API tokens; namespace NAME lives in <ledger file>.ns/ns-NAME.db (the
// prefix keeps the names "." and ".." ordinary file names). Each file has
// its own single writer, so namespaces commit in parallel, and each is an
// ordinary ledger file that `sqlite3` and `ledgerctl verify --db` read as
// it is.

// sqlNamespacesSchema is the registry, in the default namespace's file.
const sqlNamespacesSchema = `CREATE TABLE IF NOT EXISTS namespaces (
	name       TEXT    PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64 AND name NOT GLOB '*[^a-z0-9._-]*'),
	created_at INTEGER NOT NULL -- unix ms
) WITHOUT ROWID`

// NamespacePath returns the file of namespace ns of the ledger at path.
func NamespacePath(path, ns string) string {
	if ns == ledger.DefaultNamespace {
		return path
	}
	return filepath.Join(path+".ns", "ns-"+ns+".db")
}

// Store is the SQLite storage driver (a ledger.Store).
type Store struct {
	path     string // absolute
	opts     Options
	readOnly bool

	mu      sync.Mutex // guards chains, closed
	chains  map[string]ledger.Chain
	closed  bool
	onEnded func(ns string, keys []string)

	main   *fileChain // nil when read-only
	reader *Reader    // the default file's read pool
	tokens *sqliteTokens
}

var _ ledger.Store = (*Store)(nil)

// OpenStore opens the ledger at path for writing (creating it if
// missing), or only for reading with readOnly (the file must exist).
func OpenStore(ctx context.Context, path string, opts Options, readOnly bool) (*Store, error) {
	if path == "" {
		return nil, errors.New("open ledger: empty database path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	opts.defaults()
	s := &Store{path: abs, opts: opts, readOnly: readOnly, chains: map[string]ledger.Chain{}}
	if readOnly {
		rd, err := OpenReader(ctx, abs, opts)
		if err != nil {
			return nil, err
		}
		s.reader = rd
		s.chains[ledger.DefaultNamespace] = readOnlyChain{rd}
		s.tokens = &sqliteTokens{rd: rd}
		return s, nil
	}
	c, err := openFileChain(ctx, abs, ledger.DefaultNamespace, opts)
	if err != nil {
		return nil, err
	}
	if _, err := c.w.ExecContext(ctx, sqlNamespacesSchema); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("open ledger %s: namespaces: %w", abs, classify(err))
	}
	if err := addTokenNamespaces(ctx, c.w); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	c.onEnded = s.ended
	s.main, s.reader = c, c.Reader
	s.chains[ledger.DefaultNamespace] = c
	s.tokens = &sqliteTokens{rd: c.Reader, w: c.w}
	return s, nil
}

// Path is the absolute path of the default namespace's file.
func (s *Store) Path() string { return s.path }

// Describe names the ledger file.
func (s *Store) Describe() string { return s.path }

// Main returns the default namespace's file chain's reader.
func (s *Store) Main() *Reader { return s.reader }

func (s *Store) ended(ns string, keys []string) {
	if f := s.onEnded; f != nil {
		f(ns, keys)
	}
}

// OnEnded registers the wake-up callback.
func (s *Store) OnEnded(fn func(ns string, keys []string)) { s.onEnded = fn }

// registered reports whether ns is in the registry.
func (s *Store) registered(ctx context.Context, ns string) (bool, error) {
	if ns == ledger.DefaultNamespace {
		return true, nil
	}
	var n int
	err := s.reader.r.QueryRowContext(ctx, `SELECT count(*) FROM namespaces WHERE name = ?`, ns).Scan(&n)
	if err != nil {
		if s.readOnly && !s.hasRegistry(ctx) {
			return false, nil // a file made before namespaces
		}
		return false, fmt.Errorf("namespaces: %w", classify(err))
	}
	return n == 1, nil
}

func (s *Store) hasRegistry(ctx context.Context) bool {
	var n int
	err := s.reader.r.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE name = 'namespaces'`).Scan(&n)
	return err == nil && n == 1
}

// Chain opens namespace ns's file on first use.
func (s *Store) Chain(ctx context.Context, ns string) (ledger.Chain, error) {
	s.mu.Lock()
	c, ok := s.chains[ns]
	closed := s.closed
	s.mu.Unlock()
	if ok {
		return c, nil
	}
	if closed {
		return nil, ledger.ErrClosed
	}
	if !ledger.ValidNamespace(ns) {
		return nil, ledger.ErrUnknownNamespace
	}
	found, err := s.registered(ctx, ns)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, ledger.ErrUnknownNamespace
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.chains[ns]; ok {
		return c, nil
	}
	if s.closed {
		return nil, ledger.ErrClosed
	}
	path := NamespacePath(s.path, ns)
	if s.readOnly {
		rd, err := OpenReader(ctx, path, s.opts)
		if err != nil {
			return nil, fmt.Errorf("namespace %s: %w", ns, err)
		}
		c = readOnlyChain{rd}
	} else {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			s.opts.Logger.Warn("the file of a registered namespace is missing; starting it empty", "namespace", ns, "path", path)
		}
		opts := s.opts
		opts.KeyTTL = 0 // the file has its own; a missing one starts as the v1 behaviour
		fc, err := openFileChain(ctx, path, ns, opts)
		if err != nil {
			return nil, fmt.Errorf("namespace %s: %w", ns, err)
		}
		fc.onEnded = s.ended
		c = fc
	}
	s.chains[ns] = c
	return c, nil
}

// CreateNamespace registers ns and creates its file, which stores keyTTL.
func (s *Store) CreateNamespace(ctx context.Context, ns string, keyTTL uint64) error {
	if s.readOnly {
		return ledger.ErrOpenedReadOnly
	}
	if ns == ledger.DefaultNamespace {
		return ledger.ErrNamespaceExists
	}
	opts := s.opts
	opts.KeyTTL = keyTTL
	if err := createNamespace(ctx, s.main.w, s.path, ns, opts); err != nil {
		return err
	}
	_, err := s.Chain(ctx, ns)
	return err
}

// CreateNamespace registers namespace ns in the ledger at path and
// creates its file, whose keys expire after keyTTL ms (0: never). It may
// run beside a ledgerd serving the file (it writes only the registry and a
// new file).
func CreateNamespace(ctx context.Context, path, ns string, keyTTL uint64) error {
	if err := ledger.CheckNamespace(ns); err != nil {
		return err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if ns == ledger.DefaultNamespace {
		return ledger.ErrNamespaceExists
	}
	rd, err := OpenReader(ctx, abs, Options{}) // checks the schema version
	if err != nil {
		return err
	}
	_ = rd.Close()
	w, err := sql.Open("sqlite3", dsn(abs, "rw", 5*time.Second, DefaultCacheMiB))
	if err != nil {
		return fmt.Errorf("open %s: %w", abs, err)
	}
	defer func() { _ = w.Close() }()
	w.SetMaxOpenConns(1)
	if _, err := w.ExecContext(ctx, sqlNamespacesSchema); err != nil {
		return fmt.Errorf("namespaces: %w", classify(err))
	}
	opts := Options{KeyTTL: keyTTL}
	opts.defaults()
	return createNamespace(ctx, w, abs, ns, opts)
}

// createNamespace inserts the registry row (the namespace exists from
// then on), then creates and initialises the namespace's file with
// opts.KeyTTL.
func createNamespace(ctx context.Context, w *sql.DB, abs, ns string, opts Options) error {
	var n int
	if err := w.QueryRowContext(ctx, `SELECT count(*) FROM namespaces WHERE name = ?`, ns).Scan(&n); err != nil {
		return fmt.Errorf("create namespace: %w", classify(err))
	}
	if n == 1 {
		return ledger.ErrNamespaceExists
	}
	path := NamespacePath(abs, ns)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	res, err := w.ExecContext(ctx, `INSERT OR IGNORE INTO namespaces (name, created_at) VALUES (?, ?)`, ns, time.Now().UnixMilli())
	if err != nil {
		return fmt.Errorf("create namespace: %w", classify(err))
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return ledger.ErrNamespaceExists
	}
	fc, err := openFileChain(ctx, path, ns, opts)
	if err != nil {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	return fc.Close()
}

// Namespaces lists the registry, default included.
func (s *Store) Namespaces(ctx context.Context) ([]string, error) {
	out := []string{ledger.DefaultNamespace}
	if s.readOnly && !s.hasRegistry(ctx) {
		return out, nil
	}
	rows, err := s.reader.r.QueryContext(ctx, `SELECT name FROM namespaces ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, fmt.Errorf("namespaces: %w", err)
		}
		out = append(out, name)
	}
	return out, rows.Err()
}

// Tokens is the tokens table of the default file.
func (s *Store) Tokens() ledger.TokenStore { return s.tokens }

// Ready reports whether the default file can be written (Ledger.Ready
// probes through the queue; this is the driver's own check).
func (s *Store) Ready(ctx context.Context) error {
	if s.readOnly {
		return ledger.ErrOpenedReadOnly
	}
	return s.main.Update(ctx, func(context.Context, ledger.Tx) error { return nil })
}

// Close closes every file.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	for ns, c := range s.chains {
		if ns == ledger.DefaultNamespace {
			continue
		}
		errs = append(errs, c.(interface{ Close() error }).Close())
	}
	// the default file last: it holds the registry
	errs = append(errs, s.chains[ledger.DefaultNamespace].(interface{ Close() error }).Close())
	return errors.Join(errs...)
}

// WriterStats returns the default file's writer work so far.
func (s *Store) WriterStats() WriterStats {
	if s.main == nil {
		return WriterStats{}
	}
	return s.main.WriterStats()
}

// readOnlyChain is a file opened for reading: every Update fails.
type readOnlyChain struct{ *Reader }

func (readOnlyChain) Update(context.Context, func(context.Context, ledger.Tx) error) error {
	return ledger.ErrOpenedReadOnly
}

// Head reads the head from the file.
func (rd *Reader) Head(ctx context.Context) (ledger.Head, error) { return rd.ReadHead(ctx) }

// ReceiptHashes returns the chain hashes of receipts from+1 … from+n (fewer
// at the chain's end).
func (rd *Reader) ReceiptHashes(ctx context.Context, from uint64, n int) ([]chain.Hash, error) {
	rows, err := rd.r.QueryContext(ctx, sqlReceiptHashes, from, n)
	if err != nil {
		return nil, fmt.Errorf("read receipt hashes: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	out := make([]chain.Hash, 0, n)
	next := from + 1
	for rows.Next() {
		var seq uint64
		var h hashBytes
		if err := rows.Scan(&seq, &h); err != nil {
			return nil, fmt.Errorf("read receipt hashes: %w", err)
		}
		if seq != next {
			return nil, fmt.Errorf("read receipt hashes: receipt %d follows %d", seq, next-1)
		}
		next++
		out = append(out, chain.Hash(h))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read receipt hashes: %w", classify(err))
	}
	return out, nil
}

// DB is a SQLite ledger opened with Open: the domain service over the
// SQLite driver, with the default namespace at hand (what tests, tools
// and single-namespace programs use).
type DB struct {
	*ledger.Namespace // the default namespace
	*ledger.Ledger
	Store  *Store
	Reader *Reader // the default file's read pool
	main   *fileChain
}

// Open opens the ledger at path, creating it with the schema if the file
// does not exist, and starts the domain service over it. A file that is
// not an effect-ledger database, or has a newer schema, is refused before
// anything is written to it or created beside it.
func Open(ctx context.Context, path string, opts Options) (*DB, error) {
	s, err := OpenStore(ctx, path, opts, false)
	if err != nil {
		return nil, err
	}
	l := ledger.New(s, ledger.Config{Logger: s.opts.Logger, MaxBatch: s.opts.MaxBatch, MaxWaiters: s.opts.MaxWaiters, Now: s.opts.Now, Linger: s.opts.Linger})
	n, err := l.Default(ctx)
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	return &DB{Namespace: n, Ledger: l, Store: s, Reader: s.reader, main: s.main}, nil
}

// Head returns the durable head of the default namespace.
func (db *DB) Head() ledger.Head { return *db.main.head.Load() }

// Path returns the absolute path of the ledger file.
func (db *DB) Path() string { return db.Store.path }

// Close closes the service and the files.
func (db *DB) Close() error { return db.Ledger.Close() }

// WriterStats returns the default file's writer work so far.
func (db *DB) WriterStats() WriterStats { return db.main.WriterStats() }

// RebuildKeys recomputes the default file's derived state (see
// fileChain.RebuildKeys).
func (db *DB) RebuildKeys(ctx context.Context) (int64, error) { return db.main.RebuildKeys(ctx) }
