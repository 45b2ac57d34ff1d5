package sqlite

import (
	"fmt"
	"strings"
	"testing"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// recount is the cache's byte estimate recomputed from its maps.
func (c *keyCache) recount() int {
	n := 0
	for _, k := range c.keys {
		n += keySize(k)
	}
	for _, r := range c.receipts {
		n += receiptSize(r)
	}
	return n
}

func TestKeyCache_ByteBudget(t *testing.T) {
	const budget = 256 << 10
	c := newKeyCache(1_000_000, budget)
	big := `{"blob":"` + strings.Repeat("x", 4000) + `"}`
	seq := uint64(0)
	for batch := range 200 {
		keys := map[string]*ledger.KeyRecord{}
		receipts := map[uint64]*chain.Receipt{}
		for i := range 20 {
			key := fmt.Sprintf("key-%d-%d", batch, i%15) // some keys come back within a batch's run
			if batch%3 == 1 {
				key = fmt.Sprintf("key-%d-%d", batch-1, i%15) // and across batches: replace, not add
			}
			seq += 2
			keys[key] = &ledger.KeyRecord{Key: key, Tool: "t", Effect: "write", ReserveSeq: seq - 1, FinalSeq: seq}
			receipts[seq-1] = &chain.Receipt{Seq: seq - 1, Kind: chain.KindReserve, IdempotencyKey: key}
			receipts[seq] = &chain.Receipt{Seq: seq, Kind: chain.KindCommit, IdempotencyKey: key, Result: big}
		}
		c.merge(keys, receipts)
		if c.bytes > budget {
			t.Fatalf("batch %d: %d bytes held, budget %d", batch, c.bytes, budget)
		}
		if got := c.recount(); got != c.bytes {
			t.Fatalf("batch %d: byte count %d, recomputed %d", batch, c.bytes, got)
		}
		for _, k := range c.keys {
			if _, ok := c.receipts[k.FinalSeq]; !ok {
				t.Fatalf("batch %d: key %s cached without its outcome receipt", batch, k.Key)
			}
		}
		if len(c.receipts) > 2*len(c.keys) {
			t.Fatalf("batch %d: %d receipts for %d keys (orphans kept)", batch, len(c.receipts), len(c.keys))
		}
	}
	if len(c.keys) == 0 {
		t.Fatal("the budget evicted everything")
	}
}

func TestKeyCache_KeysBoundWithoutByteBudget(t *testing.T) {
	c := newKeyCache(100, -1)
	for i := range 1000 {
		k := &ledger.KeyRecord{Key: fmt.Sprint("k", i), ReserveSeq: uint64(i + 1)}
		c.merge(map[string]*ledger.KeyRecord{k.Key: k}, map[uint64]*chain.Receipt{k.ReserveSeq: {Seq: k.ReserveSeq}})
		if len(c.keys) > 100 {
			t.Fatalf("%d keys held, bound 100", len(c.keys))
		}
	}
	if got := c.recount(); got != c.bytes {
		t.Fatalf("byte count %d, recomputed %d", c.bytes, got)
	}
}
