package ledger

import (
	"context"
	"fmt"
	"sort"

	"github.com/effect-ledger/effect-ledger/chain"
)

// The prunable watermark of SPEC §16: the largest seq W such that every
// key generation with a receipt ≤ W has all its receipts ≤ W and is
// finished — succeeded, failed, not_applied or rejected for at least the
// key TTL, or followed by a later generation — and whose failed outcomes
// are older than the repeat window of a refusing repeat rule (§13) for
// their tool. Receipts with no key never pin. W never passes the floor on
// age (archive.min_keep_ms).

// Watermark is a namespace's prunable watermark and what holds it back.
type Watermark struct {
	// Through is W (0: nothing can be pruned).
	Through uint64 `json:"through"`
	// Floor is the last seq old enough for min_keep_ms; Head the chain's
	// head when the watermark was read.
	Floor uint64 `json:"floor"`
	Head  uint64 `json:"head"`
	// Pin is the key generation that stops W below Floor, if any.
	Pin *Pin `json:"pinned_by,omitempty"`
}

// Pin is a key generation that may not be pruned yet.
type Pin struct {
	Key   string `json:"key"`
	State State  `json:"state"`
	// Seq is the generation's first receipt, the first seq W cannot
	// reach; Until the time (unix ms) it stops pinning by age alone (0:
	// not by age — it must finish first).
	Seq   uint64 `json:"seq"`
	Until uint64 `json:"until,omitempty"`
}

// stateDenied is the state of a generation of denied requests only (SPEC
// §13's deny receipts): nothing ran, nothing waits.
const stateDenied State = "denied"

// generation is one key generation as the watermark sees it.
type generation struct {
	key         string
	tool        string
	effect      string
	first, last uint64
	state       State  // a §3 state, or stateDenied
	endAt       uint64 // when it finished (unix ms)
	leaseEnds   uint64 // of the latest reserve
	askExpires  uint64
	followed    bool // a later generation of the key exists
}

// genScan turns a namespace's receipts, in seq order, into generations.
type genScan struct {
	ttl     uint64
	gens    []*generation
	current map[string]*generation
	ref     func(uint64) (*chain.Receipt, error)
}

// add applies receipt r.
func (s *genScan) add(r *chain.Receipt) error {
	if r.IdempotencyKey == "" {
		return nil // policy, key, erase, prune: never pin
	}
	g := s.current[r.IdempotencyKey]
	start := g == nil
	if !start && r.Kind == chain.KindReserve {
		var err error
		if start, err = StartsGeneration(r, s.ttl, s.ref); err != nil {
			return err
		}
	}
	if start {
		if g != nil {
			g.followed = true
		}
		g = &generation{key: r.IdempotencyKey, tool: r.Tool, effect: r.Effect, first: r.Seq}
		s.gens = append(s.gens, g)
		s.current[r.IdempotencyKey] = g
	}
	g.last = r.Seq
	switch r.Kind {
	case chain.KindReserve:
		g.state, g.leaseEnds = StateReserved, r.LeaseExpiresAt
	case chain.KindCommit, chain.KindResolve, chain.KindReconcile:
		if r.Kind == chain.KindCommit && g.finished() && !start {
			return nil // a late commit after a reconcile (§15) changes no state
		}
		g.state, g.endAt = State(r.Outcome), r.RecordedAt
	case chain.KindAsk:
		g.state, g.askExpires = StateAwaitingApproval, r.LeaseExpiresAt
	case chain.KindApproval:
		g.state, g.endAt = State(r.Outcome), r.RecordedAt // approved (until the ask expires) or rejected
	case chain.KindDeny:
		if start {
			g.state, g.endAt = stateDenied, r.RecordedAt
		}
	}
	return nil
}

// finished reports whether g holds a final outcome.
func (g *generation) finished() bool {
	switch g.state {
	case StateSucceeded, StateFailed, StateNotApplied, StateRejected, stateDenied:
		return true
	}
	return false
}

// pin returns why g may not be pruned at now under policy p, or nil.
func (g *generation) pin(now, ttl uint64, p *Policy) *Pin {
	state, endAt := g.state, g.endAt
	switch {
	case (state == StateAwaitingApproval || state == StateApproved) && now >= g.askExpires:
		state, endAt = StateApprovalExpired, g.askExpires
	case state == StateReserved && now >= g.leaseEnds:
		state = StateInterrupted
	}
	if state != StateApprovalExpired && !g.finished() {
		return &Pin{Key: g.key, State: state, Seq: g.first}
	}
	until := uint64(0)
	if !g.followed {
		until = endAt + ttl
	}
	if state == StateFailed || state == StateNotApplied {
		if gate := p.GateFor(g.tool, g.effect); gate.RepeatRefuse {
			// The guard counts a failure at now - window too (§13).
			until = max(until, endAt+gate.RepeatWindow+1)
		}
	}
	if now < until {
		return &Pin{Key: g.key, State: state, Seq: g.first, Until: until}
	}
	return nil
}

