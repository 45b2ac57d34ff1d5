package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mattn/go-sqlite3"

	ledgerschema "github.com/effect-ledger/effect-ledger"
	"github.com/effect-ledger/effect-ledger/chain"
)

// Options configure Open. The zero value is usable.
type Options struct {
	// Now is the clock; it defaults to time.Now. Read once per batch.
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// ReadConns is the size of the read-only pool (default 4).
	ReadConns int
	// MaxBatch bounds how many queued writes share one transaction
	// (default 256).
	MaxBatch int
	// BusyTimeout is how long SQLite waits for a lock held by another
	// process (default 5s).
	BusyTimeout time.Duration
	// CacheKeys bounds the writer's in-memory key index (default 50,000;
	// negative disables it).
	CacheKeys int
}

// DB is an open ledger. Writes go through one writer goroutine that owns
// the chain head; reads use a separate read-only connection pool.
type DB struct {
	*Reader // mode=ro pool for queries

	now    func() time.Time
	logger *slog.Logger

	w *sql.DB // one connection, BEGIN IMMEDIATE

	head atomic.Pointer[Head] // durable head, updated after each COMMIT

	mu       sync.RWMutex // guards closed and sends on ops
	closed   bool
	ops      chan *writeOp
	maxBatch int
	done     chan struct{} // closed when the writer has exited

	lastWriteErr atomic.Pointer[error] // nil after a successful batch

	stmts *writeStmts // owned by the writer goroutine
	cache *keyCache   // owned by the writer goroutine

	lock *lockFile // held while the DB is open: one writer per file

	// beforeCommit, set only by tests before any write, can fail a batch
	// just before its COMMIT.
	beforeCommit func() error
}

// dsn returns a SQLite URI for path with the given mode and the
// per-connection settings every connection needs. Pragmas go in the DSN
// because database/sql opens connections on its own.
func (o *Options) defaults() {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ReadConns <= 0 {
		o.ReadConns = 4
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 256
	}
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = 5 * time.Second
	}
	if o.CacheKeys == 0 {
		o.CacheKeys = 50_000
	}
}

func dsn(path, mode string, busy time.Duration, writer bool) string {
	q := url.Values{}
	q.Set("mode", mode)
	if mode != "ro" {
		// Read-only connections must not try to change the journal mode:
		// on a copy made by VACUUM INTO (rollback journal) that is a write.
		// They find WAL from the file header when the file uses it.
		q.Set("_journal_mode", "WAL")
	}
	q.Set("_synchronous", "FULL")
	q.Set("_busy_timeout", fmt.Sprint(busy.Milliseconds()))
	q.Set("_foreign_keys", "1")
	if writer {
		q.Set("_txlock", "immediate")
		// The writer's decisions and index updates touch random pages of
		// five b-trees (hash, prev_hash, key, execution, keys): keep them
		// in memory rather than re-reading them for every batch.
		q.Set("_cache_size", "-65536") // 64 MiB
	}
	p := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	return "file:" + p + "?" + q.Encode()
}

