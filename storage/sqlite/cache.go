package sqlite

import (
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// keyCache is the writer's in-memory index of recently used keys, with the
// latest reserve and outcome receipt of each: what a decision reads. Only
// the writer goroutine touches it. SQLite stays the source of truth: a
// miss reads the database, and entries change only after a COMMIT.
type keyCache struct {
	max      int
	keys     map[string]*ledger.KeyRecord
	receipts map[uint64]*chain.Receipt // the ReserveSeq and FinalSeq receipts of cached keys
}

func newKeyCache(max int) *keyCache {
	return &keyCache{max: max, keys: make(map[string]*ledger.KeyRecord), receipts: make(map[uint64]*chain.Receipt)}
}

// merge takes in what a committed batch read and wrote.
func (c *keyCache) merge(keys map[string]*ledger.KeyRecord, receipts map[uint64]*chain.Receipt) {
	if c.max <= 0 {
		return
	}
	for key, k := range keys {
		if old, ok := c.keys[key]; ok {
			c.dropReceipts(old, k)
		}
		c.keys[key] = k
		for _, seq := range [2]uint64{k.ReserveSeq, k.FinalSeq} {
			if r, ok := receipts[seq]; ok && seq != 0 {
				c.receipts[seq] = r
			}
		}
	}
	if len(c.keys) > c.max {
		c.evict(len(c.keys) - c.max + c.max/10)
	}
}

// dropReceipts forgets the receipts of old that next no longer points at.
func (c *keyCache) dropReceipts(old, next *ledger.KeyRecord) {
	if old.ReserveSeq != next.ReserveSeq {
		delete(c.receipts, old.ReserveSeq)
	}
	if old.FinalSeq != next.FinalSeq {
		delete(c.receipts, old.FinalSeq)
	}
}

// evict drops n keys; map iteration order makes the choice random.
func (c *keyCache) evict(n int) {
	for key, k := range c.keys {
		if n <= 0 {
			return
		}
		delete(c.receipts, k.ReserveSeq)
		delete(c.receipts, k.FinalSeq)
		delete(c.keys, key)
		n--
	}
}
