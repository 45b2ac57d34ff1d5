package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/keyindex"
)

// The key index of a ledger (storage/keyindex) lives in <ledger file>.idx/
// and serves every namespace of the ledger. A writing Store opens it
// before any file; each file, when it opens, brings the index up to its
// chain (syncIndex) before it serves, and the writer applies each batch
// after its COMMIT (applyIndex). Readers of a file without the writer
// (ledgerctl on a running ledgerd's file, a copy) scan the receipts
// instead: Pebble lets one process at a time open the index.

// IndexPath is the key index directory of the ledger at path.
func IndexPath(path string) string { return path + ".idx" }

// indexMemory is the key index's part of cacheMiB: what SQLite's page
// caches do not get. Pebble counts its memtables (at most two, an eighth
// of the part each) against its block cache, which gets the rest.
func indexMemory(cacheMiB int) keyindex.Options {
	idx := int64(cacheMiB-sqliteCacheMiB(cacheMiB)) << 20
	return keyindex.Options{CacheBytes: idx, MemTableBytes: uint64(max(idx/8, 1<<20))}
}

// sqliteCacheMiB is what SQLite's page caches get of cacheMiB: a quarter
// (at least 2 MiB). Its writes only append and its reads are by seq, so
// the pages it revisits are few; the key index's lookups are random.
func sqliteCacheMiB(cacheMiB int) int { return max(cacheMiB/4, 2) }

// ledgerIndex is an open key index and the lock that makes its process
// the index's only user.
type ledgerIndex struct {
	*keyindex.Index
	lock *lockFile
}

func (l *ledgerIndex) close() error {
	return errors.Join(l.Close(), l.lock.release())
}

// openIndex opens the key index of the ledger at abs. Its lock
// (<ledger file>.idx.lock) is taken first, so that an index another
// process holds is refused (ErrLocked) and never taken for a damaged one.
// An index that then cannot be opened (damaged, or made by something
// else) is moved aside, never deleted, and a new one is made: every
// namespace is then rebuilt from its receipts as it opens.
func openIndex(abs string, opts Options) (*ledgerIndex, error) {
	dir := IndexPath(abs)
	lock, err := acquireLock(dir)
	if err != nil {
		return nil, fmt.Errorf("open key index: %w", err)
	}
	o := indexMemory(opts.CacheMiB)
	o.Logger, o.Bulk, o.WriteFault = opts.Logger, opts.rebuildIndex, opts.IndexWriteFault
	ix, err := keyindex.Open(dir, o)
	if err == nil {
		return &ledgerIndex{ix, lock}, nil
	}
	if keyindex.IsDiskError(err) && !opts.rebuildIndex {
		// Not the index's fault: serve, answering unavailable where the
		// index is needed, until a replay succeeds (indexUsable).
		opts.Logger.Error("the key index cannot be opened; writes and key reads answer unavailable until it can",
			"index", dir, "err", err)
		return &ledgerIndex{keyindex.Unopened(dir, o, err), lock}, nil
	}
	if _, serr := os.Stat(dir); serr != nil || keyindex.IsDiskError(err) {
		_ = lock.release()
		return nil, err // nothing there to set aside, or the disk's fault: the directory cannot be made
	}
	aside, rerr := keyindex.MoveAside(dir)
	if rerr != nil {
		_ = lock.release()
		return nil, fmt.Errorf("%w (and moving it aside failed: %w)", err, rerr)
	}
	opts.Logger.Error("the key index cannot be opened; setting it aside and rebuilding it from the receipts",
		"index", dir, "moved_to", aside, "err", err)
	if ix, err = keyindex.Open(dir, o); err != nil {
		if keyindex.IsDiskError(err) && !opts.rebuildIndex {
			return &ledgerIndex{keyindex.Unopened(dir, o, err), lock}, nil
		}
		_ = lock.release()
		return nil, err
	}
	return &ledgerIndex{ix, lock}, nil
}

// openIndex brings the index up to the file as the file opens; with
// opts.rebuildIndex it repairs the recorded head first and rebuilds the
// namespace's index.
func (db *chainWriter) openIndex(ctx context.Context, opts Options) error {
	if db.idx == nil {
		return nil
	}
	if opts.rebuildIndex {
		if err := db.repairHead(ctx); err != nil {
			return err
		}
		return db.syncIndex(ctx, true)
	}
	gen := db.idx.Gen()
	err := db.syncIndex(ctx, false)
	if err != nil && indexBroken(err) {
		// The disk under the index (or the index) failed: the file serves,
		// and what needs the index answers unavailable until a replay
		// succeeds (indexUsable), which Repair makes possible.
		db.stale.Store(true)
		db.retry.failed(db, err)
		return nil
	}
	if err == nil {
		db.idxGen.Store(gen)
	}
	return err
}

