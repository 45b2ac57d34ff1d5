// Package keyindex is the SQLite driver's key index: the state of every
// idempotency key and the receipts of each key, execution, tool and kind,
// kept in one Pebble LSM beside the ledger file (<ledger file>.idx/) for
// every namespace of the ledger.
//
// The index is derived. The SQLite files stay the complete ledger: their
// durable transactions only append (receipts, tree hashes, reservation
// token hashes), and the writer applies each committed batch to the index
// afterwards, without waiting for the disk (Pebble's NoSync), together
// with the head (seq, hash) the index then reflects for the namespace —
// its watermark. A crash can lose the last applies, never reorder them:
// on open the driver compares the watermark with the chain and replays
// the receipts the index lacks, or rebuilds the namespace when the index
// is missing, ahead of the chain or from another chain (Deriver).
//
// Keys are namespace-prefixed: one length byte and the namespace name,
// then a tag byte:
//
//	w                     → watermark: seq (8 bytes) and hash (32)
//	k key                 → key record (encodeRecord; no fingerprint)
//	K esc(key) seq        → ∅   every receipt of a key, replays included
//	e esc(execution) seq  → ∅
//	t esc(tool) seq       → ∅
//	c kind seq            → ∅   kind is one byte (kindByte)
//
// esc escapes 0x00 as 0x00 0xFF and ends with 0x00 0x01, so a field is
// never a prefix of another and byte order is kept; seqs are big-endian,
// so each posting list is in seq order.
package keyindex

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// Options size an Index's memory. Pebble allocates its block cache and
// memtables outside the Go heap (with cgo, through malloc), so both count
// against the process's memory budget, not against GOGC.
type Options struct {
	// CacheBytes is all the index's memory (default 16 MiB): Pebble
	// reserves its memtables in the block cache, which gets the rest.
	CacheBytes int64
	// MemTableBytes is one memtable; at most two exist at once (default
	// 2 MiB).
	MemTableBytes uint64
	Logger        *slog.Logger
	// ReadOnly opens an existing index without writing to it.
	ReadOnly bool
	// Bulk opens the index for a rebuild by one process that does
	// nothing else (ledgerctl rebuild-index): large memtables, and L0
	// allowed to grow until the rebuild compacts it once (Compact).
	Bulk bool
	// MinFreeBytes is the free space the index's file system must keep
	// for a write to be tried (default two memtables; -1: no check): a
	// write with less fails with ErrNoSpace before Pebble meets a full
	// disk.
	MinFreeBytes int64
	// WriteFault, when set, is called before each write of a file of the
	// index; an error it returns fails that write (tests: a full disk).
	WriteFault func() error
}

// Index is an open key index. Its Pebble database can fail (a full disk,
// corruption): the Index is then unusable until Repair (health.go).
type Index struct {
	dir     string
	bulk    bool // opened with Options.Bulk: no log
	o       Options
	logger  *slog.Logger
	minFree uint64

	cur       atomic.Pointer[instance] // nil while no instance is open
	openFault atomic.Pointer[fault]    // why the last open failed
	gen       atomic.Uint64
	cmu       sync.Mutex // one write at a time: a failed commit leaves Pebble's pipeline stuck
	repairMu  sync.Mutex
	limit     limiter

	spaceOKUntil atomic.Int64 // unix ns: until then checkSpace need not look
}

// Open opens or creates the index in dir.
func Open(dir string, o Options) (*Index, error) {
	ix := newIndex(dir, o)
	in, err := ix.openInstance()
	if err != nil {
		return nil, fmt.Errorf("open key index %s: %w", dir, err)
	}
	ix.cur.Store(in)
	ix.gen.Store(1)
	return ix, nil
}

// Unopened returns an Index of dir whose open failed with cause (a disk
// error: IsDiskError): it is unusable until Repair opens it.
func Unopened(dir string, o Options, cause error) *Index {
	ix := newIndex(dir, o)
	ix.openFault.Store(&fault{err: cause})
	return ix
}

