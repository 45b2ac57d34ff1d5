package keyindex

import (
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Deriver replays a namespace's receipts, in seq order, into the index:
// the posting lists and the key records they determine. It is how the
// index catches up with a chain (a tail it lacks) and how it is rebuilt
// (every receipt, after Drop).
//
// A key record follows SPEC §4 and §12 as the keys table of earlier
// schemas did: the fingerprint and flags come from the first reserve of
// the key's current generation — its first reserve, or the latest reserve
// that has no ref_seq or renews the key (names a replay of the key, or an
// outcome of the key at least key_ttl_ms older than itself); the lease
// and the token hash from the latest reserve; final_seq is the latest
// commit or resolve after the generation's first reserve.
type Deriver struct {
	ix   *Index
	ns   string
	ttl  uint64
	src  DeriveSource
	recs map[string]*ledger.KeyRecord // written since the last flush
	b    *Batch
	head ledger.Head
	n    int64
}

// DeriveSource is what a Deriver reads beside the receipts it is given.
type DeriveSource interface {
	// Receipt reads the receipt at seq (the one a reserve's ref_seq
	// names), or nil if the file has none there.
	Receipt(seq uint64) (*chain.Receipt, error)
	// TokenHash returns the reservation token hash stored with the
	// reserve at seq ("" if none). Calls come in increasing seq order.
	TokenHash(seq uint64) (string, error)
}

// flushBytes and flushKeys bound the batch and the records a Deriver
// holds in memory.
const (
	flushBytes = 256 << 10 // well under half a memtable: applied through the memtable, not as a flushable batch
	flushKeys  = 32 << 10
)

// NewDeriver starts a replay of namespace ns, whose keys expire after
// ttl ms, onto the index's content (head is its watermark, zero after
// Drop).
func (ix *Index) NewDeriver(ns string, ttl uint64, head ledger.Head, src DeriveSource) *Deriver {
	return &Deriver{ix: ix, ns: ns, ttl: ttl, src: src, head: head,
		recs: map[string]*ledger.KeyRecord{}, b: ix.NewBatch(ns)}
}

// Applied is the number of receipts applied.
func (d *Deriver) Applied() int64 { return d.n }

// Apply replays the next receipt, whose seq must be above the last one
// applied (a gap is the verifier's to report). Its links are not checked: the index reflects what the file
// holds, and checking the chain is the verifier's job (a ledger whose
// chain was edited is still served, and its audit says so).
func (d *Deriver) Apply(r *chain.Receipt) error {
	if r.Seq <= d.head.Seq {
		return fmt.Errorf("key index: receipt %d follows %d", r.Seq, d.head.Seq)
	}
	if err := d.b.Receipt(r); err != nil {
		return fmt.Errorf("key index: %w", err)
	}
	if err := d.applyKey(r); err != nil {
		return err
	}
	d.head = ledger.Head{Seq: r.Seq, Hash: r.Hash}
	d.n++
	if d.b.Len() >= flushBytes || len(d.recs) >= flushKeys {
		return d.flush()
	}
	return nil
}

func (d *Deriver) applyKey(r *chain.Receipt) error {
	if r.Kind == chain.KindReplay {
		return nil
	}
	var k *ledger.KeyRecord
	found := false
	if r.Kind == chain.KindReserve && r.RefSeq == 0 {
		// A reserve without ref_seq starts the key's generation whatever
		// came before: no need to read the record it replaces.
		k = &ledger.KeyRecord{}
	} else {
		var err error
		if k, found, err = d.record(r.IdempotencyKey); err != nil {
			return err
		}
	}
	changed, err := ledger.NextRecord(k, found, r, d.ttl, d.src.Receipt)
	if err != nil || !changed {
		return err
	}
	if r.Kind == chain.KindReserve {
		if k.TokenHash, err = d.src.TokenHash(r.Seq); err != nil {
			return fmt.Errorf("key index: token of reserve %d: %w", r.Seq, err)
		}
	}
	d.recs[k.Key] = k
	return nil
}

// record returns the working record of key: this flush's, the index's,
// or a new one (found false).
func (d *Deriver) record(key string) (*ledger.KeyRecord, bool, error) {
	if k, ok := d.recs[key]; ok {
		return k, true, nil
	}
	k, found, err := d.ix.Key(d.ns, key)
	if err != nil {
		return nil, false, err
	}
	return &k, found, nil
}

// flush applies what was derived so far with its watermark.
func (d *Deriver) flush() error {
	for _, k := range d.recs {
		if err := d.b.PutKey(k); err != nil {
			return fmt.Errorf("key index: %w", err)
		}
	}
	err := d.b.Commit(d.head)
	d.b.Close()
	d.b = d.ix.NewBatch(d.ns)
	clear(d.recs)
	return err
}

// Finish applies the rest and makes the index durable; the head applied
// is then the namespace's watermark.
func (d *Deriver) Finish() (ledger.Head, error) {
	// The batch flush leaves open, not the one open now: flush closes
	// that one (a deferred d.b.Close() would close it a second time).
	defer func() { d.b.Close() }()
	if err := d.flush(); err != nil {
		return d.head, err
	}
	return d.head, d.ix.Sync()
}