// indexBroken reports whether err is the key index's own failure (its
// disk, its files), which a later replay can mend, rather than the
// ledger file's.
func indexBroken(err error) bool {
	return errors.Is(err, keyindex.ErrUnusable) || errors.Is(err, keyindex.ErrNoSpace) || keyindex.IsDiskError(err)
}

// bulkBuildIndex builds the index of an existing ledger that has none (a
// file migrated from schema 3, an index deleted) for the default
// namespace as a bulk load: large memtables, no compaction until one at
// the end, about ten times faster than building it through the serving
// index. The file's checks are the usual ones; other namespaces are built
// as they open.
func bulkBuildIndex(ctx context.Context, abs string, opts Options) error {
	if _, err := os.Stat(IndexPath(abs)); err == nil {
		return nil
	}
	if fi, err := os.Stat(abs); err != nil || fi.Size() == 0 {
		return nil // a new ledger, or one precheck refuses
	}
	opts.rebuildIndex = true // bulk memory settings only; the file opens normally
	ix, err := openIndex(abs, opts)
	if err != nil && indexBroken(err) {
		_ = os.RemoveAll(IndexPath(abs)) // there was none: the serving index is built once the disk has room
		opts.Logger.Error("the key index cannot be built; writes and key reads answer unavailable until it can",
			"index", IndexPath(abs), "err", err)
		return nil
	}
	if err != nil {
		return err
	}
	opts.index, opts.rebuildIndex = ix.Index, false
	c, err := openChainWriter(ctx, abs, ledger.DefaultNamespace, opts)
	if err == nil {
		err = c.Close()
		if err == nil {
			err = ix.Compact(ctx)
		}
	}
	if cerr := ix.close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.RemoveAll(IndexPath(abs)) // half-built: the next start builds it again
		if indexBroken(err) {
			// The disk's fault: the ledger serves without the index until
			// it can be built (openIndex, indexUsable).
			opts.Logger.Error("the key index cannot be built; writes and key reads answer unavailable until it can",
				"index", IndexPath(abs), "err", err)
			return nil
		}
		return fmt.Errorf("open ledger %s: build the key index: %w", abs, err)
	}
	return nil
}

// syncIndex brings the index up to the file's chain before the file
// serves: the index's watermark for the namespace must be a receipt of
// this chain, and then the receipts after it are replayed. An index
// without a watermark, ahead of the chain, or on another chain (the hash
// differs) is rebuilt from every receipt, as is any index when rebuild is
// set. The index is never trusted past what the chain proves.
func (c *chainWriter) syncIndex(ctx context.Context, rebuild bool) error {
	head := *c.head.Load()
	wm, found, err := c.idx.Watermark(c.ns)
	if errors.Is(err, keyindex.ErrUnusable) {
		return fmt.Errorf("key index of %s: %w", c.ns, err)
	}
	reason := ""
	switch {
	case rebuild:
		reason = "rebuild requested"
	case err != nil:
		reason = "its watermark is unreadable: " + err.Error()
	case !found && head.Seq > 0:
		reason = "the index holds nothing of this namespace"
	case !found:
		reason = "new namespace"
	case wm.Seq > head.Seq:
		reason = fmt.Sprintf("the index reflects receipt %d but the chain ends at %d", wm.Seq, head.Seq)
	case wm.Seq > 0:
		r, err := c.receiptOrNil(ctx, wm.Seq)
		if err != nil {
			return fmt.Errorf("key index: read receipt %d: %w", wm.Seq, err)
		}
		if r == nil {
			reason = fmt.Sprintf("the index reflects receipt %d, which the chain does not hold", wm.Seq)
		} else if r.Hash != wm.Hash {
			reason = fmt.Sprintf("the index is of another chain (receipt %d has hash %s, the index %s)",
				wm.Seq, shortHash(r.Hash), shortHash(wm.Hash))
		}
	case wm.Hash != (chain.Hash{}):
		reason = "the index's watermark is not of an empty chain"
	}
	if reason != "" {
		if head.Seq > 0 {
			level := slog.LevelWarn
			if rebuild || (!found && err == nil) {
				level = slog.LevelInfo // asked for, or a new or migrated index: nothing was lost
			}
			c.logger.Log(ctx, level, "rebuilding the key index of a namespace from its receipts", "namespace", c.ns,
				"receipts", head.Seq, "reason", reason)
		}
		if err := c.idx.Drop(c.ns); err != nil {
			return err
		}
		wm = ledger.Head{}
	}
	if wm == head && reason == "" {
		return nil
	}
	return c.replay(ctx, wm, head)
}