// watermark sweeps the generations in order of their first receipt: a
// seq s is prunable when every generation starting at or before s ends at
// or before s and none of them pins; W is the largest such s ≤ floor.
func watermark(gens []*generation, after, floor, head, now, ttl uint64, p *Policy) *Watermark {
	w := &Watermark{Floor: floor, Head: head, Through: after}
	sort.Slice(gens, func(i, j int) bool { return gens[i].first < gens[j].first })
	maxLast := after
	for _, g := range gens {
		if g.first > floor {
			break
		}
		if maxLast < g.first {
			w.Through = g.first - 1
		}
		if pin := g.pin(now, ttl, p); pin != nil {
			w.Pin = pin
			return w
		}
		maxLast = max(maxLast, g.last)
	}
	if maxLast <= floor {
		w.Through = floor
	} else if w.Pin == nil {
		// The last generation started before the floor and ends after it.
		for _, g := range gens {
			if g.first <= floor && g.last > floor {
				w.Pin = &Pin{Key: g.key, State: g.state, Seq: g.first}
				break
			}
		}
	}
	return w
}

// Prunable reads the namespace's prunable watermark at now: the receipts
// after seq after (the namespace's pruned_through), with the floor on age
// minKeepMS. It reads outside the head lock; a prune checks it again
// against what was appended meanwhile. Errors: *Error with
// ECodeNotPrunable in a namespace without a key TTL (its keys are never
// finished for good).
func (n *Namespace) Prunable(ctx context.Context, after, minKeepMS uint64) (*Watermark, error) {
	if n.keyTTL == 0 {
		return nil, &Error{Code: ECodeNotPrunable,
			Message: fmt.Sprintf("namespace %q has no key TTL, so its keys never finish for good and nothing in it can be pruned; it can be archived", n.name)}
	}
	p, _, err := n.Policy(ctx)
	if err != nil {
		return nil, err
	}
	now := n.now()
	cutoff := uint64(0)
	if now > minKeepMS {
		cutoff = now - minKeepMS
	}
	s := genScan{ttl: n.keyTTL, current: map[string]*generation{}, ref: func(seq uint64) (*chain.Receipt, error) {
		if seq <= after {
			return nil, ErrPrunedRef
		}
		return n.chain.GetReceipt(ctx, seq)
	}}
	floor, head := after, after
	err = n.chain.Receipts(ctx, after, func(r *chain.Receipt) error {
		head = r.Seq
		if r.RecordedAt <= cutoff {
			floor = r.Seq
		}
		return s.add(r)
	})
	if err != nil {
		return nil, err
	}
	return watermark(s.gens, after, floor, head, now, n.keyTTL, p), nil
}

// PruneStatus is a namespace's pruning (SPEC §16): the policy's archive
// member (nil: none, and a prune needs one), the pruned prefix and its
// prunes, and the prunable watermark above it under the policy's
// min_keep_ms (MinArchiveKeepMS without one).
type PruneStatus struct {
	Namespace string     `json:"namespace"`
	Archive   *Archive   `json:"archive"`
	Watermark *Watermark `json:"watermark"`
	// PrunedThrough is P; KeptThrough the deleted prefix K.
	PrunedThrough uint64       `json:"pruned_through"`
	KeptThrough   uint64       `json:"kept_through"`
	Prunes        []PruneEntry `json:"prunes"`
}

// PruneEntry is one prune as PruneStatus lists it.
type PruneEntry struct {
	Seq      uint64 `json:"seq"`
	From     uint64 `json:"from"`
	Through  uint64 `json:"through"`
	Segment  string `json:"segment"`
	Digest   string `json:"digest"`
	Deleting bool   `json:"deleting"`
}

// PruneStatus reads the namespace's pruning. It scans the receipts above
// the pruned prefix (about 100 bytes of memory per key seen): an admin's
// question. Errors as Prunable's.
func (n *Namespace) PruneStatus(ctx context.Context) (*PruneStatus, error) {
	p, _, err := n.Policy(ctx)
	if err != nil {
		return nil, err
	}
	floor := uint64(MinArchiveKeepMS)
	if p.Archive != nil {
		floor = p.Archive.MinKeepMS
	}
	// Both marks from the rows of one read: a deletion batch may commit
	// between two.
	ps, err := n.chain.Prunes(ctx)
	if err != nil {
		return nil, err
	}
	st := &PruneStatus{Namespace: n.name, Archive: p.Archive, Prunes: make([]PruneEntry, 0, len(ps))}
	unfinished := false
	for _, pr := range ps {
		deleting := pr.DeletedThrough < pr.Through
		st.PrunedThrough = max(st.PrunedThrough, pr.Through)
		if !unfinished {
			// The deleted prefix stops at the first prune whose deletion is
			// unfinished (a later one's row starts after bodies still stored).
			st.KeptThrough, unfinished = pr.DeletedThrough, deleting
		}
		st.Prunes = append(st.Prunes, PruneEntry{Seq: pr.Seq, From: pr.From, Through: pr.Through, Segment: pr.Segment,
			Digest: pr.Digest, Deleting: deleting})
	}
	if st.Watermark, err = n.Prunable(ctx, st.PrunedThrough, floor); err != nil {
		return nil, err
	}
	return st, nil
}
