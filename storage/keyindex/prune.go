package keyindex

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/effect-ledger/effect-ledger/chain"
)

// PrunePostings deletes, durably, the posting entries of the receipts rs
// of namespace ns, whose bodies a prune deletes (SPEC §16). Only the
// fields the postings use are read of rs. No reader looks at the
// postings of pruned receipts, so this may run beside the writer.
func (ix *Index) PrunePostings(ns string, rs []chain.Receipt) error {
	b := ix.NewBatch(ns)
	defer b.Close()
	if b.b == nil {
		return fmt.Errorf("key index: prune: %w", ix.Err())
	}
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
	}
	if err := b.ix.useIn(b.in, true, func(*pebble.DB) error { return b.b.Commit(pebble.Sync) }); err != nil {
		return fmt.Errorf("key index: prune: %w", err)
	}
	return nil
}

// ForgetKeys deletes the records of the keys of namespace ns whose
// current generation starts at or before through (SPEC §16: a key pruned
// whole is new). It must run where no write of the namespace does (the
// writer's lock): a record read here and replaced by a write before the
// delete would be lost. It does not wait for the disk: a record left by a
// crash is of a pruned generation, which every reader treats as absent.
func (ix *Index) ForgetKeys(ns string, keys []string, through uint64) error {
	b := ix.NewBatch(ns)
	defer b.Close()
	if b.b == nil {
		return fmt.Errorf("key index: prune: %w", ix.Err())
	}
	for _, key := range keys {
		k, found, err := ix.Key(ns, key)
		if err != nil {
			return fmt.Errorf("key index: prune: %w", err)
		}
		if found && k.FirstSeq <= through {
			if err := b.b.Delete(append(prefix(ns, tagRecord), key...), nil); err != nil {
				return fmt.Errorf("key index: prune: %w", err)
			}
		}
	}
	return b.Apply()
}
