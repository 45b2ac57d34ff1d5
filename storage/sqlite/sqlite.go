// Package sqlite is the SQLite storage driver of the ledger (a
// ledger.Store): every namespace in one database file, one layout for all
// (schema.sql; the view receipts is the default chain), with a single
// writer connection (BEGIN IMMEDIATE), a read-only pool, WAL mode and
// synchronous=FULL. It owns the SQL, the schema (schema.sql), locks,
// caches, backups and the repair of derived state; the domain (validation,
// decisions, hashing, batching, waits, proofs) is package ledger, which
// this package imports for its ports and types.
//
// It only stores: OpenStore returns the driver, over which a program
// builds the service with ledger.New; OpenReader, OpenTokens,
// CreateNamespace and Backup serve ledgerctl beside a running ledgerd.
package sqlite

import (
	"log/slog"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/keyindex"
)

// Options configure OpenStore and OpenReader. The zero value is usable.
type Options struct {
	// Now is the clock; it defaults to time.Now. Read once per batch.
	Now func() time.Time
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// ReadConns is the size of the read-only pool (default 4).
	ReadConns int
	// BusyTimeout is how long SQLite waits for a lock held by another
	// process (default 5s).
	BusyTimeout time.Duration
	// CacheKeys bounds the writer's in-memory key index (default 50,000;
	// negative disables it).
	CacheKeys int
	// CacheMiB is the memory of the ledger's caches, every file and
	// connection of the process together (default 32). Three quarters go
	// to the key index (its block cache and memtables, which Pebble
	// allocates outside the Go heap), a quarter to SQLite's page caches
	// (at least 2 MiB): a soft limit
	// (sqlite3_soft_heap_limit64, process-wide; the last open sets it)
	// under which the least recently used pages are recycled, and the
	// page cache of each writer connection. More is faster once a ledger
	// outgrows it; the operating system's file cache serves the rest.
	CacheMiB int
	// CacheBytes bounds the same index by the estimated heap its keys and
	// receipts hold (default 8 MiB; negative: keys bound only), so that
	// large results and many namespaces cannot grow ledgerd's memory.
	CacheBytes int
	// PageSize is the SQLite page size of a new database file (default
	// DefaultPageSize); an existing file keeps its own.
	PageSize int
	// Repair skips the check that the recorded head matches the chain, so
	// that RebuildIndex can repair it.
	Repair bool
	// MaxOpenNamespaces bounds the namespaces a writing Store keeps open (their
	// caches in memory) at once, the least recently used closed first
	// (default: 32 per MiB of CacheMiB, 64 to 1,024; nsfile.go).
	MaxOpenNamespaces int
	// HeadRecordEvery is how often a writing Store looks whether the key
	// index lacks committed batches of the default namespace, to replay
	// them (default DefaultHeadRecordInterval; the name is from when it
	// also recorded the namespace files' heads).
	HeadRecordEvery time.Duration
	// KeyTTL is the key_ttl_ms (SPEC §12) stored in the default
	// namespace's file when OpenStore creates it (ledgerd --default-key-ttl);
	// an existing file keeps its own. 0: keys never expire.
	KeyTTL uint64
	// Payloads is the payload mode (SPEC §14) of the default namespace when
	// OpenStore creates the file (ledgerd --default-payloads; "": committed).
	Payloads ledger.PayloadMode

	// AfterCommit, if set, runs right after each durable COMMIT, before
	// the batch is applied to the key index: a hook for the crash tests.
	AfterCommit func()
	// IndexWriteFault, if set, is called before each write of a file of
	// the key index, and an error it returns fails that write: a hook for
	// the full-disk tests.
	IndexWriteFault func() error

	index        *keyindex.Index // the ledger's key index, set by the Store
	rebuildIndex bool            // rebuild the file's part of the index on open
}

// defaults fills the zero fields of o.
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
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = 5 * time.Second
	}
	if o.CacheKeys == 0 {
		o.CacheKeys = 50_000
	}
	if o.CacheMiB <= 0 {
		o.CacheMiB = DefaultCacheMiB
	}
	if o.MaxOpenNamespaces <= 0 {
		o.MaxOpenNamespaces = maxOpenNamespaces(o.CacheMiB)
	}
	if o.HeadRecordEvery <= 0 {
		o.HeadRecordEvery = DefaultHeadRecordInterval
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = 8 << 20
	}
	if o.PageSize == 0 {
		o.PageSize = DefaultPageSize
	}
}

// DefaultCacheMiB is the default of Options.CacheMiB.
const DefaultCacheMiB = 32

// DefaultPageSize is the page size of new ledgers. Writes only append, so
// a batch dirties the last pages of its tables, each written whole to the
// WAL at COMMIT and again by the checkpoint (BENCHMARKS.md).
const DefaultPageSize = 4096

// defaultSettings are the settings of the default namespace of a file this
// open creates.
func (o *Options) defaultSettings() ledger.NamespaceSettings {
	return ledger.NamespaceSettings{KeyTTL: o.KeyTTL, Payloads: o.Payloads}.Resolved()
}
