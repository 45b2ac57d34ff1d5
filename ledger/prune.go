package ledger

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Archive, then prune (SPEC §16): the segment of the receipts up to the
// prunable watermark is written, fsynced and read back into the archive
// directory; then, under the head lock, the watermark is checked again
// against what was appended meanwhile and a prune receipt is appended;
// then the bodies are deleted in batches (prunedelete.go).

// PruneRequest asks for a prune of a namespace.
type PruneRequest struct {
	// Through is the last receipt to prune; 0: as far as the policy's
	// archive.keep_ms, the watermark and the latest checkpoint allow.
	Through uint64
	Actor   string
}

// Prune statuses.
const (
	PruneStatusPruned   = "pruned"
	PruneStatusAlready  = "already_pruned"
	PruneStatusNothing  = "nothing_to_prune"
	pruneRescans        = 3
	pruneReasonPinned   = "pinned"
	pruneReasonNoTTL    = "no_key_ttl"
	pruneReasonNoPolicy = "no_archive_policy"
	pruneReasonNoDir    = "no_archive_dir"
	pruneReasonNotCkpt  = "not_checkpointed"
	pruneReasonMoved    = "moved"
)

// PruneResult is a prune's answer.
type PruneResult struct {
	Status string `json:"status"`
	// Receipt is the prune receipt (the covering one for already_pruned).
	Receipt *ReceiptRef `json:"-"`
	From    uint64      `json:"from,omitempty"`
	Through uint64      `json:"through"`
	Segment string      `json:"segment,omitempty"`
	Digest  string      `json:"digest,omitempty"`
	// Deleting: bodies of the range are still being deleted.
	Deleting bool `json:"deleting"`
}

// notPrunable is the 409 of a prune refused for reason.
func notPrunable(reason, msg string, details map[string]any) *Error {
	if details == nil {
		details = map[string]any{}
	}
	details["reason"] = reason
	return &Error{Code: ECodeNotPrunable, Message: msg, Details: details}
}

// errMoved: the watermark moved between the scan and the head lock (a
// refusal: it writes nothing and fails no batch).
var errMoved = notPrunable(pruneReasonMoved, "receipts were appended inside the range while its segment was written", nil)

// prunePlan is what a prune decided outside the lock.
type prunePlan struct {
	from, through, scanned uint64 // scanned: the head the watermark was read at
	digest, segment, actor string
	policy                 chain.PrunePolicy
}

// Prune archives and prunes the namespace up to req.Through (SPEC §16).
// Errors: *Error with ECodeNotPrunable (details.reason no_key_ttl,
// no_archive_policy, no_archive_dir, pinned — with the pinning key —,
// not_checkpointed, moved).
func (n *Namespace) Prune(ctx context.Context, req PruneRequest) (*PruneResult, error) {
	p, _, err := n.Policy(ctx)
	if err != nil {
		return nil, err
	}
	switch {
	case n.keyTTL == 0:
		return nil, notPrunable(pruneReasonNoTTL, fmt.Sprintf("namespace %q has no key TTL, so its keys never finish for good and nothing in it can be pruned; it can be archived", n.name), nil)
	case p.Archive == nil:
		return nil, notPrunable(pruneReasonNoPolicy, "the namespace's policy has no archive member; set {\"archive\": {\"keep_ms\": …, \"min_keep_ms\": …}} first", nil)
	case n.l.cfg.ArchiveDir == "":
		return nil, notPrunable(pruneReasonNoDir, "this ledgerd has no archive directory (ledgerd --archive-dir)", nil)
	}
	n.pruning.Lock() // one prune of the namespace at a time in this process
	defer n.pruning.Unlock()
	for range pruneRescans {
		plan, res, err := n.planPrune(ctx, req, p.Archive)
		if err != nil || res != nil {
			return res, err
		}
		n.l.pruneStep("segment-written")
		err = n.submit(ctx, "", func(ctx context.Context, t *batchTx) error {
			var err error
			res, err = t.decidePrune(ctx, plan)
			return err
		})
		if errors.Is(err, errMoved) {
			// The segment stays: another prune (another replica's) may
			// name it, and a later prune of the same range reuses it.
			n.l.logger.Info("prune: the watermark moved while the segment was written; scanning again", "namespace", n.name, "through", plan.through)
			continue
		}
		if err != nil {
			return nil, err
		}
		if res.Status == PruneStatusPruned {
			n.l.pruneStep("receipt-committed")
			prunesTotal.Inc()
			n.l.kickDeletion(n)
			if err := n.purgeArchive(ctx); err != nil { // an erase that raced the segment (redone at start)
				n.l.logger.Error("erasing archived values after a prune failed", "namespace", n.name, "err", err)
			}
		}
		return res, nil
	}
	return nil, notPrunable(pruneReasonMoved, "receipts kept arriving inside the range while its segment was written; retry", nil)
}

