package postgres

import (
	"sync"

	"github.com/effect-ledger/effect-ledger/tlog"
)

// treeCacheMax bounds the tree hashes cached per namespace. The next leaf
// needs only the O(log n) roots of the complete subtrees to its left, all
// written recently or read once: the cache is simply emptied when full.
const treeCacheMax = 4096

// treeCache holds tree hashes of one namespace from committed
// transactions. A stored tree hash never changes, so a cached one is
// always right, whoever wrote it.
type treeCache struct {
	mu sync.Mutex
	m  map[int64]tlog.Hash
}

func (s *Store) treeCache(ns string) *treeCache {
	s.mu.Lock()
	defer s.mu.Unlock()
	tc, ok := s.trees[ns]
	if !ok {
		tc = &treeCache{m: map[int64]tlog.Hash{}}
		s.trees[ns] = tc
	}
	return tc
}

func (c *treeCache) get(idx int64) (tlog.Hash, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.m[idx]
	return h, ok
}

func (c *treeCache) room(n int) {
	if len(c.m)+n > treeCacheMax {
		clear(c.m)
	}
}

// add caches hs, the hashes from index from on.
func (c *treeCache) add(from int64, hs []tlog.Hash) {
	if len(hs) == 0 || len(hs) > treeCacheMax {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.room(len(hs))
	for i := range hs {
		c.m[from+int64(i)] = hs[i]
	}
}

func (c *treeCache) addMap(hs map[int64]tlog.Hash) {
	if len(hs) > treeCacheMax {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.room(len(hs))
	for k, v := range hs {
		c.m[k] = v
	}
}

// fill adds hs, read from the table, to the cache and sets them in out,
// whose entries are those of idx.
func (c *treeCache) fill(out []tlog.Hash, idx []int64, hs map[int64]tlog.Hash) {
	c.addMap(hs)
	for i, x := range idx {
		if h, ok := hs[x]; ok {
			out[i] = h
		}
	}
}
