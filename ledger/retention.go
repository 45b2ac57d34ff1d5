package ledger

import (
	"context"
	"sort"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Retention (SPEC §14): a policy's "retention": {"payloads_ms": N} erases,
// sweep by sweep, the payloads of receipts more than N ms old whose key
// generation is finished, erase receipts excepted. A sweep that finds
// something appends one erase receipt ("retention": true, actor ledgerd,
// no note); a sweep that finds nothing appends nothing.

// DefaultMaxSweep is the default of Config.MaxSweep.
const DefaultMaxSweep = 10_000

// RetentionActor is the actor of the erase receipts of sweeps.
const RetentionActor = "ledgerd"

// Sweep runs one retention sweep. It returns nil when the namespace has
// no retention in force or nothing had expired.
func (n *Namespace) Sweep(ctx context.Context) (*EraseResult, error) {
	if mode, _, err := n.PayloadsNow(ctx); err != nil || mode != PayloadsCommitted {
		return nil, err // an inline namespace has no retention; a switched one sweeps its committed part
	}
	var res *EraseResult
	err := n.submit(ctx, "", func(ctx context.Context, t *batchTx) error {
		var err error
		res, err = decideSweep(ctx, t)
		return err
	})
	if err != nil || res == nil {
		return nil, err
	}
	erasures.WithLabelValues(n.name, "retention").Inc()
	n.l.logger.InfoContext(ctx, "payloads erased by retention", "namespace", n.name, "seq", res.Receipt.Seq, "count", res.Count)
	return res, nil
}

// decideSweep erases what the policy in force has expired.
func decideSweep(ctx context.Context, t *batchTx) (*EraseResult, error) {
	p, _, err := t.policy(ctx)
	if err != nil || p == nil || p.Retention == nil || t.Now() <= p.Retention.PayloadsMS {
		return nil, err
	}
	through, err := t.recordedThrough(ctx, t.Now()-p.Retention.PayloadsMS)
	if err != nil || through == 0 {
		return nil, err
	}
	fields, full, err := t.collectKept(ctx, through, t.sparedBySweep)
	if err != nil || len(fields) == 0 {
		return nil, err
	}
	return t.eraseCollected(ctx, fields, full, true, RetentionActor, "")
}

// collectKept pages through the receipts up to through that keep values,
// in seq order, and returns up to Config.MaxSweep of them that spare does
// not keep, with their fields; full when it stopped at that bound. It
// pages past the ones spared, however many there are.
func (t *batchTx) collectKept(ctx context.Context, through uint64,
	spare func(context.Context, *KeptPayload) (bool, error)) (map[uint64]chain.FieldSet, bool, error) {
	fields := map[uint64]chain.FieldSet{}
	limit := t.maxSweep()
	for after := uint64(0); len(fields) < limit; {
		kept, err := t.KeptPayloads(ctx, after, through, limit-len(fields))
		if err != nil || len(kept) == 0 {
			return fields, false, err
		}
		for _, kp := range kept {
			after = kp.Seq
			if kp.Fields == 0 {
				continue
			}
			keep, err := spare(ctx, &kp)
			if err != nil {
				return nil, false, err
			}
			if !keep {
				fields[kp.Seq] = kp.Fields
			}
		}
	}
	return fields, true, nil
}

// maxSweep is Config.MaxSweep.
func (t *batchTx) maxSweep() int {
	if t.n == nil {
		return DefaultMaxSweep
	}
	return t.n.l.cfg.MaxSweep
}

// sparedBySweep reports whether a sweep keeps kp's values though they
// expired: an erase receipt's reason, a key still in flight, an ask or
// approval still in use.
func (t *batchTx) sparedBySweep(ctx context.Context, kp *KeptPayload) (bool, error) {
	if kp.Key == "" {
		return false, nil
	}
	k, found, err := t.Key(ctx, kp.Key)
	if err != nil {
		return false, err
	}
	var inFlight uint64 // the first reserve of the key's generation in flight, if any
	if found && !k.finalized() {
		inFlight = k.FirstSeq
	}
	if inFlight > 0 && kp.Seq >= inFlight {
		return true, nil // a person may still need the values to resolve it
	}
	if kp.Kind == chain.KindAsk || kp.Kind == chain.KindApproval {
		// The approver, or the reserve that consumes it, still reads it;
		// or it belongs to the generation in flight that consumed it.
		return t.awaitsApproval(ctx, kp.Key, kp.Seq, inFlight)
	}
	return false, nil
}

// eraseCollected appends the erase of fields (collectKept's); more: the
// next one may find more at once.
func (t *batchTx) eraseCollected(ctx context.Context, fields map[uint64]chain.FieldSet, more, retention bool,
	actor, reason string) (*EraseResult, error) {
	r, count, err := t.appendErase(ctx, fields, chain.AllFields, retention, actor, reason, nil)
	if err != nil {
		return nil, err
	}
	ref := refOf(&r)
	return &EraseResult{Status: StatusErased, Receipt: &ref, Count: count, More: more}, nil
}

// awaitsApproval reports whether the ask or approval at seq of key is
// still in use (SPEC §13): an ask unanswered and not expired, an approval
// not consumed yet before its ask expires, or one consumed by the reserve that started the
// key's generation in flight (inFlight, that reserve's seq; 0 for none),
// whose values the ask's and approval's are (SPEC §14). Its key is not
// final.
func (t *batchTx) awaitsApproval(ctx context.Context, key string, seq, inFlight uint64) (bool, error) {
	hist, err := t.KeyHistory(ctx, key, 0)
	if err != nil {
		return false, err
	}
	answered, consumed := map[uint64]*chain.Receipt{}, map[uint64]uint64{}
	for i := range hist {
		switch r := &hist[i]; r.Kind {
		case chain.KindApproval:
			answered[r.RefSeq] = r
		case chain.KindReserve:
			consumed[r.RefSeq] = r.Seq
		}
	}
	for i := range hist {
		r := &hist[i]
		if r.Kind != chain.KindAsk || (r.Seq != seq && (answered[r.Seq] == nil || answered[r.Seq].Seq != seq)) {
			continue
		}
		a := answered[r.Seq]
		switch {
		case a == nil:
			return t.Now() < r.LeaseExpiresAt, nil // unanswered: until it expires
		case a.Outcome == chain.OutcomeApproved:
			by, ok := consumed[a.Seq]
			if !ok { // until the ask expires: then nothing can consume it (approval_expired)
				return t.Now() < r.LeaseExpiresAt, nil
			}
			return inFlight > 0 && by >= inFlight, nil
		}
		return false, nil // rejected
	}
	return false, nil
}

// recordedThrough returns the last seq recorded at or before cutoff (unix
// ms): recorded_at never decreases within a chain, so a search by seq.
func (t *batchTx) recordedThrough(ctx context.Context, cutoff uint64) (uint64, error) {
	head := t.Head().Seq
	var ferr error
	i := sort.Search(int(head), func(i int) bool {
		if ferr != nil {
			return true
		}
		r, err := t.Receipt(ctx, uint64(i)+1)
		if err != nil {
			ferr = err
			return true
		}
		return r.RecordedAt > cutoff
	})
	return uint64(i), ferr
}
