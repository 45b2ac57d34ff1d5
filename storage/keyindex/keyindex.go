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
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Field names a posting list of receipts.
type Field byte

// The posting lists.
const (
	ByKey       Field = 'K'
	ByExecution Field = 'e'
	ByTool      Field = 't'
	ByKind      Field = 'c'
)

const (
	tagWatermark = 'w'
	tagRecord    = 'k'
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
}

// Index is an open key index.
type Index struct {
	db   *pebble.DB
	dir  string
	bulk bool // opened with Options.Bulk: no log
}

// Open opens or creates the index in dir.
func Open(dir string, o Options) (*Index, error) {
	if o.CacheBytes <= 0 {
		o.CacheBytes = 16 << 20
	}
	if o.MemTableBytes == 0 {
		o.MemTableBytes = 2 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	cache := pebble.NewCache(o.CacheBytes)
	opts := &pebble.Options{
		Cache:                       cache,
		MemTableSize:                o.MemTableBytes,
		MemTableStopWritesThreshold: 2,
		MaxOpenFiles:                256,
		Logger:                      pebbleLogger{o.Logger},
		ReadOnly:                    o.ReadOnly,
		FormatMajorVersion:          pebble.FormatNewest,
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
	db, err := pebble.Open(dir, opts)
	cache.Unref() // the DB holds its own reference (unless Bulk made its own)
	if err != nil {
		return nil, fmt.Errorf("open key index %s: %w", dir, err)
	}
	ix := &Index{db: db, dir: dir, bulk: o.Bulk}
	if err := ix.checkFormat(o.ReadOnly); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open key index %s: %w", dir, err)
	}
	return ix, nil
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
func (ix *Index) checkFormat(readOnly bool) error {
	v, found, err := ix.get(formatKey)
	if err != nil {
		return err
	}
	if found {
		if string(v) != format {
			return fmt.Errorf("%w: it says %q", ErrFormat, v)
		}
		return nil
	}
	it, err := ix.db.NewIter(nil)
	if err != nil {
		return err
	}
	empty := !it.First()
	_ = it.Close()
	if !empty {
		return fmt.Errorf("%w: it holds data but no format", ErrFormat)
	}
	if readOnly {
		return nil
	}
	return ix.db.Set(formatKey, []byte(format), ix.durable())
}

// Close flushes nothing: what was applied without a sync may be lost,
// which the watermark accounts for.
func (ix *Index) Close() error {
	if err := ix.db.Close(); err != nil {
		return fmt.Errorf("close key index: %w", err)
	}
	return nil
}

// Dir is the index's directory.
func (ix *Index) Dir() string { return ix.dir }

// Compact flushes the memtables and compacts the whole index into its
// last level: the end of a bulk rebuild.
func (ix *Index) Compact(ctx context.Context) error {
	if err := ix.db.Flush(); err != nil {
		return fmt.Errorf("key index: flush: %w", err)
	}
	if err := ix.db.Compact(ctx, []byte{0}, []byte{0xff, 0xff}, true); err != nil {
		return fmt.Errorf("key index: compact: %w", err)
	}
	return nil
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
	if ix.bulk {
		if err := ix.db.Flush(); err != nil {
			return fmt.Errorf("sync key index: %w", err)
		}
		return nil
	}
	if err := ix.db.LogData(nil, pebble.Sync); err != nil {
		return fmt.Errorf("sync key index: %w", err)
	}
	return nil
}

// Memory is the memory the index holds outside the Go heap: its block
// cache and memtables.
func (ix *Index) Memory() int64 {
	m := ix.db.Metrics()
	return m.BlockCache.Size + int64(m.MemTable.Size)
}

// DiskBytes is the size of the index's files.
func (ix *Index) DiskBytes() uint64 {
	m := ix.db.Metrics()
	return m.DiskSpaceUsage()
}

// prefix is the key prefix of namespace ns with tag.
func prefix(ns string, tag byte) []byte {
	b := make([]byte, 0, len(ns)+2+48)
	b = append(b, byte(len(ns)))
	b = append(b, ns...)
	return append(b, tag)
}

// esc appends field, escaped and terminated, to b.
func esc(b []byte, field string) []byte {
	for i := 0; i < len(field); i++ {
		if field[i] == 0 {
			b = append(b, 0, 0xff)
			continue
		}
		b = append(b, field[i])
	}
	return append(b, 0, 1)
}

// postingPrefix is the prefix of the posting list of value in f.
func postingPrefix(ns string, f Field, value string) []byte {
	b := prefix(ns, byte(f))
	if f == ByKind {
		return append(b, kindByte(value))
	}
	return esc(b, value)
}

func kindByte(kind string) byte {
	switch kind {
	case chain.KindReserve:
		return 'r'
	case chain.KindCommit:
		return 'c'
	case chain.KindReplay:
		return 'p'
	case chain.KindResolve:
		return 's'
	}
	return '?'
}

func appendSeq(b []byte, seq uint64) []byte { return binary.BigEndian.AppendUint64(b, seq) }

// upper is the smallest key after every key that starts with p.
func upper(p []byte) []byte {
	u := bytes.Clone(p)
	for i := len(u) - 1; i >= 0; i-- {
		if u[i] < 0xff {
			u[i]++
			return u[:i+1]
		}
	}
	return nil // p is all 0xff: no upper bound
}

// get reads one value; found false when k is absent.
func (ix *Index) get(k []byte) ([]byte, bool, error) {
	v, closer, err := ix.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("key index: %w", err)
	}
	out := bytes.Clone(v)
	_ = closer.Close()
	return out, true, nil
}

// Watermark returns the head of namespace ns that the index reflects;
// found false when the index holds nothing of ns.
func (ix *Index) Watermark(ns string) (ledger.Head, bool, error) {
	v, found, err := ix.get(prefix(ns, tagWatermark))
	if err != nil || !found {
		return ledger.Head{}, found, err
	}
	if len(v) != 40 {
		return ledger.Head{}, false, fmt.Errorf("key index: watermark of %s is %d bytes, want 40", ns, len(v))
	}
	h := ledger.Head{Seq: binary.BigEndian.Uint64(v)}
	copy(h.Hash[:], v[8:])
	return h, true, nil
}

// Key returns the record of key in ns, without its fingerprint (Tool,
// Effect, InputHash: the first reserve's).
func (ix *Index) Key(ns, key string) (ledger.KeyRecord, bool, error) {
	k := ledger.KeyRecord{Key: key}
	v, found, err := ix.get(append(prefix(ns, tagRecord), key...))
	if err != nil || !found {
		return k, found, err
	}
	if err := decodeRecord(v, &k); err != nil {
		return k, false, fmt.Errorf("key index: record of %q: %w", key, err)
	}
	return k, true, nil
}

// Keys calls fn for every key record of ns, in key byte order.
func (ix *Index) Keys(ns string, fn func(*ledger.KeyRecord) error) error {
	p := prefix(ns, tagRecord)
	it, err := ix.db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: upper(p)})
	if err != nil {
		return fmt.Errorf("key index: %w", err)
	}
	defer func() { _ = it.Close() }()
	for ok := it.First(); ok; ok = it.Next() {
		k := ledger.KeyRecord{Key: string(it.Key()[len(p):])}
		if err := decodeRecord(it.Value(), &k); err != nil {
			return fmt.Errorf("key index: record of %q: %w", k.Key, err)
		}
		if err := fn(&k); err != nil {
			return err
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("key index: %w", err)
	}
	return nil
}

