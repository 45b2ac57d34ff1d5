package nsservices

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// Archive, then prune (SPEC §16): at start the deletion of every prune
// not finished resumes; with an archive directory and a prune interval,
// each namespace whose policy has an archive member is pruned as far as
// it allows, every interval.

// pruneActor is the actor of the prune receipts the schedule appends.
const pruneActor = "ledgerd"

// startPrune resumes n's unfinished deletions and, with PruneEvery,
// schedules its prunes; e, when set, is the namespace's signer election:
// only its winner prunes on schedule (a replica without the signing key
// cannot checkpoint, so cannot prune).
func (s *Services) startPrune(ctx context.Context, n *ledger.Namespace, logger *slog.Logger, e *election) {
	if err := n.ResumeDeletion(ctx); err != nil && ctx.Err() == nil {
		logger.Warn("prune: resuming the deletion of pruned receipt bodies failed; it resumes at the next prune or start", "err", err)
	}
	if !s.cfg.Prune || s.cfg.PruneEvery <= 0 {
		return
	}
	s.mu.Lock()
	s.running[n.Name()] = true
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			// Up to a tenth more, so that namespaces (and replicas) do not
			// all prune at once.
			d := s.cfg.PruneEvery + rand.N(s.cfg.PruneEvery/10+1)
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
			if leads(ctx, e, logger, "prune") {
				prune(ctx, n, logger)
			}
		}
	}()
}

// prune prunes n as far as its policy allows, when its policy has an
// archive member; a refusal waits for the next interval.
func prune(ctx context.Context, n *ledger.Namespace, logger *slog.Logger) {
	p, _, err := n.Policy(ctx)
	if err != nil {
		if ctx.Err() == nil {
			logger.Warn("prune: reading the policy failed", "err", err)
		}
		return
	}
	if p.Archive == nil {
		return
	}
	res, err := n.Prune(ctx, ledger.PruneRequest{Actor: pruneActor})
	var le *ledger.Error
	switch {
	case err == nil && res.Status == ledger.PruneStatusPruned:
		logger.Info("pruned", "from", res.From, "through", res.Through, "segment", res.Segment, "prune_seq", res.Receipt.Seq)
	case err == nil:
		logger.Debug("prune: nothing to prune", "pruned_through", res.Through)
	case errors.As(err, &le) && le.Code == ledger.ECodeNotPrunable:
		logger.Info("prune: not prunable now; retrying next interval", "reason", le.Details["reason"], "message", le.Message)
	case ctx.Err() == nil:
		logger.Warn("prune failed; retrying next interval", "err", err)
	}
}
