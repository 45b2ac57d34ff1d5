package keyindex

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Prune deletes, durably, the posting entries of the receipts rs of
// namespace ns, whose bodies a prune deletes (SPEC §16), and the records
// of their keys whose current generation starts at or before through
// (the key is new to the ledger once its receipts are gone). Only the
// fields the postings use are read of rs.
func (ix *Index) Prune(ns string, rs []chain.Receipt, through uint64) error {
	b := ix.NewBatch(ns)
	defer b.Close()
	if b.b == nil {
		return fmt.Errorf("key index: prune: %w", ix.Err())
	}
	seen := map[string]bool{}
	for i := range rs {
		r := &rs[i]
		for _, k := range [][]byte{
			appendSeq(postingPrefix(ns, ByKey, r.IdempotencyKey), r.Seq),
			appendSeq(postingPrefix(ns, ByExecution, r.ExecutionID), r.Seq),
			appendSeq(postingPrefix(ns, ByTool, r.Tool), r.Seq),
			appendSeq(postingPrefix(ns, ByKind, r.Kind), r.Seq),
		} {
			if err := b.b.Delete(k, nil); err != nil {
				return fmt.Errorf("key index: prune: %w", err)
			}
		}
		if r.IdempotencyKey == "" || seen[r.IdempotencyKey] {
			continue
		}
		seen[r.IdempotencyKey] = true
		k, found, err := ix.Key(ns, r.IdempotencyKey)
		if err != nil {
			return fmt.Errorf("key index: prune: %w", err)
		}
		if found && k.FirstSeq <= through {
			if err := b.b.Delete(append(prefix(ns, tagRecord), r.IdempotencyKey...), nil); err != nil {
				return fmt.Errorf("key index: prune: %w", err)
			}
		}
	}
	if err := b.ix.useIn(b.in, true, func(*pebble.DB) error { return b.b.Commit(pebble.Sync) }); err != nil {
		return fmt.Errorf("key index: prune: %w", err)
	}
	return nil
}