// Open opens the ledger at path, creating it with the schema if the file
// does not exist, and starts the writer.
func Open(ctx context.Context, path string, opts Options) (*DB, error) {
	if path == "" {
		return nil, errors.New("open ledger: empty database path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	opts.defaults()
	if fi, err := os.Stat(abs); err == nil && fi.IsDir() {
		return nil, fmt.Errorf("open ledger: %s is a directory, not a database file", abs)
	}
	lock, err := acquireLock(abs)
	if err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	db := &DB{lock: lock, now: opts.Now, logger: opts.Logger, maxBatch: opts.MaxBatch,
		ops: make(chan *writeOp, 4*opts.MaxBatch), done: make(chan struct{}), cache: newKeyCache(opts.CacheKeys)}

	ok := false
	defer func() {
		if !ok {
			_ = lock.release()
		}
	}()
	if db.w, err = sql.Open("sqlite3", dsn(abs, "rwc", opts.BusyTimeout, true)); err != nil {
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	db.w.SetMaxOpenConns(1)
	db.w.SetMaxIdleConns(1)
	db.w.SetConnMaxLifetime(0)
	db.w.SetConnMaxIdleTime(0)
	if err := db.init(ctx, abs); err != nil {
		_ = db.w.Close()
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	if db.stmts, err = prepareWrite(ctx, db.w); err != nil {
		_ = db.w.Close()
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	if db.Reader, err = openReader(ctx, abs, opts); err != nil {
		_ = db.w.Close()
		return nil, err
	}
	go db.writer()
	ok = true
	return db, nil
}

// init checks the connection settings, applies or checks the schema and
// loads the chain head.
func (db *DB) init(ctx context.Context, abs string) error {
	var version string
	if err := db.w.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&version); err != nil {
		return classify(err)
	}
	var mode string
	if err := db.w.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		return classify(err)
	}
	if mode != "wal" {
		return fmt.Errorf("journal_mode is %q, want wal", mode)
	}
	if err := db.migrate(ctx, abs); err != nil {
		return err
	}
	var h Head
	var hash []byte
	err := db.w.QueryRowContext(ctx, sqlHead).Scan(&h.Seq, &hash)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return fmt.Errorf("load head: %w", classify(err))
	default:
		if h.Hash, err = chain.HashFromBytes(hash); err != nil {
			return fmt.Errorf("load head: %w", err)
		}
	}
	db.head.Store(&h)
	db.logger.Info("ledger opened", "path", abs, "sqlite_version", version,
		"head_seq", h.Seq, "head_hash", h.Hash.String())
	headSeq.Set(float64(h.Seq))
	return nil
}

// migrate applies the schema to an empty file, and refuses a file with an
// unknown schema version or that belongs to something else.
func (db *DB) migrate(ctx context.Context, abs string) error {
	tx, err := db.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: %w", classify(err))
	}
	defer func() { _ = tx.Rollback() }()
	var version, tables int
	if err := tx.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&version); err != nil {
		return fmt.Errorf("migrate: %w", classify(err))
	}
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema`).Scan(&tables); err != nil {
		return fmt.Errorf("migrate: %w", classify(err))
	}
	switch {
	case version == ledgerschema.Version:
		return nil
	case version == 0 && tables == 0:
		if _, err := tx.ExecContext(ctx, ledgerschema.SQL); err != nil {
			return fmt.Errorf("migrate: %w", classify(err))
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migrate: %w", classify(err))
		}
		db.logger.Info("created ledger database", "path", abs, "schema_version", ledgerschema.Version)
		return nil
	case version == 0:
		return ErrNotLedger
	default:
		return fmt.Errorf("%w: file has %d, this build knows %d", ErrSchemaVersion, version, ledgerschema.Version)
	}
}

// Close stops accepting writes, lets the writer finish what is queued,
// checkpoints the WAL and closes both connection pools.
func (db *DB) Close() error {
	db.mu.Lock()
	if !db.closed {
		db.closed = true
		close(db.ops)
	}
	db.mu.Unlock()
	<-db.done
	// Readers go first: the last connection to close checkpoints the WAL
	// into the main file, and only the writer can, so that a cleanly
	// stopped ledger is one self-contained file.
	rerr := db.r.Close()
	for _, st := range []*sql.Stmt{db.stmts.key, db.stmts.putKey, db.stmts.insert, db.stmts.receipt, db.stmts.maxAttempt} {
		_ = st.Close()
	}
	if _, err := db.w.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		db.logger.Warn("checkpoint on close", "err", err)
	}
	return errors.Join(rerr, db.w.Close(), db.lock.release())
}

// Head returns the durable head of the chain.
func (db *DB) Head() Head { return *db.head.Load() }

// classify maps SQLite failures that mean "cannot write now" onto the
// ErrUnavailable family, using the driver's error codes.
func classify(err error) error {
	var se sqlite3.Error
	if !errors.As(err, &se) {
		return err
	}
	switch se.Code {
	case sqlite3.ErrBusy, sqlite3.ErrLocked:
		return fmt.Errorf("%w: %w", ErrBusy, err)
	case sqlite3.ErrReadonly:
		return fmt.Errorf("%w: %w", ErrReadOnly, err)
	case sqlite3.ErrFull:
		return fmt.Errorf("%w: %w", ErrDiskFull, err)
	case sqlite3.ErrIoErr, sqlite3.ErrCantOpen, sqlite3.ErrProtocol:
		return fmt.Errorf("%w: %w", ErrIO, err)
	}
	return err
}

// sqlReadyProbe rewrites the schema stamp with its own value: a durable
// write that changes nothing, to see whether the disk takes writes again.
var sqlReadyProbe = fmt.Sprintf("PRAGMA user_version = %d", ledgerschema.Version)

func msDuration(ms uint64) time.Duration { return time.Duration(ms) * time.Millisecond }