// planPrune reads the watermark, chooses the range and writes its
// segment; res is set when there is nothing to do.
func (n *Namespace) planPrune(ctx context.Context, req PruneRequest, a *Archive) (plan *prunePlan, res *PruneResult, err error) {
	m, err := n.chain.Pruned(ctx)
	if err != nil {
		return nil, nil, err
	}
	if req.Through != 0 && req.Through <= m.Through {
		res, err := n.alreadyPruned(ctx, req.Through)
		return nil, res, err
	}
	keep := a.MinKeepMS
	if req.Through == 0 {
		keep = a.KeepMS
	}
	w, err := n.Prunable(ctx, m.Through, keep)
	if err != nil {
		return nil, nil, err
	}
	c, err := n.chain.LatestCheckpoint(ctx)
	if err != nil {
		return nil, nil, err
	}
	size := uint64(0)
	if c != nil {
		size = uint64(c.Size)
	}
	through := req.Through
	switch {
	case through == 0:
		if through = min(w.Through, size); through <= m.Through {
			return nil, &PruneResult{Status: PruneStatusNothing, Through: m.Through}, nil
		}
	case through > w.Through:
		return nil, nil, notPrunable(pruneReasonPinned, fmt.Sprintf("receipt %d cannot be pruned yet: the prunable watermark is %d", through, w.Through),
			map[string]any{"asked": through, "prunable_through": w.Through, "pruned_through": m.Through, "floor": w.Floor, "head": w.Head, "pinned_by": w.Pin})
	case through > size:
		return nil, nil, notPrunable(pruneReasonNotCkpt, fmt.Sprintf("no signed checkpoint covers receipt %d yet; retry after the next one", through),
			map[string]any{"asked": through, "checkpoint": size})
	}
	pol, err := n.policyAt1(ctx, m, through)
	if err != nil {
		return nil, nil, err
	}
	path, digest, err := n.Log.writeSegment(ctx, n.name, n.l.cfg.ArchiveDir, m.Through+1, through, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("prune: %w", err)
	}
	return &prunePlan{from: m.Through + 1, through: through, scanned: w.Head, digest: digest,
		segment: filepath.Base(path), actor: req.Actor, policy: pol}, nil, nil
}

// policyAt1 is the policy in force after through: the latest policy
// receipt in (P, through], else the one the latest prune carries.
func (n *Namespace) policyAt1(ctx context.Context, m PruneMark, through uint64) (chain.PrunePolicy, error) {
	f := ReceiptFilter{Kind: chain.KindPolicy, After: m.Through, Limit: MaxPageLimit}
	var last *chain.Receipt
	for {
		rs, next, err := n.chain.ListReceipts(ctx, f)
		if err != nil {
			return chain.PrunePolicy{}, err
		}
		for i := range rs {
			if rs[i].Seq <= through {
				last = &rs[i]
			}
		}
		if next == nil || *next > through {
			break
		}
		f.After = *next
	}
	if last != nil {
		return chain.PrunePolicy{Seq: last.Seq, Text: last.Result}, nil
	}
	if m.Seq == 0 {
		return chain.PrunePolicy{}, nil
	}
	r, err := n.chain.GetReceipt(ctx, m.Seq)
	if err != nil {
		return chain.PrunePolicy{}, err
	}
	res, err := chain.ParsePruneResult(r.Result)
	if err != nil {
		return chain.PrunePolicy{}, fmt.Errorf("prune receipt %d: %w", m.Seq, err)
	}
	return res.Policy, nil
}

