package ledger

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/effect-ledger/effect-ledger/archive"
	"github.com/effect-ledger/effect-ledger/chain"
)

// Erasure reaching the archive (SPEC §14 × §16): the values of a pruned
// generation live in its segment's payloads.jsonl. An erase finds them
// there before it takes the head lock (archived), names their receipts in
// its ranges like any other, and after it commits rewrites the segments
// (purgeArchive). The rewrite is redone from the erase rows at every
// start and every erase until no segment holds an erased value, and an
// erasure is purged only once none does.

// archivedValue is a receipt of a pruned generation whose segment holds
// values an erase selects: its key and those fields.
type archivedValue struct {
	key    string
	fields chain.FieldSet
}

// archived lists, by seq, the fields of want that the segments still hold
// for the generations an erase selects: every generation of keys, or
// those of the subject's mac, of the pruned prefix.
// It returns the pruned prefix it read: an erase decided under another
// one starts again (a prune committed meanwhile).
func (n *Namespace) archived(ctx context.Context, keys []string, mac *SubjectMAC, want chain.FieldSet) (map[uint64]archivedValue, uint64, error) {
	if want == 0 {
		want = chain.AllFields
	}
	dir := n.l.cfg.ArchiveDir
	m, err := n.chain.Pruned(ctx)
	if err != nil || m.Seq == 0 || dir == "" {
		return nil, m.Through, err
	}
	firsts := map[string][]uint64{} // key → the first seqs of its selected generations (0: all)
	if mac != nil {
		var gens []Generation
		if err := n.submit(ctx, "", func(ctx context.Context, t *batchTx) (err error) {
			gens, err = t.SubjectGenerations(ctx, *mac)
			return err
		}); err != nil {
			return nil, 0, err
		}
		for _, g := range gens {
			if g.FirstSeq > 0 && g.FirstSeq <= m.Through {
				firsts[g.Key] = append(firsts[g.Key], g.FirstSeq)
			}
		}
	} else {
		for _, k := range keys {
			firsts[k] = []uint64{0}
		}
	}
	if len(firsts) == 0 {
		return nil, m.Through, nil
	}
	ps, err := n.chain.Prunes(ctx)
	if err != nil {
		return nil, 0, err
	}
	out := map[uint64]archivedValue{}
	for _, p := range ps {
		seqs, err := n.segmentGenerations(filepath.Join(dir, p.Segment), p, firsts)
		if err != nil {
			return nil, 0, err
		}
		if len(seqs) == 0 {
			continue
		}
		err = archive.Payloads(filepath.Join(dir, p.Segment), func(pl *archive.Payload) error {
			f, ok := chain.ParsePayloadField(pl.Field)
			if key, sel := seqs[pl.Seq]; ok && sel && want.Has(f) {
				out[pl.Seq] = archivedValue{key: key, fields: out[pl.Seq].fields.With(f)}
			}
			return nil
		})
		if err != nil {
			return nil, 0, fmt.Errorf("erase: segment %s: %w", p.Segment, err)
		}
	}
	return out, m.Through, nil
}

