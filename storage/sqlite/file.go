package sqlite

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/keyindex"
)

// chainWriter is one namespace's chain opened for writing: its head,
// caches and tree. The default namespace's also owns the ledger file's
// single writer connection, lock, read pool and checkpointer, which the
// other namespaces' share (main). The writer runs one transaction at a time and
// is the only writer of the file (the lock file), so it keeps the head,
// the key records and the tree hashes it wrote in memory.
type chainWriter struct {
	*Reader // mode=ro pool for queries

	// pending tells whether the chain may have pending erasure marks
	// (SPEC §14): read once, set by every mark, so that a commit of a
	// namespace with none reads nothing.
	pending pendingFlag

	ns          string
	now         func() time.Time
	logger      *slog.Logger
	newSettings ledger.NamespaceSettings // default's, stored if this open creates the file

	w *sql.DB // one connection, BEGIN IMMEDIATE

	head atomic.Pointer[ledger.Head] // durable head, updated after each COMMIT

	// held is the newest recorded_at of the chain (unix ms): read from the
	// head receipt at open, raised after each COMMIT. The writer's time is
	// never before it (clock), so recorded_at never decreases within the
	// chain, even across a restart with a clock that was set back.
	held atomic.Uint64
	// policySeq is the seq of the latest policy receipt (SPEC §13), read
	// at open and raised after each COMMIT that appended one.
	policySeq atomic.Uint64
	// pruned is the chain's pruned prefix (SPEC §16), read at open and
	// moved after each COMMIT of a prune or of a deletion batch.
	pruned atomic.Pointer[ledger.PruneMark]
	// gated holds the keys that have an ask or a deny (SPEC §13), used
	// under mu: a reserve of any other key skips the gate's read of its
	// history when no rule gates it. nil until a batch first asks (read
	// then from the key index's postings, not at open).
	gated map[string]struct{}

	// mu serialises the Updates and Close of every chain of the file: they
	// share the writer connection (the ledger file's chains share one).
	mu     *sync.Mutex
	closed bool
	// main is the ledger file's own chain (namespace default) for a
	// namespace of the shared tables, which uses its writer connection,
	// read pool, lock and checkpointer; nil for the file's own chain.
	main  *chainWriter
	stmts *writeStmts // the file's, used under mu
	tree  treeCache   // used under mu (tree.go)
	cache *keyCache   // used under mu

	lock *lockFile // held while open: one writer per file

	ckpt      *checkpointer // WAL checkpoints off the writer's path
	busyNanos atomic.Int64  // writer time from BEGIN to COMMIT, summed
	opsDone   atomic.Int64  // transactions plus receipts appended
	batches   atomic.Int64  // transactions committed

	onEnded func(ns string, keys []string)

	idx    *keyindex.Index // the ledger's key index; nil only for a file being created
	stale  atomic.Bool     // an apply failed: the index lacks a committed batch (index.go)
	idxGen atomic.Uint64   // the index's Gen when the file last synced with it
	retry  indexRetry      // when to try replaying again, guarded by mu

	// beforeCommit, set only by tests before any write, can fail a batch
	// just before its COMMIT; afterCommit runs right after each COMMIT,
	// before the index apply; indexFault can fail an index apply.
	beforeCommit func() error
	afterCommit  func()
	indexFault   func() error
}

// createFile makes a new ledger file at abs: built completely under a
// temporary name (page size set before WAL mode, which fixes it; the
// schema applied) and renamed into place, so that a crash never leaves a
// half-made file where a ledger belongs. The caller holds abs's lock.
func createFile(ctx context.Context, abs string, pageSize int, st ledger.NamespaceSettings) error {
	if pageSize < 512 || pageSize > 65536 || pageSize&(pageSize-1) != 0 {
		return fmt.Errorf("page size %d is not a power of two from 512 to 65536", pageSize)
	}
	tmp := abs + ".new"
	removeFileSet(tmp)
	if err := initFile(ctx, tmp, pageSize, st); err != nil {
		removeFileSet(tmp)
		return err
	}
	if err := os.Rename(tmp, abs); err != nil {
		removeFileSet(tmp)
		return err
	}
	return syncDir(filepath.Dir(abs))
}

