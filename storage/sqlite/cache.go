package sqlite

import (
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// keyCache is the writer's in-memory index of recently used keys, with the
// latest reserve and outcome receipt of each: what a decision reads. Only
// the writer goroutine touches it. SQLite stays the source of truth: a
// miss reads the database, and entries change only after a COMMIT. It is
// bounded both in keys and in bytes (an estimate of the Go heap its
// entries hold), so that large results cannot grow it past its budget.
type keyCache struct {
	max      int // keys
	maxBytes int // estimated bytes of keys and receipts held
	bytes    int
	keys     map[string]*ledger.KeyRecord
	receipts map[uint64]*chain.Receipt // the ReserveSeq and FinalSeq receipts of cached keys
}

func newKeyCache(max, maxBytes int) *keyCache {
	return &keyCache{max: max, maxBytes: maxBytes, keys: make(map[string]*ledger.KeyRecord),
		receipts: make(map[uint64]*chain.Receipt)}
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

func (c *keyCache) putReceipt(seq uint64, r *chain.Receipt) {
	if old, ok := c.receipts[seq]; ok {
		c.bytes -= receiptSize(old)
	}
	c.receipts[seq] = r
	c.bytes += receiptSize(r)
}

func (c *keyCache) dropReceipt(seq uint64) {
	if r, ok := c.receipts[seq]; ok {
		c.bytes -= receiptSize(r)
		delete(c.receipts, seq)
	}
}

// merge takes in what a committed batch read and wrote.
func (c *keyCache) merge(keys map[string]*ledger.KeyRecord, receipts map[uint64]*chain.Receipt) {
	if c.max <= 0 {
		return
	}
	for key, k := range keys {
		if old, ok := c.keys[key]; ok {
			c.dropReceipts(old, k)
			c.bytes -= keySize(old)
		}
		c.keys[key] = k
		c.bytes += keySize(k)
		for _, seq := range [2]uint64{k.ReserveSeq, k.FinalSeq} {
			if r, ok := receipts[seq]; ok && seq != 0 {
				c.putReceipt(seq, r)
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
func (c *keyCache) dropReceipts(old, next *ledger.KeyRecord) {
	if old.ReserveSeq != next.ReserveSeq {
		c.dropReceipt(old.ReserveSeq)
	}
	if old.FinalSeq != next.FinalSeq {
		c.dropReceipt(old.FinalSeq)
	}
}

// evict drops n keys; map iteration order makes the choice random.
func (c *keyCache) evict(n int) {
	for key, k := range c.keys {
		if n <= 0 {
			return
		}
		c.dropReceipt(k.ReserveSeq)
		c.dropReceipt(k.FinalSeq)
		c.bytes -= keySize(k)
		delete(c.keys, key)
		n--
	}
}
