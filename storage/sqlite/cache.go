package sqlite

import (
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// keyCache is the writer's in-memory index of recently used keys, with the
// latest reserve and outcome receipt of each: what a decision reads. One
// serves every namespace of a ledger file (entries carry the namespace's
// id: 0 for the file's own tables), so that its budget is the file's,
// whatever the number of namespaces written; only the file's writer
// touches it, under its lock. SQLite stays the source of truth: a miss
// reads the database, and entries change only after a COMMIT. It is
// bounded both in keys and in bytes (an estimate of the Go heap its
// entries hold), so that large results cannot grow it past its budget.
type keyCache struct {
	max      int // keys
	maxBytes int // estimated bytes of keys and receipts held
	bytes    int
	keys     map[cacheKey]*ledger.KeyRecord
	receipts map[cacheSeq]*chain.Receipt // the ReserveSeq and FinalSeq receipts of cached keys
}

// cacheKey is a key of namespace ns (its id in the ledger file).
type cacheKey struct {
	ns  int64
	key string
}

// cacheSeq is a receipt of namespace ns.
type cacheSeq struct {
	ns  int64
	seq uint64
}

func newKeyCache(max, maxBytes int) *keyCache {
	return &keyCache{max: max, maxBytes: maxBytes, keys: make(map[cacheKey]*ledger.KeyRecord),
		receipts: make(map[cacheSeq]*chain.Receipt)}
}

// key returns namespace ns's cached record of key.
func (c *keyCache) key(ns int64, key string) (*ledger.KeyRecord, bool) {
	k, ok := c.keys[cacheKey{ns, key}]
	return k, ok
}

// receipt returns namespace ns's cached receipt seq.
func (c *keyCache) receipt(ns int64, seq uint64) (*chain.Receipt, bool) {
	r, ok := c.receipts[cacheSeq{ns, seq}]
	return r, ok
}

// drop forgets every entry of namespace ns (its key index was rebuilt, or
// it was forgotten).
func (c *keyCache) drop(ns int64) {
	for ck, k := range c.keys {
		if ck.ns == ns {
			c.dropReceipt(ns, k.ReserveSeq)
			c.dropReceipt(ns, k.FinalSeq)
			c.bytes -= keySize(k)
			delete(c.keys, ck)
		}
	}
}

// Estimated heap bytes of an entry: the struct, its map slot and its
// strings.
func keySize(k *ledger.KeyRecord) int {
	return 160 + 2*len(k.Key) + len(k.Tool) + len(k.Effect) + len(k.InputHash) + len(k.TokenHash)
}

func receiptSize(r *chain.Receipt) int {
	return 360 + len(r.Kind) + len(r.IdempotencyKey) + len(r.ExecutionID) + len(r.Tool) + len(r.Effect) +
		len(r.InputHash) + len(r.Outcome) + len(r.ExternalRef) + len(r.Result) + len(r.ErrorCode) +
		len(r.ErrorMessage) + len(r.Actor) + len(r.Note)
}

func (c *keyCache) putReceipt(ns int64, seq uint64, r *chain.Receipt) {
	cs := cacheSeq{ns, seq}
	if old, ok := c.receipts[cs]; ok {
		c.bytes -= receiptSize(old)
	}
	c.receipts[cs] = r
	c.bytes += receiptSize(r)
}

func (c *keyCache) dropReceipt(ns int64, seq uint64) {
	cs := cacheSeq{ns, seq}
	if r, ok := c.receipts[cs]; ok {
		c.bytes -= receiptSize(r)
		delete(c.receipts, cs)
	}
}

// merge takes in what a committed batch of namespace ns read and wrote.
func (c *keyCache) merge(ns int64, keys map[string]*ledger.KeyRecord, receipts map[uint64]*chain.Receipt) {
	if c.max <= 0 {
		return
	}
	for key, k := range keys {
		ck := cacheKey{ns, key}
		if old, ok := c.keys[ck]; ok {
			c.dropReceipts(ns, old, k)
			c.bytes -= keySize(old)
		}
		c.keys[ck] = k
		c.bytes += keySize(k)
		for _, seq := range [2]uint64{k.ReserveSeq, k.FinalSeq} {
			if r, ok := receipts[seq]; ok && seq != 0 {
				c.putReceipt(ns, seq, r)
			}
		}
	}
	if len(c.keys) > c.max {
		c.evict(len(c.keys) - c.max + c.max/10)
	}
	// Over the byte budget: evict a tenth of the keys at a time until under.
	for c.maxBytes > 0 && c.bytes > c.maxBytes && len(c.keys) > 0 {
		c.evict(1 + len(c.keys)/10)
	}
}

// dropReceipts forgets the receipts of old that next no longer points at.
func (c *keyCache) dropReceipts(ns int64, old, next *ledger.KeyRecord) {
	if old.ReserveSeq != next.ReserveSeq {
		c.dropReceipt(ns, old.ReserveSeq)
	}
	if old.FinalSeq != next.FinalSeq {
		c.dropReceipt(ns, old.FinalSeq)
	}
}

// evict drops n keys; map iteration order makes the choice random.
func (c *keyCache) evict(n int) {
	for ck, k := range c.keys {
		if n <= 0 {
			return
		}
		c.dropReceipt(ck.ns, k.ReserveSeq)
		c.dropReceipt(ck.ns, k.FinalSeq)
		c.bytes -= keySize(k)
		delete(c.keys, ck)
		n--
	}
}