// initFile creates the ledger file at path with the schema and its
// settings.
func initFile(ctx context.Context, path string, pageSize int, st ledger.NamespaceSettings) error {
	q := url.Values{}
	q.Set("mode", "rwc")
	q.Set("_synchronous", "FULL")
	p := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	c, err := sql.Open("sqlite3", "file:"+p+"?"+q.Encode())
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	c.SetMaxOpenConns(1)
	if _, err := c.ExecContext(ctx, fmt.Sprintf("PRAGMA page_size = %d", pageSize)); err != nil {
		return classify(err)
	}
	var mode string
	if err := c.QueryRowContext(ctx, `PRAGMA journal_mode = WAL`).Scan(&mode); err != nil {
		return classify(err)
	}
	if err := upgrade(ctx, c, path, st, slog.New(slog.DiscardHandler)); err != nil {
		return err
	}
	// Closing the only connection checkpoints the WAL into the file and
	// removes it; the file is then complete on its own.
	if err := c.Close(); err != nil {
		return err
	}
	if _, err := syncFile(path); err != nil {
		return err
	}
	if _, err := os.Stat(path + "-wal"); err == nil {
		return fmt.Errorf("create %s: the write-ahead log was not folded into the file", path)
	}
	return nil
}

// dsn returns a SQLite URI for path with the given mode and the
// per-connection settings every connection needs (cacheMiB > 0 sets the
// page cache of writers). Pragmas go in the DSN because database/sql
// opens connections on its own.
func dsn(path, mode string, busy time.Duration, cacheMiB int) string {
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
	if mode != "ro" {
		// An erased value (SPEC §14) is overwritten with zeros in its
		// page, not left in free space: every connection that writes.
		q.Set("_secure_delete", "on")
	}
	if cacheMiB > 0 {
		q.Set("_txlock", "immediate")
		// The writer reads receipts by seq (a key's first reserve, its
		// outcome) and appends: keep those pages in memory.
		q.Set("_cache_size", fmt.Sprint(-cacheMiB*1024)) // KiB
	}
	p := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	return "file:" + p + "?" + q.Encode()
}

