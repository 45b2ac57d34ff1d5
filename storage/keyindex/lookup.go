package keyindex

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// get reads one value; found false when k is absent.
func get(r pebble.Reader, k []byte) ([]byte, bool, error) {
	v, closer, err := r.Get(k)
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

// get reads one value of the index.
func (ix *Index) get(k []byte) (v []byte, found bool, err error) {
	err = ix.use(false, func(db *pebble.DB) error {
		v, found, err = get(db, k)
		return err
	})
	return v, found, err
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

// errCallback carries an error of a caller's function out of use, which
// must not take it for the index's.
type errCallback struct{ err error }

func (e errCallback) Error() string { return e.err.Error() }
func (e errCallback) Unwrap() error { return e.err }

// unwrapCallback returns the caller's error that errCallback carried.
func unwrapCallback(err error) error {
	var cb errCallback
	if errors.As(err, &cb) {
		return cb.err
	}
	return err
}

// Keys calls fn for every key record of ns, in key byte order.
func (ix *Index) Keys(ns string, fn func(*ledger.KeyRecord) error) error {
	p := prefix(ns, tagRecord)
	err := ix.use(false, func(db *pebble.DB) error {
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: upper(p)})
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
				return errCallback{err}
			}
		}
		if err := it.Error(); err != nil {
			return fmt.Errorf("key index: %w", err)
		}
		return nil
	})
	return unwrapCallback(err)
}

// Seqs calls fn with the seqs after after of the posting list of value in
// f, in seq order, until fn returns false.
func (ix *Index) Seqs(ns string, f Field, value string, after uint64, fn func(seq uint64, v []byte) (bool, error)) error {
	p := postingPrefix(ns, f, value)
	err := ix.use(false, func(db *pebble.DB) error {
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: upper(p)})
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
			if err != nil {
				return errCallback{err}
			}
			if !more {
				return nil
			}
		}
		if err := it.Error(); err != nil {
			return fmt.Errorf("key index: %w", err)
		}
		return nil
	})
	return unwrapCallback(err)
}

// LastSeq returns the seq of key's latest receipt.
func (ix *Index) LastSeq(ns, key string) (seq uint64, found bool, err error) {
	p := postingPrefix(ns, ByKey, key)
	err = ix.use(false, func(db *pebble.DB) error {
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: upper(p)})
		if err != nil {
			return fmt.Errorf("key index: %w", err)
		}
		defer func() { _ = it.Close() }()
		if !it.Last() {
			if err := it.Error(); err != nil {
				return fmt.Errorf("key index: %w", err)
			}
			return nil
		}
		seq, found = binary.BigEndian.Uint64(it.Key()[len(p):]), true
		return nil
	})
	return seq, found, err
}

// KeySeqs returns the record of key and the seqs of all its receipts,
// read from one snapshot of the index.
func (ix *Index) KeySeqs(ns, key string) (k ledger.KeyRecord, seqs []uint64, found bool, err error) {
	k = ledger.KeyRecord{Key: key}
	err = ix.use(false, func(db *pebble.DB) error {
		snap := db.NewSnapshot()
		defer func() { _ = snap.Close() }()
		v, ok, err := get(snap, append(prefix(ns, tagRecord), key...))
		if err != nil || !ok {
			return err
		}
		if err := decodeRecord(v, &k); err != nil {
			return fmt.Errorf("key index: record of %q: %w", key, err)
		}
		p := postingPrefix(ns, ByKey, key)
		it, err := snap.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: upper(p)})
		if err != nil {
			return fmt.Errorf("key index: %w", err)
		}
		defer func() { _ = it.Close() }()
		for ok := it.First(); ok; ok = it.Next() {
			seqs = append(seqs, binary.BigEndian.Uint64(it.Key()[len(p):]))
		}
		if err := it.Error(); err != nil {
			return fmt.Errorf("key index: %w", err)
		}
		found = true
		return nil
	})
	if err != nil || !found {
		return k, nil, false, err
	}
	return k, seqs, true, nil
}