func newIndex(dir string, o Options) *Index {
	if o.CacheBytes <= 0 {
		o.CacheBytes = 16 << 20
	}
	if o.MemTableBytes == 0 {
		o.MemTableBytes = 2 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	ix := &Index{dir: dir, bulk: o.Bulk, o: o, logger: o.Logger, limit: limiter{every: 5 * time.Second}}
	switch {
	case o.MinFreeBytes > 0:
		ix.minFree = uint64(o.MinFreeBytes)
	case o.MinFreeBytes == 0 && !o.ReadOnly:
		ix.minFree = 2 * o.MemTableBytes
	}
	return ix
}

// openInstance opens a Pebble database on the index's directory.
func (ix *Index) openInstance() (*instance, error) {
	o := ix.o
	if err := ix.checkOpenSpace(); err != nil {
		return nil, err
	}
	in := &instance{gate: &gate{fault: o.WriteFault}, ready: make(chan struct{}), failed: make(chan struct{}),
		retired: make(chan struct{})}
	cache := pebble.NewCache(o.CacheBytes)
	opts := &pebble.Options{
		Cache:                       cache,
		MemTableSize:                o.MemTableBytes,
		MemTableStopWritesThreshold: 2,
		MaxOpenFiles:                256,
		Logger:                      pebbleLogger{ix, in},
		EventListener:               ix.events(in),
		FS: walFS{FS: fencedFS{FS: indexFS{errorfs.Wrap(vfs.Default, in.gate)}, f: &in.gate.fence},
			failed: func(err error) { ix.fail(in, fmt.Errorf("write the key index's log: %w", err)) }},
		ReadOnly:           o.ReadOnly,
		FormatMajorVersion: pebble.FormatNewest,
	}
	opts.Levels[0].FilterPolicy = bloom.FilterPolicy(10)
	if o.Bulk {
		// No log either: a crash in a bulk load loses the memtables, and
		// the watermark, flushed with them, says what is left to replay.
		opts.DisableWAL = true
		opts.MemTableSize = 64 << 20
		opts.Cache = nil
		opts.CacheSize = 256 << 20
		opts.L0CompactionThreshold = 1 << 20
		opts.L0StopWritesThreshold = 1 << 20
		opts.DisableAutomaticCompactions = true
	}
	opts.EnsureDefaults()
	db, err := openPebble(ix.dir, opts, in)
	cache.Unref() // the DB holds its own reference (unless Bulk made its own)
	in.db = db
	close(in.ready)
	if err == nil {
		if ft := in.fault.Load(); ft != nil {
			err = ft.err
		}
	}
	if err != nil {
		if db != nil {
			ix.retireOpened(in)
		}
		return nil, err
	}
	if err := ix.checkFormat(in, o.ReadOnly); err != nil {
		ix.retireOpened(in)
		return nil, err
	}
	return in, nil
}

// retireOpened retires an instance whose open failed, and waits until
// it is closed or abandoned: a Repair that follows may move the
// directory aside and make a new one of the same name, and the failed
// instance's Close deletes its obsolete files by path (a MANIFEST-000001
// replaced during the open), which would then hit the new index's.
func (ix *Index) retireOpened(in *instance) {
	in.retire.Do(func() { go ix.retireInstance(in) })
	select {
	case <-in.retired:
	case <-time.After(closeWait + time.Second):
	}
}

// openPebble is pebble.Open with its panics turned into errors, and
// which gives up when the instance fails while it opens: Pebble's open
// waits for the flush of the logs it replays, which a full disk fails
// again and again. The open is then abandoned (its goroutines block at
// their next file operation).
func openPebble(dir string, opts *pebble.Options, in *instance) (*pebble.DB, error) {
	type result struct {
		db  *pebble.DB
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- result{err: fmt.Errorf("pebble panicked while opening: %v", r)}
			}
		}()
		db, err := pebble.Open(dir, opts)
		done <- result{db, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-in.failed:
		select {
		case r = <-done:
		case <-time.After(time.Second):
			in.gate.abandon()
			return nil, in.fault.Load().err
		}
	}
	if r.err != nil {
		// Whatever of the failed open still runs (a background job it
		// started) must not touch the directory a next instance uses.
		in.gate.abandon()
	}
	return r.db, r.err
}

// formatKey holds the layout version of the index (format); namespace
// prefixes start with a length byte of 1 to 64, so it collides with none.
var formatKey = []byte("\x00format")

// format is the layout this package writes and reads.
const format = "effect-ledger key index 1"

// ErrFormat: the directory holds an index of another layout, or a Pebble
// database that is not a key index.
var ErrFormat = errors.New("not a key index of this version")

