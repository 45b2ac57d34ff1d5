package ledger

import (
	"context"
	"errors"
	"time"

	"github.com/effect-ledger/effect-ledger/internal/metrics"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// Deleting the bodies of a prune (SPEC §16), after its receipt committed:
// batch by batch, each one transaction of the driver's that keeps the
// hashes and deletes the bodies, sized to hold the writer a few
// milliseconds. Progress is the prune's DeletedThrough, so a deletion cut
// short (a crash, a Close) resumes where it stopped: at the next prune or
// start (ResumeDeletion).

// deleteBatch bounds a deletion batch, in receipts: it starts at
// deleteFirst and adapts so that a batch takes about deleteTarget.
const (
	deleteFirst  = 512
	deleteMin    = tlog.KeptLeaves
	deleteMax    = 32 * tlog.KeptLeaves
	deleteTarget = 5 * time.Millisecond
	deletePause  = time.Millisecond // between batches: the writer serves appends
)

var (
	prunesTotal = metrics.Counter("ledger_prunes_total",
		"Prune receipts appended (SPEC §16).")
	prunedReceipts = metrics.Counter("ledger_pruned_receipts_total",
		"Receipt bodies deleted by prunes, their hashes kept (SPEC §16).")
	pruneErrors = metrics.Counter("ledger_prune_errors_total",
		"Deletions of pruned bodies that stopped on an error; they resume at the next prune or start.")
)

// pruneStep calls the PruneStep seam.
func (l *Ledger) pruneStep(step string) {
	if l.cfg.PruneStep != nil {
		l.cfg.PruneStep(step)
	}
}

// kickDeletion deletes n's pruned bodies in the background.
func (l *Ledger) kickDeletion(n *Namespace) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.bg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.bg.Done()
		if err := n.DeletePruned(l.bgCtx); err != nil && !errors.Is(err, context.Canceled) {
			pruneErrors.Inc()
			l.logger.Error("deleting pruned receipt bodies stopped; it resumes at the next prune or start", "namespace", n.name, "err", err)
		}
	}()
}

// ResumeDeletion starts, in the background, the deletion of every prune
// of the namespace not finished, and erases the archived values an erase
// named that a segment still holds (at start).
func (n *Namespace) ResumeDeletion(ctx context.Context) error {
	if err := n.purgeArchive(ctx); err != nil {
		return err
	}
	ps, err := n.chain.Prunes(ctx)
	if err != nil {
		return err
	}
	for _, p := range ps {
		if p.DeletedThrough < p.Through {
			n.l.kickDeletion(n)
			return nil
		}
	}
	return nil
}

// DeletePruned deletes the bodies of every prune of the namespace not
// finished, until all are (one deletion at a time per namespace).
func (n *Namespace) DeletePruned(ctx context.Context) error {
	n.deleting.Lock()
	defer n.deleting.Unlock()
	var secret []byte
	size := uint64(deleteFirst)
	for {
		ps, err := n.chain.Prunes(ctx)
		if err != nil {
			return err
		}
		var p *Prune
		for i := range ps {
			if ps[i].DeletedThrough < ps[i].Through {
				p = &ps[i]
				break
			}
		}
		if p == nil {
			return nil
		}
		if secret == nil {
			if secret, err = n.chain.StateKey(ctx); err != nil {
				return err
			}
		}
		from := p.DeletedThrough + 1
		// End on a tile's last leaf where the range allows.
		to := min(p.Through, (from-1)/tlog.KeptLeaves*tlog.KeptLeaves+size)
		keys, err := n.chain.KeysIn(ctx, from, to)
		if err != nil {
			return err
		}
		b := DeleteBatch{Prune: p.Seq, From: from, To: to, KeyMACs: make([]uint64, len(keys))}
		for i, k := range keys {
			b.KeyMACs[i] = PrunedKeyMAC(secret, k)
		}
		if to == p.Through {
			if b.Thin, err = n.thinned(ctx, to); err != nil {
				return err
			}
		}
		start := time.Now()
		if err := n.l.store.DeletePruned(ctx, n.name, b); err != nil {
			if n.deletedMeanwhile(ctx, p) {
				continue // another replica deleted this batch first: go on from where it is
			}
			return err
		}
		prunedReceipts.Add(float64(to - from + 1))
		n.l.pruneStep("batch")
		if d := time.Since(start); d > 0 {
			next := uint64(float64(size) * float64(deleteTarget) / float64(d))
			size = max(deleteMin, min(deleteMax, next/tlog.KeptLeaves*tlog.KeptLeaves))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(deletePause):
		}
	}
}

// deletedMeanwhile reports whether prune p's deletion moved past where
// this deletion read it (another replica's, on a shared database).
func (n *Namespace) deletedMeanwhile(ctx context.Context, p *Prune) bool {
	ps, err := n.chain.Prunes(ctx)
	if err != nil {
		return false
	}
	for _, q := range ps {
		if q.Seq == p.Seq {
			return q.DeletedThrough > p.DeletedThrough
		}
	}
	return false
}

// thinned lists the checkpoints of size at most through that the last
// batch of a prune deletes (SPEC §16: thinned to one per hour): it keeps
// the first signed in each hour, the last one, and the first covering
// each key receipt (SPEC §9.2: a portable receipt proves a rotation under
// a checkpoint the retired key signed).
func (n *Namespace) thinned(ctx context.Context, through uint64) ([]int64, error) {
	cs, err := n.chain.CheckpointTimes(ctx, int64(through))
	if err != nil || len(cs) < 2 {
		return nil, err
	}
	keep := map[int64]bool{cs[len(cs)-1].Size: true, int64(through): true}
	hist, err := n.KeyHistory(ctx)
	if err != nil {
		return nil, err
	}
	for _, k := range hist {
		if c, err := n.chain.FirstCheckpointCovering(ctx, int64(k.Seq)); err != nil {
			return nil, err
		} else if c != nil {
			keep[c.Size] = true
		}
	}
	var out []int64
	hour := uint64(1<<64 - 1)
	for _, c := range cs {
		if h := c.SignedAt / 3_600_000; h != hour {
			hour = h
			continue
		}
		if !keep[c.Size] {
			out = append(out, c.Size)
		}
	}
	return out, nil
}
