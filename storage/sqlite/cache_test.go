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
		c.merge(1, keys, receipts)
		if c.bytes > budget {
			t.Fatalf("batch %d: %d bytes held, budget %d", batch, c.bytes, budget)
		}
		if got := c.recount(); got != c.bytes {
			t.Fatalf("batch %d: byte count %d, recomputed %d", batch, c.bytes, got)
		}
		for _, k := range c.keys {
			if _, ok := c.receipt(1, k.FinalSeq); !ok {
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
		c.merge(0, map[string]*ledger.KeyRecord{k.Key: k}, map[uint64]*chain.Receipt{k.ReserveSeq: {Seq: k.ReserveSeq}})
		if len(c.keys) > 100 {
			t.Fatalf("%d keys held, bound 100", len(c.keys))
		}
	}
	if got := c.recount(); got != c.bytes {
		t.Fatalf("byte count %d, recomputed %d", c.bytes, got)
	}
}

// TestKeyCache_Namespaces: one cache serves every namespace of a file;
// a key or a seq of one namespace is never another's, and drop forgets one
// namespace only.
func TestKeyCache_Namespaces(t *testing.T) {
	c := newKeyCache(100, -1)
	for ns := range int64(3) {
		k := &ledger.KeyRecord{Key: "same-key", Tool: fmt.Sprint("tool-", ns), ReserveSeq: 1}
		c.merge(ns, map[string]*ledger.KeyRecord{k.Key: k},
			map[uint64]*chain.Receipt{1: {Seq: 1, Tool: k.Tool}})
	}
	for ns := range int64(3) {
		k, ok := c.key(ns, "same-key")
		if !ok || k.Tool != fmt.Sprint("tool-", ns) {
			t.Fatalf("namespace %d: %+v, %v", ns, k, ok)
		}
		if r, ok := c.receipt(ns, 1); !ok || r.Tool != k.Tool {
			t.Fatalf("namespace %d: receipt %+v, %v", ns, r, ok)
		}
	}
	c.drop(1)
	if _, ok := c.key(1, "same-key"); ok {
		t.Fatal("dropped namespace still cached")
	}
	if _, ok := c.receipt(1, 1); ok {
		t.Fatal("dropped namespace's receipt still cached")
	}
	for _, ns := range []int64{0, 2} {
		if _, ok := c.key(ns, "same-key"); !ok {
			t.Fatalf("namespace %d lost by another's drop", ns)
		}
	}
	if got := c.recount(); got != c.bytes {
		t.Fatalf("byte count %d, recomputed %d", c.bytes, got)
	}
}
