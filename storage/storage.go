// Package storage opens a ledger's storage driver from the --db value: a
// PostgreSQL URL (postgres:// or postgresql://) or a SQLite file path. It
// also opens the tokens and creates the namespaces of a database for
// either driver, so that the binaries never branch on the URL.
package storage

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// Options configures Open.
type Options struct {
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// ReadOnly opens for reading: every write fails with
	// ledger.ErrOpenedReadOnly (SQLite: the file must exist, and no lock
	// is taken, so it may run beside ledgerd).
	ReadOnly bool
	// KeyTTL is the key_ttl_ms (SPEC §12) of the default namespace when
	// Open creates the ledger; an existing ledger keeps its own.
	KeyTTL uint64
	// Payloads is the payload mode (SPEC §14) of the default namespace when
	// Open creates the ledger ("": committed); an existing ledger keeps
	// its own.
	Payloads ledger.PayloadMode
	// Now replaces the clock of decisions and reads (tests only; nil: the
	// machine's clock on SQLite, the database's on PostgreSQL).
	Now func() time.Time
	// CacheMiB is the memory for the ledger's caches, every namespace
	// together (0: the driver's default). SQLite: the key index's block
	// cache and memtables, and the page caches; PostgreSQL keeps no
	// cache of its own (its server has one).
	CacheMiB int
	// MaxOpenNamespaces bounds the namespaces whose files are open at once
	// (0: the driver decides). SQLite only: each namespace is a file;
	// PostgreSQL opens none.
	MaxOpenNamespaces int
	// AfterCommit, when set, runs right after each COMMIT of a write
	// (tests: a process killed at that instant). SQLite only.
	AfterCommit func()
	// IndexWriteFault, when set, can fail each write to the key index
	// (tests: a full disk under it). SQLite only: PostgreSQL has no key
	// index.
	IndexWriteFault func() error
}

// IsPostgres reports whether dsn names a PostgreSQL database.
func IsPostgres(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// Shared is what a database that several processes share (PostgreSQL)
// offers them besides the ledger's ports: locks held while a process
// lives, and a count of the live ledgerd replicas.
type Shared interface {
	// TrySignerLock elects one checkpoint signer of namespace ns.
	TrySignerLock(ctx context.Context, ns string) (release func(), ok bool, err error)
	// TryRunLock holds run (a ledger-mcp run id) while the process lives.
	TryRunLock(ctx context.Context, run string) (release func(), ok bool, err error)
	// LiveReplicas counts the ledgerd processes serving the database.
	LiveReplicas(ctx context.Context) (int, error)
}

// Open opens the store named by dsn, and what it offers the processes
// that share it (nil for a SQLite file, which one process writes).
func Open(ctx context.Context, dsn string, opts Options) (ledger.Store, Shared, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if IsPostgres(dsn) {
		return openPostgres(ctx, dsn, opts)
	}
	so := sqlite.Options{Logger: opts.Logger, KeyTTL: opts.KeyTTL, Payloads: opts.Payloads, Now: opts.Now, CacheMiB: opts.CacheMiB,
		MaxOpenNamespaces: opts.MaxOpenNamespaces, AfterCommit: opts.AfterCommit, IndexWriteFault: opts.IndexWriteFault}
	st, err := sqlite.OpenStore(ctx, dsn, so, opts.ReadOnly)
	if err != nil {
		return nil, nil, err
	}
	return st, nil, nil
}