// openChainWriter opens the ledger file at path for writing as namespace
// ns, creating it with the schema if it does not exist. A file that is not
// an effect-ledger database, or has a newer schema, is refused before
// anything is written to it or created beside it.
func openChainWriter(ctx context.Context, path, ns string, opts Options) (*chainWriter, error) {
	abs, err := ledgerPath(path)
	if err != nil {
		return nil, err
	}
	opts.defaults()
	if err := precheck(abs); err != nil {
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	lock, err := acquireLock(abs)
	if err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	if _, err := os.Stat(abs); errors.Is(err, os.ErrNotExist) {
		if err := createFile(ctx, abs, opts.PageSize, opts.defaultSettings()); err != nil {
			_ = lock.release()
			return nil, fmt.Errorf("open ledger %s: create: %w", abs, err)
		}
		opts.Logger.Info("created ledger database", "path", abs, "schema_version", SchemaVersion, "key_ttl_ms", opts.KeyTTL,
			"payloads", opts.defaultSettings().Payloads)
	}
	db := &chainWriter{ns: ns, lock: lock, mu: new(sync.Mutex), now: opts.Now, logger: opts.Logger, newSettings: opts.defaultSettings(),
		cache: newKeyCache(opts.CacheKeys, opts.CacheBytes), idx: opts.index, afterCommit: opts.AfterCommit}

	ok := false
	defer func() {
		if !ok {
			_ = lock.release()
		}
	}()
	if db.w, err = sql.Open(writerDriverName(), dsn(abs, "rwc", opts.BusyTimeout, sqliteCacheMiB(opts.CacheMiB))); err != nil {
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	db.w.SetMaxOpenConns(1)
	db.w.SetMaxIdleConns(1)
	db.w.SetConnMaxLifetime(0)
	db.w.SetConnMaxIdleTime(0)
	db.Reader = &Reader{path: abs} // the default namespace, until the pool opens
	if err := db.init(ctx, abs, opts.Repair); err != nil {
		_ = db.w.Close()
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	if _, err := db.w.ExecContext(ctx, fmt.Sprintf("PRAGMA soft_heap_limit = %d", int64(sqliteCacheMiB(opts.CacheMiB))<<20)); err != nil {
		_ = db.w.Close()
		return nil, fmt.Errorf("open ledger %s: memory limit: %w", abs, classify(err))
	}
	if db.stmts, err = prepareWrite(ctx, db.w); err != nil {
		_ = db.w.Close()
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	if err := db.initTree(ctx, *db.head.Load(), opts.Repair); err != nil {
		_ = db.w.Close()
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	if db.Reader, err = openReader(ctx, abs, opts); err != nil {
		_ = db.w.Close()
		return nil, err
	}
	if err := db.openIndex(ctx, opts); err != nil {
		_ = db.r.Close()
		_ = db.w.Close()
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	ck, err := sql.Open("sqlite3", dsn(abs, "rw", opts.BusyTimeout, 0))
	if err != nil {
		_ = db.r.Close()
		_ = db.w.Close()
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	ck.SetMaxOpenConns(1)
	ck.SetMaxIdleConns(1)
	ck.SetConnMaxLifetime(0)
	db.ckpt = newCheckpointer(ck, db.opsDone.Load, func(err error) {
		db.logger.Warn("background WAL checkpoint failed", "err", err)
	})
	var unpurged int
	if err := db.r.QueryRowContext(ctx, `SELECT count(*) FROM ns_erasures WHERE purged_at = 0`).Scan(&unpurged); err == nil && unpurged > 0 {
		db.kickPurge() // erasures committed before a stop or crash: purge now
	}
	ok = true
	return db, nil
}

// applicationID is the SQLite application_id schema.sql stamps.
const applicationID = 1701209452 // 0x6566656C

// precheck looks at the file without opening it through SQLite, so that a
// file that is refused is left exactly as it was (no journal mode switch,
// no -wal, -shm or .lock beside it). A missing file is a new ledger;
// anything else must be an SQLite database stamped with this application
// id and a schema version this build knows: an empty file, or an empty
// SQLite database, is not a ledger (taking it as a new one would start
// a ledger over where one was expected). The directory must exist.
func precheck(abs string) error {
	dir := filepath.Dir(abs)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("the directory %s does not exist (create it, or choose another --db path)", dir)
	}
	f, err := os.Open(abs)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("%s is a directory, not a database file", abs)
	}
	if fi.Size() == 0 {
		return fmt.Errorf("%w: the file is empty (0 bytes); a new ledger is created only where no file exists "+
			"(restore the ledger from a backup, or remove the empty file to start a new ledger)", ledger.ErrNotLedger)
	}
	var hdr [100]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil {
		return fmt.Errorf("%w: the file is not a database (no SQLite header)", ledger.ErrNotLedger)
	}
	if string(hdr[:16]) != "SQLite format 3\x00" {
		return fmt.Errorf("%w: the file is not a database (no SQLite header)", ledger.ErrNotLedger)
	}
	appID := binary.BigEndian.Uint32(hdr[68:72])
	version := int(binary.BigEndian.Uint32(hdr[60:64]))
	pages := binary.BigEndian.Uint32(hdr[28:32])
	switch {
	case appID == 0 && version == 0 && pages <= 1:
		return fmt.Errorf("%w: it is an empty SQLite database; a new ledger is created only where no file exists", ledger.ErrNotLedger)
	case appID != applicationID:
		return fmt.Errorf("%w: it is an SQLite database of another application (application_id %#x)", ledger.ErrNotLedger, appID)
	case version > SchemaVersion:
		return fmt.Errorf("%w: file has %d, this build knows up to %d (use a newer ledgerd)", ledger.ErrSchemaVersion, version, SchemaVersion)
	}
	return nil
}

// init checks the connection settings, applies, migrates or checks the
// schema, checks the derived state against the chain (unless repairing)
// and loads the chain head.
func (db *chainWriter) init(ctx context.Context, abs string, repair bool) error {
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
	if err := upgrade(ctx, db.w, abs, db.newSettings, db.logger); err != nil {
		return err
	}
	if err := db.loadHead(ctx, db.chainRef, dbFlags(abs, db.ns), repair); err != nil {
		return err
	}
	h := *db.head.Load()
	db.logger.Info("ledger opened", "path", abs, "namespace", db.ns, "sqlite_version", version,
		"head_seq", h.Seq, "head_hash", h.Hash.String())
	return nil
}

// loadHead reads the chain's head, checks it against the recorded one
// (unless repairing), and reads the chain's newest recorded_at and latest
// policy receipt, through the writer connection.
func (db *chainWriter) loadHead(ctx context.Context, ref chainRef, flags string, repair bool) error {
	tail, err := readTail(ctx, db.w, ref)
	if err != nil {
		return fmt.Errorf("load head: %w", err)
	}
	if !repair {
		if err := checkDerived(ctx, db.w, ref, tail, flags); err != nil {
			return err
		}
	}
	held, err := readLastRecordedAt(ctx, db.w, ref)
	if err != nil {
		return fmt.Errorf("load head: %w", err)
	}
	db.held.Store(held)
	ps, err := readPolicySeq(ctx, db.w, ref)
	if err != nil {
		return err
	}
	db.policySeq.Store(ps)
	pm, err := readPruned(ctx, db.w, ref)
	if err != nil {
		return err
	}
	db.pruned.Store(&pm)
	h := tail
	db.head.Store(&h)
	ledger.SetHeadMetric(db.ns, h.Seq)
	return nil
}

// dbFlags names namespace ns of the ledger file at abs the way ledgerctl
// does: --db FILE, and --namespace NS for a namespace other than default.
func dbFlags(abs, ns string) string {
	if ns == ledger.DefaultNamespace {
		return "--db " + abs
	}
	return "--db " + abs + " --namespace " + ns
}

// queryRower is what readTail and checkDerived need of a pool or a Tx.
type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// readTail returns the last receipt's seq and hash as stored.
func readTail(ctx context.Context, q queryRower, ref chainRef) (ledger.Head, error) {
	var h ledger.Head
	var hash []byte
	err := q.QueryRowContext(ctx, sqlHead, ref.args()...).Scan(&h.Seq, &hash)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return h, nil
	case err != nil:
		return h, classify(err)
	}
	if h.Hash, err = chain.HashFromBytes(hash); err != nil {
		return h, err
	}
	return h, nil
}

// readLastRecordedAt returns the recorded_at of the chain's last receipt
// (0 for an empty chain, or for a value that is not an unsigned integer:
// an edited file, which the verifier reports).
func readLastRecordedAt(ctx context.Context, q queryRower, ref chainRef) (uint64, error) {
	var at uint64
	err := q.QueryRowContext(ctx, sqlLastRecordedAt, ref.args()...).Scan(&at)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, classify(err)
	}
	return at, nil
}

// clock is the writer's time in unix ms: Options.Now, held at the newest
// recorded_at of the chain when the clock reads earlier (a clock stepped
// back). Decisions (leases, key lifetimes) and the key views of this
// process use it, so they agree with the receipts' times.
func (db *chainWriter) clock() uint64 {
	return max(uint64(db.now().UnixMilli()), db.held.Load())
}

// checkDerived compares the head recorded with the last append (table
// head, moved in the same transaction as every receipt) with the
// receipts' actual tail: two lookups.
func checkDerived(ctx context.Context, q queryRower, ref chainRef, tail ledger.Head, flags string) error {
	var rec ledger.Head
	var hash []byte
	err := q.QueryRowContext(ctx, sqlRecordedHead, ref.args()...).Scan(&rec.Seq, &hash)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: the recorded head is missing; run `ledgerctl rebuild-index %s` after checking the chain with `ledgerctl verify`",
			ledger.ErrDerivedState, flags)
	}
	if err != nil {
		return fmt.Errorf("check derived state: %w", classify(err))
	}
	rec.Hash, _ = chain.HashFromBytes(hash)
	if rec != tail {
		return fmt.Errorf("%w: the last append recorded head %d (%s) but the receipts end at %d (%s) — "+
			"receipts were removed or added outside ledgerd (a bad restore or a tampered file); "+
			"check the chain with `ledgerctl verify %s`, then recompute the derived state with `ledgerctl rebuild-index %s`",
			ledger.ErrDerivedState, rec.Seq, shortHash(rec.Hash), tail.Seq, shortHash(tail.Hash), flags, flags)
	}
	return nil
}

// checkTail reads the receipts' tail and checks it against the recorded head (checkDerived) in
// one read transaction: a reader beside a running ledgerd must see both in one snapshot, or an
// append between the two reads looks like a tampered file.
func checkTail(ctx context.Context, db *sql.DB, ref chainRef, flags string) (ledger.Head, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return ledger.Head{}, fmt.Errorf("read tail: %w", classify(err))
	}
	defer func() { _ = tx.Rollback() }()
	tail, err := readTail(ctx, tx, ref)
	if err != nil {
		return tail, fmt.Errorf("read tail: %w", err)
	}
	return tail, checkDerived(ctx, tx, ref, tail, flags)
}