// alreadyPruned answers a prune asked at or below the pruned prefix with
// the prune that covers through.
func (n *Namespace) alreadyPruned(ctx context.Context, through uint64) (*PruneResult, error) {
	ps, err := n.chain.Prunes(ctx)
	if err != nil {
		return nil, err
	}
	for _, p := range ps {
		if through >= p.From && through <= p.Through {
			hs, err := n.chain.ReceiptHashes(ctx, p.Seq-1, 1)
			if err != nil {
				return nil, err
			}
			return &PruneResult{Status: PruneStatusAlready, Receipt: &ReceiptRef{Seq: p.Seq, Hash: hs[0]}, From: p.From,
				Through: p.Through, Segment: p.Segment, Digest: p.Digest, Deleting: p.DeletedThrough < p.Through}, nil
		}
	}
	return nil, fmt.Errorf("no prune covers receipt %d below the pruned prefix: %w", through, ErrStorageCorrupt)
}

// decidePrune appends the prune receipt of plan under the head lock,
// after checking that nothing appended since the scan joins a generation
// of the range (errMoved) and that no other prune came first.
func (t *batchTx) decidePrune(ctx context.Context, plan *prunePlan) (*PruneResult, error) {
	if t.at.Pruned.Through != plan.from-1 {
		return nil, errMoved // another prune came first: the next scan answers already_pruned, or goes on from it
	}
	ref := t.refReader(ctx)
	var kept []KeptBody
	for seq := plan.scanned + 1; seq <= t.Head().Seq; seq++ {
		r, err := t.Receipt(ctx, seq)
		if err != nil {
			return nil, err
		}
		if r.Kind == chain.KindPolicy || r.Kind == chain.KindPrune || r.Kind == chain.KindErase {
			return nil, errMoved // a policy to carry, another prune, or values the segment may still hold
		}
		if r.RefSeq == 0 || r.RefSeq > plan.through {
			continue
		}
		start := false
		if r.Kind == chain.KindReserve {
			if start, err = StartsGeneration(&r, t.n.keyTTL, ref); err != nil {
				return nil, err
			}
		}
		if !start {
			return nil, errMoved
		}
	}
	f := ReceiptFilter{Kind: chain.KindKey, After: plan.from - 1, Limit: MaxPageLimit}
	for {
		keys, next, err := t.n.chain.ListReceipts(ctx, f)
		if err != nil {
			return nil, err
		}
		for i := range keys {
			if keys[i].Seq <= plan.through {
				kept = append(kept, KeptBody{Seq: keys[i].Seq, Body: string(keys[i].AppendJSON(nil))})
			}
		}
		if next == nil || *next >= plan.through {
			break
		}
		f.After = *next
	}
	res := chain.PruneResult{From: plan.from, Through: plan.through, Digest: plan.digest, Policy: plan.policy}
	r, err := t.append(ctx, chain.Receipt{Kind: chain.KindPrune, Actor: plan.actor, Result: res.Text(), RecordedAt: t.Now()})
	if err != nil {
		return nil, err
	}
	if err := t.PutPrune(ctx, &Prune{Seq: r.Seq, From: plan.from, Through: plan.through, Digest: plan.digest,
		Segment: plan.segment, DeletedThrough: plan.from - 1, Kept: kept}); err != nil {
		return nil, err
	}
	t.at.Pruned = PruneMark{Through: plan.through, Kept: t.at.Pruned.Kept, Seq: r.Seq, Segment: plan.segment}
	ref0 := refOf(&r)
	return &PruneResult{Status: PruneStatusPruned, Receipt: &ref0, From: plan.from, Through: plan.through,
		Segment: plan.segment, Digest: plan.digest, Deleting: true}, nil
}