// replay applies the receipts after from up to head to the index.
func (c *chainWriter) replay(ctx context.Context, from, head ledger.Head) error {
	start := time.Now()
	ttl, err := c.KeyTTL(ctx)
	if err != nil {
		return err
	}
	src := &replaySource{rd: c.Reader, ctx: ctx, after: from.Seq}
	defer src.close()
	d := c.idx.NewDeriver(c.ns, ttl, from, src)
	last, warned := time.Now(), false
	err = c.Receipts(ctx, from.Seq, func(r *chain.Receipt) error {
		if r.Seq > head.Seq {
			return errStopScan
		}
		if len(r.Malformed) > 0 && !warned {
			warned = true
			c.logger.Warn("a receipt holds a value of the wrong type; the key index takes it as read; check the chain with `ledgerctl verify`",
				"namespace", c.ns, "seq", r.Seq, "field", r.Malformed[0].Field)
		}
		if time.Since(last) > 2*time.Second {
			last = time.Now()
			c.logger.Info("rebuilding the key index", "namespace", c.ns, "seq", r.Seq, "of", head.Seq)
		}
		return d.Apply(r)
	})
	if err != nil && !errors.Is(err, errStopScan) {
		return fmt.Errorf("key index of %s: %w", c.ns, err)
	}
	got, err := d.Finish()
	if err != nil {
		return fmt.Errorf("key index of %s: %w", c.ns, err)
	}
	if got != head {
		return fmt.Errorf("key index of %s: replayed up to %d, the chain ends at %d", c.ns, got.Seq, head.Seq)
	}
	if n := d.Applied(); n > 0 {
		c.logger.Info("key index up to date", "namespace", c.ns, "receipts_applied", n, "duration", time.Since(start))
	}
	return nil
}

var errStopScan = errors.New("stop scan")

// replaySource reads what a Deriver needs beside the receipts: receipts
// named by ref_seq, and the token hashes in seq order from one cursor.
type replaySource struct {
	rd    *Reader
	ctx   context.Context
	after uint64
	rows  *sql.Rows
	cur   uint64 // seq of the row the cursor is on; 0 before the first
	hash  []byte
	done  bool
}

func (s *replaySource) Receipt(seq uint64) (*chain.Receipt, error) {
	return s.rd.receiptOrNil(s.ctx, seq)
}