// Seqs calls fn with the seqs after after of the posting list of value in
// f, in seq order, until fn returns false.
func (ix *Index) Seqs(ns string, f Field, value string, after uint64, fn func(seq uint64, v []byte) (bool, error)) error {
	p := postingPrefix(ns, f, value)
	it, err := ix.db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: upper(p)})
	if err != nil {
		return fmt.Errorf("key index: %w", err)
	}
	defer func() { _ = it.Close() }()
	for ok := it.SeekGE(appendSeq(bytes.Clone(p), after+1)); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != len(p)+8 {
			return fmt.Errorf("key index: posting key of %d bytes under a %d-byte prefix", len(k), len(p))
		}
		more, err := fn(binary.BigEndian.Uint64(k[len(p):]), it.Value())
		if err != nil || !more {
			return err
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("key index: %w", err)
	}
	return nil
}

// LastSeq returns the seq of key's latest receipt.
func (ix *Index) LastSeq(ns, key string) (uint64, bool, error) {
	p := postingPrefix(ns, ByKey, key)
	it, err := ix.db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: upper(p)})
	if err != nil {
		return 0, false, fmt.Errorf("key index: %w", err)
	}
	defer func() { _ = it.Close() }()
	if !it.Last() {
		return 0, false, it.Error()
	}
	return binary.BigEndian.Uint64(it.Key()[len(p):]), true, nil
}

// Drop removes everything of namespace ns, durably.
func (ix *Index) Drop(ns string) error {
	p := prefix(ns, 0)[:len(ns)+1]
	if err := ix.db.DeleteRange(p, upper(p), ix.durable()); err != nil {
		return fmt.Errorf("key index: drop %s: %w", ns, err)
	}
	return nil
}

// pebbleLogger sends Pebble's messages to slog: its routine notices at
// debug level, its errors as errors.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...), "component", "key index")
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "key index")
}

func (p pebbleLogger) Fatalf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "key index")
	panic(fmt.Sprintf(format, args...))
}

// KeySeqs returns the record of key and the seqs of all its receipts,
// read from one snapshot of the index.
func (ix *Index) KeySeqs(ns, key string) (ledger.KeyRecord, []uint64, bool, error) {
	k := ledger.KeyRecord{Key: key}
	snap := ix.db.NewSnapshot()
	defer func() { _ = snap.Close() }()
	v, closer, err := snap.Get(append(prefix(ns, tagRecord), key...))
	if errors.Is(err, pebble.ErrNotFound) {
		return k, nil, false, nil
	}
	if err != nil {
		return k, nil, false, fmt.Errorf("key index: %w", err)
	}
	err = decodeRecord(v, &k)
	_ = closer.Close()
	if err != nil {
		return k, nil, false, fmt.Errorf("key index: record of %q: %w", key, err)
	}
	p := postingPrefix(ns, ByKey, key)
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: upper(p)})
	if err != nil {
		return k, nil, false, fmt.Errorf("key index: %w", err)
	}
	defer func() { _ = it.Close() }()
	var seqs []uint64
	for ok := it.First(); ok; ok = it.Next() {
		seqs = append(seqs, binary.BigEndian.Uint64(it.Key()[len(p):]))
	}
	if err := it.Error(); err != nil {
		return k, nil, false, fmt.Errorf("key index: %w", err)
	}
	return k, seqs, true, nil
}

// Stats describes the LSM: its levels, compactions, caches and filters
// (Pebble's metrics report), for diagnosis.
func (ix *Index) Stats() string { return ix.db.Metrics().String() }