// checkFormat stamps a new index with the format and refuses one with
// another.
func (ix *Index) checkFormat(in *instance, readOnly bool) error {
	return ix.useIn(in, false, func(db *pebble.DB) error {
		v, found, err := get(db, formatKey)
		if err != nil {
			return err
		}
		if found {
			if string(v) != format {
				return fmt.Errorf("%w: it says %q", ErrFormat, v)
			}
			return nil
		}
		it, err := db.NewIter(nil)
		if err != nil {
			return err
		}
		empty := !it.First()
		err = it.Error()
		_ = it.Close()
		if err != nil {
			return err
		}
		if !empty {
			return fmt.Errorf("%w: it holds data but no format", ErrFormat)
		}
		if readOnly {
			return nil
		}
		return ix.useIn(in, true, func(db *pebble.DB) error { return db.Set(formatKey, []byte(format), ix.durable()) })
	})
}

// Close flushes nothing: what was applied without a sync may be lost,
// which the watermark accounts for. A failed index is closed (or
// abandoned) by then, or shortly.
func (ix *Index) Close() error {
	in := ix.cur.Swap(nil)
	if in == nil {
		return nil
	}
	if in.fault.Load() != nil {
		select {
		case <-in.retired:
		case <-time.After(closeWait + time.Second):
		}
		return nil
	}
	var err error
	in.retire.Do(func() {
		defer close(in.retired)
		err = in.db.Close()
		in.gate.abandon() // closed: nothing of it may touch the directory again
	})
	if err != nil {
		return fmt.Errorf("close key index: %w", err)
	}
	return nil
}

// Dir is the index's directory.
func (ix *Index) Dir() string { return ix.dir }

// Compact flushes the memtables and compacts the whole index into its
// last level: the end of a bulk rebuild.
func (ix *Index) Compact(ctx context.Context) error {
	return ix.use(true, func(db *pebble.DB) error {
		if err := db.Flush(); err != nil {
			return fmt.Errorf("key index: flush: %w", err)
		}
		if err := db.Compact(ctx, []byte{0}, []byte{0xff, 0xff}, true); err != nil {
			return fmt.Errorf("key index: compact: %w", err)
		}
		return nil
	})
}

// durable is the write option of a write that must be on disk when it
// returns; in a bulk load, which has no log, Sync makes it so later.
func (ix *Index) durable() *pebble.WriteOptions {
	if ix.bulk {
		return pebble.NoSync
	}
	return pebble.Sync
}

// Sync makes everything applied so far durable (a clean stop, the end of
// a rebuild).
func (ix *Index) Sync() error {
	return ix.use(true, func(db *pebble.DB) error {
		if ix.bulk {
			if err := db.Flush(); err != nil {
				return fmt.Errorf("sync key index: %w", err)
			}
			return nil
		}
		if err := db.LogData(nil, pebble.Sync); err != nil {
			return fmt.Errorf("sync key index: %w", err)
		}
		return nil
	})
}

// Memory is the memory the index holds outside the Go heap: its block
// cache and memtables (0 while it is unusable).
func (ix *Index) Memory() int64 {
	var n int64
	_ = ix.use(false, func(db *pebble.DB) error {
		m := db.Metrics()
		n = m.BlockCache.Size + int64(m.MemTable.Size)
		return nil
	})
	return n
}

// DiskBytes is the size of the index's files (0 while it is unusable).
func (ix *Index) DiskBytes() uint64 {
	var n uint64
	_ = ix.use(false, func(db *pebble.DB) error {
		n = db.Metrics().DiskSpaceUsage()
		return nil
	})
	return n
}

// Drop removes everything of namespace ns, durably.
func (ix *Index) Drop(ns string) error {
	p := prefix(ns, 0)[:len(ns)+1]
	return ix.use(true, func(db *pebble.DB) error {
		if err := db.DeleteRange(p, upper(p), ix.durable()); err != nil {
			return fmt.Errorf("key index: drop %s: %w", ns, err)
		}
		return nil
	})
}

// Stats describes the LSM: its levels, compactions, caches and filters
// (Pebble's metrics report), for diagnosis.
func (ix *Index) Stats() string {
	s := ""
	if err := ix.use(false, func(db *pebble.DB) error {
		s = db.Metrics().String()
		return nil
	}); err != nil {
		return err.Error()
	}
	return s
}