// receiptOrNil reads the receipt at seq, or nil if there is none.
func (rd *Reader) receiptOrNil(ctx context.Context, seq uint64) (*chain.Receipt, error) {
	r, err := scanReceipt(rd.r.QueryRowContext(ctx, sqlReceiptBySeq, rd.args(seq)...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, classify(err)
	}
	return &r, nil
}

func (s *replaySource) TokenHash(seq uint64) (string, error) {
	if s.rows == nil && !s.done {
		rows, err := s.rd.r.QueryContext(s.ctx, sqlTokensAfter, s.rd.args(s.after)...)
		if err != nil {
			return "", classify(err)
		}
		s.rows = rows
	}
	for !s.done && s.cur < seq {
		if !s.rows.Next() {
			s.done = true
			if err := s.rows.Err(); err != nil {
				return "", classify(err)
			}
			break
		}
		if err := s.rows.Scan(&s.cur, &s.hash); err != nil {
			return "", err
		}
	}
	if s.cur == seq {
		return string(s.hash), nil
	}
	return "", nil
}

func (s *replaySource) close() {
	if s.rows != nil {
		_ = s.rows.Close()
	}
}

// applyIndex applies a committed batch to the index. If that fails, the
// index lacks a committed batch: the writer stops taking batches until a
// replay from the watermark succeeds (indexUsable), since a decision read
// from the index could otherwise run a committed key's effect again, and
// the reads that go through the index answer unavailable meanwhile
// (indexReadable) rather than an outdated state.
func (c *chainWriter) applyIndex(t *writeTx) {
	if t.appended == 0 {
		return
	}
	b := c.idx.NewBatch(c.ns)
	defer b.Close()
	err := c.addToIndex(b, t)
	if err == nil {
		err = b.Apply()
	}
	if err != nil {
		c.indexFailed(t, err)
	}
}

// addToIndex adds c's part t of a committed transaction to b: its
// receipts, key records and watermark.
func (c *chainWriter) addToIndex(b *keyindex.Batch, t *writeTx) error {
	b.For(c.ns)
	for _, r := range t.receipts {
		if err := b.Receipt(r); err != nil {
			return err
		}
	}
	done := make(map[string]bool, len(t.putKeys))
	for _, key := range t.putKeys {
		if !done[key] {
			done[key] = true
			if err := b.PutKey(t.dirtyKeys[key]); err != nil {
				return err
			}
		}
	}
	if c.indexFault != nil {
		if err := c.indexFault(); err != nil {
			return err
		}
	}
	return b.Watermark(t.head)
}

// indexFailed records that the index lacks c's committed part t.
func (c *chainWriter) indexFailed(t *writeTx, err error) {
	c.stale.Store(true)
	c.logger.Error("applying a committed batch to the key index failed; the namespace takes no writes until the index is replayed",
		"namespace", c.ns, "head_seq", t.head.Seq, "err", err)
}

// indexRetry spaces the replays of an index that lacks committed batches:
// the first retry after retryMin, then twice as long each time up to
// retryMax, so that a full disk costs neither CPU nor a log line a
// request; the failure is logged at most every retryMax.
type indexRetry struct {
	next    time.Time
	delay   time.Duration
	lastErr error
	logged  time.Time
	quiet   int // failures not logged since
}

// The bounds of indexRetry's delay; variables for the tests.
var (
	retryMin = 100 * time.Millisecond
	retryMax = 5 * time.Second
)

// failed records a failed replay (or open) of c's index.
func (r *indexRetry) failed(c *chainWriter, err error) {
	r.delay = min(max(2*r.delay, retryMin), retryMax)
	r.next, r.lastErr = time.Now().Add(r.delay), err
	if time.Since(r.logged) < retryMax {
		r.quiet++
		return
	}
	c.logger.Error("the key index cannot be replayed; writes and key reads answer unavailable until it can",
		"namespace", c.ns, "retry_in", r.delay, "failures_not_logged", r.quiet, "err", err)
	r.logged, r.quiet = time.Now(), 0
}

// needsSync reports whether the index may lack committed batches of c:
// an apply failed, the index failed (its disk, its files), or it was
// reopened (Repair) since c synced.
func (c *chainWriter) needsSync() bool {
	return c.stale.Load() || (c.idx != nil && (c.idx.Gen() != c.idxGen.Load() || c.idx.Err() != nil))
}

// indexUsable returns nil when the index holds every committed batch,
// replaying the ones it lacks first (after reopening a failed index), at
// most as often as c.retry allows. Called with c.mu held.
func (c *chainWriter) indexUsable(ctx context.Context) error {
	if c.idx == nil {
		return fmt.Errorf("%w: the file was opened without its key index", ledger.ErrUnavailable)
	}
	if !c.needsSync() {
		return nil
	}
	if time.Now().Before(c.retry.next) {
		return fmt.Errorf("%w: the key index lacks committed receipts and cannot be replayed yet: %w", ledger.ErrUnavailable, c.retry.lastErr)
	}
	err := error(nil)
	if c.indexFault != nil {
		err = c.indexFault()
	}
	gen := uint64(0)
	if err == nil {
		err = c.idx.Repair()
		gen = c.idx.Gen()
	}
	if err == nil {
		err = c.syncIndex(ctx, false)
	}
	if err != nil {
		if ctx.Err() == nil {
			c.retry.failed(c, err)
		}
		return fmt.Errorf("%w: the key index lacks committed receipts and replaying them failed: %w", ledger.ErrUnavailable, err)
	}
	c.logger.Info("key index replayed; the namespace takes writes again", "namespace", c.ns)
	c.retry = indexRetry{}
	c.idxGen.Store(gen)
	c.stale.Store(false)
	return nil
}

// RebuildIndex rebuilds the namespace's part of the key index from its
// receipts.
func (c *chainWriter) RebuildIndex(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.idx.Repair(); err != nil {
		return fmt.Errorf("%w: %w", ledger.ErrUnavailable, err)
	}
	gen := c.idx.Gen()
	if err := c.syncIndex(ctx, true); err != nil {
		return err
	}
	c.cache.drop(c.id)
	c.retry = indexRetry{}
	c.idxGen.Store(gen)
	c.stale.Store(false)
	return nil
}

// indexReadable returns ErrUnavailable while the index may lack a
// committed batch (an apply failed, or the index was reopened, and no
// replay has succeeded yet).
func (c *chainWriter) indexReadable() error {
	if c.needsSync() {
		return fmt.Errorf("%w: the key index lacks committed receipts; the next write replays them", ledger.ErrUnavailable)
	}
	return nil
}