func shortHash(h chain.Hash) string {
	s := h.String()
	return s[:12] + "…"
}

// Close waits for a running transaction, checkpoints the WAL and closes both
// connection pools.
func (db *chainWriter) Close() error {
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.closed {
		return nil
	}
	db.closed = true
	if db.main != nil {
		return nil // the ledger file's chain closes what they share
	}
	cerr := db.ckpt.close()
	// Readers go first: the last connection to close checkpoints the WAL
	// into the main file, and only the writer can, so that a cleanly
	// stopped ledger is one self-contained file.
	rerr := db.r.Close()
	for _, st := range db.stmts.all() {
		_ = st.Close()
	}
	if _, err := db.w.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		db.logger.Warn("checkpoint on close", "err", err)
	}
	return errors.Join(cerr, rerr, db.w.Close(), db.lock.release())
}

// Head returns the durable head of the chain (this process is its only
// writer).
func (db *chainWriter) Head(context.Context) (ledger.Head, error) { return *db.head.Load(), nil }

// classify maps SQLite failures that mean "cannot write now" onto the
// ErrUnavailable family, and a corrupt page or file onto
// ErrStorageCorrupt, using the driver's error codes.
func classify(err error) error {
	code, ok := sqliteCode(err)
	if !ok {
		if err != nil && err.Error() == errDBClosed {
			return fmt.Errorf("%w: %w", ledger.ErrClosed, err)
		}
		return err
	}
	switch code {
	case codeBusy, codeLocked:
		return fmt.Errorf("%w: %w", ledger.ErrBusy, err)
	case codeReadonly:
		return fmt.Errorf("%w: %w", ledger.ErrReadOnly, err)
	case codeFull:
		return fmt.Errorf("%w: %w", ledger.ErrDiskFull, err)
	case codeIOErr, codeCantOpen, codeProtocol:
		return fmt.Errorf("%w: %w", ledger.ErrIO, err)
	case codeCorrupt, codeNotADB:
		return fmt.Errorf("%w: %w", ledger.ErrStorageCorrupt, err)
	}
	return err
}

// errDBClosed is the text of database/sql's error for a use of a closed
// *sql.DB, which it does not export.
const errDBClosed = "sql: database is closed"

// SQLite's primary result codes that classify and the callers tell apart
// (https://sqlite.org/rescode.html); sqliteCode reads them from either
// driver's errors.
const (
	codeBusy       = 5
	codeLocked     = 6
	codeReadonly   = 8
	codeIOErr      = 10
	codeCorrupt    = 11
	codeFull       = 13
	codeCantOpen   = 14
	codeProtocol   = 15
	codeConstraint = 19
	codeNotADB     = 26
)

// sqlReadyProbe is a durable write of real size (1 MiB, more than a large
// batch writes) outside the chain, to see whether the disk takes writes
// again after a write transaction failed.
const sqlReadyProbe = `INSERT OR REPLACE INTO ready_probe (id, pad) VALUES (1, zeroblob(1048576))`
