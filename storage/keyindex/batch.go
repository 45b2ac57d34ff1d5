package keyindex

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Batch is what one committed write transaction of a namespace adds to
// the index: the posting entries of its receipts, the key records it
// wrote and the new watermark, applied at once.
type Batch struct {
	ix  *Index
	in  *instance // the instance the batch is for; nil: the index was unusable
	ns  string
	b   *pebble.Batch
	buf []byte
}

// NewBatch starts a batch of namespace ns. On an unusable index the
// batch takes nothing, and Commit fails.
func (ix *Index) NewBatch(ns string) *Batch {
	b := &Batch{ix: ix, ns: ns}
	if in := ix.cur.Load(); in != nil && in.fault.Load() == nil {
		b.in, b.b = in, in.db.NewBatch()
	}
	return b
}

// For makes the entries added next, and the next Watermark, namespace
// ns's: one batch can carry the batches of several namespaces that
// committed in one transaction (Commit applies them at once).
func (b *Batch) For(ns string) { b.ns = ns }

// Watermark sets the current namespace's watermark to head in the batch
// (Commit sets the last namespace's).
func (b *Batch) Watermark(head ledger.Head) error {
	if b.b == nil {
		return nil
	}
	w := appendSeq(make([]byte, 0, 40), head.Seq)
	w = append(w, head.Hash[:]...)
	if err := b.b.Set(prefix(b.ns, tagWatermark), w, nil); err != nil {
		return fmt.Errorf("key index: %w", err)
	}
	return nil
}

// Apply applies the batch, watermarks included, without waiting for the
// disk.
func (b *Batch) Apply() error {
	if b.b == nil {
		return fmt.Errorf("key index: apply: %w", b.ix.Err())
	}
	if err := b.ix.useIn(b.in, true, func(*pebble.DB) error { return b.b.Commit(pebble.NoSync) }); err != nil {
		return fmt.Errorf("key index: apply: %w", err)
	}
	return nil
}

// Len is the size of the batch's representation in bytes.
func (b *Batch) Len() int {
	if b.b == nil {
		return 0
	}
	return b.b.Len()
}

// Receipt adds r to the posting lists of its key, execution, tool and
// kind.
func (b *Batch) Receipt(r *chain.Receipt) error {
	if b.b == nil {
		return nil
	}
	k := appendSeq(postingPrefix(b.ns, ByKey, r.IdempotencyKey), r.Seq)
	if err := b.b.Set(k, nil, nil); err != nil {
		return err
	}
	if err := b.b.Set(appendSeq(postingPrefix(b.ns, ByExecution, r.ExecutionID), r.Seq), nil, nil); err != nil {
		return err
	}
	if err := b.b.Set(appendSeq(postingPrefix(b.ns, ByTool, r.Tool), r.Seq), nil, nil); err != nil {
		return err
	}
	return b.b.Set(appendSeq(postingPrefix(b.ns, ByKind, r.Kind), r.Seq), nil, nil)
}

// PutKey adds the latest record of a key.
func (b *Batch) PutKey(k *ledger.KeyRecord) error {
	if b.b == nil {
		return nil
	}
	b.buf = encodeRecord(b.buf[:0], k)
	return b.b.Set(append(prefix(b.ns, tagRecord), k.Key...), b.buf, nil)
}

// Commit applies the batch with head as the namespace's watermark,
// without waiting for the disk.
func (b *Batch) Commit(head ledger.Head) error {
	if b.b == nil {
		return fmt.Errorf("key index: apply: %w", b.ix.Err())
	}
	if err := b.Watermark(head); err != nil {
		return err
	}
	return b.Apply()
}

// Close releases the batch (after Commit, or to drop it). A second Close
// does nothing: Pebble pools its batches, and closing one twice would
// release it from under whoever the pool handed it to next.
func (b *Batch) Close() {
	if b.b != nil {
		pb := b.b
		b.b = nil
		defer func() { _ = recover() }() // a batch whose commit panicked: its memory is all Close frees
		_ = pb.Close()
	}
}

// encodeRecord appends k's fields to b: a flags byte, four uvarints and
// the length-prefixed token hash. The key is the entry's key, and the
// fingerprint (tool, effect, input hash) is left out: it is the first
// reserve's, which the reader fills in from the receipt at FirstSeq
// (every pair rewrites the record twice, and an LSM rewrites each version
// again as it compacts, so the record is kept small).
func encodeRecord(b []byte, k *ledger.KeyRecord) []byte {
	var flags byte
	if k.Generated {
		flags |= 1
	}
	if k.Idempotent {
		flags |= 2
	}
	b = append(b, flags)
	for _, n := range []uint64{k.FirstSeq, k.ReserveSeq, k.LeaseExpiresAt, k.FinalSeq} {
		b = binary.AppendUvarint(b, n)
	}
	b = binary.AppendUvarint(b, uint64(len(k.TokenHash)))
	return append(b, k.TokenHash...)
}

var errRecord = errors.New("malformed key record")

// decodeRecord reads what encodeRecord wrote into k (Tool, Effect and
// InputHash stay as they are).
func decodeRecord(v []byte, k *ledger.KeyRecord) error {
	if len(v) < 1 || v[0] > 3 {
		return errRecord
	}
	k.Generated, k.Idempotent = v[0]&1 != 0, v[0]&2 != 0
	v = v[1:]
	for _, dst := range []*uint64{&k.FirstSeq, &k.ReserveSeq, &k.LeaseExpiresAt, &k.FinalSeq} {
		n, w := binary.Uvarint(v)
		if w <= 0 {
			return errRecord
		}
		*dst, v = n, v[w:]
	}
	n, w := binary.Uvarint(v)
	if w <= 0 || uint64(len(v)-w) != n {
		return errRecord
	}
	k.TokenHash = string(v[w:])
	return nil
}