// segmentGenerations returns the seqs of the receipts of the selected
// generations in the segment at dir: from each first seq up to the
// reserve that starts the key's next generation (every receipt of the
// key for a first seq 0).
func (n *Namespace) segmentGenerations(dir string, p Prune, firsts map[string][]uint64) (map[uint64]string, error) {
	inRange := false
	for _, fs := range firsts {
		for _, f := range fs {
			inRange = inRange || f == 0 || f >= p.From && f <= p.Through
		}
	}
	if !inRange {
		return nil, nil
	}
	byKey := map[string][]chain.Receipt{}
	err := archive.Receipts(dir, func(r *chain.Receipt) error {
		if _, ok := firsts[r.IdempotencyKey]; ok {
			byKey[r.IdempotencyKey] = append(byKey[r.IdempotencyKey], *r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("erase: segment %s: %w", filepath.Base(dir), err)
	}
	out := map[uint64]string{}
	for key, rs := range byKey {
		at := map[uint64]*chain.Receipt{}
		for i := range rs {
			at[rs[i].Seq] = &rs[i]
		}
		ref := func(seq uint64) (*chain.Receipt, error) {
			if r := at[seq]; r != nil {
				return r, nil
			}
			return nil, ErrPrunedRef
		}
		for _, first := range firsts[key] {
			for i := range rs {
				r := &rs[i]
				if r.Seq < first {
					continue
				}
				if first > 0 && r.Seq > first && r.Kind == chain.KindReserve {
					if next, err := StartsGeneration(r, n.keyTTL, ref); err != nil {
						return nil, err
					} else if next {
						break
					}
				}
				out[r.Seq] = key
			}
		}
	}
	return out, nil
}

// purgeArchive removes from the segments every value an erase named
// among the pruned receipts: after each erase, and at start.
func (n *Namespace) purgeArchive(ctx context.Context) error {
	dir := n.l.cfg.ArchiveDir
	m, err := n.chain.Pruned(ctx)
	if err != nil || m.Seq == 0 || dir == "" {
		return err
	}
	todo, err := n.archivedErasures(ctx, m, 0)
	if err != nil {
		return err
	}
	for segment, erase := range todo {
		if _, err := archive.ErasePayloads(filepath.Join(dir, segment), erase); err != nil {
			return fmt.Errorf("erase archived values: %w", err)
		}
	}
	return nil
}

// archivedErasures lists, by segment, the fields erased of its receipts
// (by the erase at only, when not 0).
func (n *Namespace) archivedErasures(ctx context.Context, m PruneMark, only uint64) (map[string]map[uint64]chain.FieldSet, error) {
	ps, err := n.chain.Prunes(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]map[uint64]chain.FieldSet{}
	err = n.chain.Erasures(ctx, func(e *Erasure) error {
		if only != 0 && e.Seq != only {
			return nil
		}
		var set chain.FieldSet
		for _, r := range e.Ranges {
			for seq := r[0]; seq <= r[1] && seq <= m.Through; seq++ {
				if set == 0 {
					var err error
					if set, err = n.erasedFields(ctx, e.Seq); err != nil {
						return err
					}
				}
				for _, p := range ps {
					if seq >= p.From && seq <= p.Through {
						if out[p.Segment] == nil {
							out[p.Segment] = map[uint64]chain.FieldSet{}
						}
						out[p.Segment][seq] |= set
					}
				}
			}
		}
		return nil
	})
	return out, err
}

// erasedFields is the field set of the erase receipt at seq.
func (n *Namespace) erasedFields(ctx context.Context, seq uint64) (chain.FieldSet, error) {
	r, err := n.chain.GetReceipt(ctx, seq)
	var e *Error
	if errors.As(err, &e) && e.Code == ECodePruned {
		return chain.AllFields, nil // the erase receipt itself was pruned: take every field of its ranges
	}
	if err != nil {
		return 0, err
	}
	_, set, err := chain.ParseEraseResult(r.Result)
	return set, err
}

// archivePurged reports whether no segment holds a value the erase at seq
// named (true without a pruned prefix).
func (n *Namespace) archivePurged(ctx context.Context, e *Erasure) (bool, error) {
	dir := n.l.cfg.ArchiveDir
	m, err := n.chain.Pruned(ctx)
	if err != nil || m.Seq == 0 || dir == "" || len(e.Ranges) == 0 || e.Ranges[0][0] > m.Through {
		return err == nil, err
	}
	todo, err := n.archivedErasures(ctx, m, e.Seq)
	if err != nil {
		return false, err
	}
	for segment, erase := range todo {
		holds, err := archive.Holds(filepath.Join(dir, segment), erase)
		if err != nil || holds {
			return false, err
		}
	}
	return true, nil
}
