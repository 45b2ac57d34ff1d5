package verify

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/effect-ledger/effect-ledger/chain"
)

// A retention sweep erases the values of finished keys only (SPEC §14):
// every receipt the erase at r lists must be of a key that was final at
// r, or of an earlier generation of its key; and an ask or approval of
// SPEC §13 still in use at r (an ask waiting for its answer, an approval
// no reserve has consumed yet, an ask and approval a reserve consumed
// while that reserve's generation is in flight) keeps its values
// whatever its age. Each key's state at r is derived here from its own
// receipts, independently of the ledger's code (as the state checks
// are).
//
// The receipts a sweep lists belong to many keys, and a database need not
// index its receipts by key (SQLite keeps no such index): a read per
// listed key would rescan the chain each time. So the chain pass only
// holds the sweeps' lists (claims), and one key-ordered read of the
// receipts checks all that it holds, after the pass or whenever
// retentionClaimBudget listed receipts are held: the work grows with the
// receipts and the receipts listed, never with their product.

// retentionClaimBudget bounds the listed receipts held before a
// key-ordered read checks them (16 bytes each).
var retentionClaimBudget = 1 << 20

// retentionClaims are the lists of the retention sweeps met by the chain
// pass and not checked yet.
type retentionClaims struct {
	sweeps []sweepAt
	listed []listedSeq // in the order added: by sweep, then by seq
	// reads counts the key-ordered reads that checked claims.
	reads int
}

// sweepAt is a retention erase receipt: its seq and recorded_at.
type sweepAt struct{ seq, at uint64 }

// listedSeq is a receipt listed by the sweep at index sweep.
type listedSeq struct {
	seq   uint64
	sweep int
}

// claimRetention holds the receipts the retention erase r lists, to be
// checked against their keys' states at r.
func (p *payloadChecker) claimRetention(r *chain.Receipt, ranges []chain.Range) {
	c := &p.claims
	i := len(c.sweeps)
	c.sweeps = append(c.sweeps, sweepAt{r.Seq, r.RecordedAt})
	for _, rg := range ranges {
		for s := rg[0]; s <= rg[1] && s < r.Seq; s++ { // a range reaching r is reported apart
			c.listed = append(c.listed, listedSeq{s, i})
		}
	}
	if len(c.listed) >= retentionClaimBudget {
		p.checkClaims()
	}
}

// checkClaims checks the claims held, in one key-ordered read of the
// receipts of the keys with a receipt at or after the first one listed,
// and drops them.
func (p *payloadChecker) checkClaims() {
	c := &p.claims
	if len(c.listed) == 0 {
		return
	}
	slices.SortFunc(c.listed, func(a, b listedSeq) int {
		return cmp.Or(cmp.Compare(a.seq, b.seq), cmp.Compare(a.sweep, b.sweep))
	})
	c.reads++
	var group []chain.Receipt // the receipts of the current key
	flush := func() {
		if len(group) > 0 {
			p.checkKeyClaims(group)
		}
		group = group[:0]
	}
	err := p.db.KeyReceipts(p.ctx, c.listed[0].seq-1, func(r *chain.Receipt) error {
		if len(group) > 0 && group[0].IdempotencyKey != r.IdempotencyKey {
			flush()
		}
		if r.IdempotencyKey != "" {
			group = append(group, *r)
		}
		return nil
	})
	flush()
	if err != nil {
		p.err = errors.Join(p.err, fmt.Errorf("check retention sweeps: %w", err))
	}
	c.sweeps, c.listed = c.sweeps[:0], c.listed[:0]
}

// checkKeyClaims checks the claims on the receipts rs of one key (seq
// order): for each sweep that lists one of them, the key's state as of
// the sweep. One erase_invalid per key and sweep.
func (p *payloadChecker) checkKeyClaims(rs []chain.Receipt) {
	c := &p.claims
	byListing := map[int][]uint64{} // sweep → the key's receipts it lists
	var sweeps []int
	for i := range rs {
		j, _ := slices.BinarySearchFunc(c.listed, rs[i].Seq, func(l listedSeq, s uint64) int { return cmp.Compare(l.seq, s) })
		for ; j < len(c.listed) && c.listed[j].seq == rs[i].Seq; j++ {
			w := c.listed[j].sweep
			if byListing[w] == nil {
				sweeps = append(sweeps, w)
			}
			byListing[w] = append(byListing[w], rs[i].Seq)
		}
	}
	if len(sweeps) == 0 {
		return
	}
	slices.SortFunc(sweeps, func(a, b int) int { return cmp.Compare(c.sweeps[a].seq, c.sweeps[b].seq) })
	k := newKeyHistory(rs, p.ttl)
	for _, w := range sweeps {
		sw := c.sweeps[w]
		k.through(sw.seq)
		for _, s := range byListing[w] {
			if why := k.inUse(s, sw.at); why != "" {
				p.col.addf(sw.seq, RuleEraseInvalid, "a retention erase lists receipt %d, of key %q, %s", s, rs[0].IdempotencyKey, why)
				break
			}
		}
	}
}

// keyHistory follows one key's receipts in seq order, for the sweeps
// that list some of them, each at its seq: the key's generations (SPEC
// §12) and its asks and approvals (SPEC §13) as of the receipts applied.
type keyHistory struct {
	rs    []chain.Receipt
	bySeq map[uint64]*chain.Receipt
	ttl   uint64
	next  int // rs[next] is the first receipt not applied
	// first is the first seq of the last generation (0: no reserve yet),
	// reserve the latest reserve, final the latest outcome that counts.
	first, reserve, final uint64
	answer                map[uint64]*chain.Receipt // ask seq → its approval receipt
	consumed              map[uint64]uint64         // approval seq → the latest reserve naming it
}

func newKeyHistory(rs []chain.Receipt, ttl uint64) *keyHistory {
	k := &keyHistory{rs: rs, bySeq: make(map[uint64]*chain.Receipt, len(rs)), ttl: ttl,
		answer: map[uint64]*chain.Receipt{}, consumed: map[uint64]uint64{}}
	for i := range rs {
		k.bySeq[rs[i].Seq] = &rs[i]
	}
	return k
}

// through applies the receipts with a seq below before.
func (k *keyHistory) through(before uint64) {
	for ; k.next < len(k.rs) && k.rs[k.next].Seq < before; k.next++ {
		k.apply(&k.rs[k.next])
	}
}

// apply follows one receipt. A reserve starts a generation when it is
// the key's first, names nothing, names a replay (a renewal of a
// succeeded key, §12) or an outcome at least ttl older than itself
// (§12), following an approval to its ask (§13) first; an outcome
// counts unless it precedes the generation or is a late commit after a
// reconcile (§15).
func (k *keyHistory) apply(r *chain.Receipt) {
	switch r.Kind {
	case chain.KindReserve:
		if k.first == 0 || startsGeneration(r, k.bySeq, k.ttl) {
			k.first, k.final = r.Seq, 0
		}
		k.reserve = r.Seq
		k.consumed[r.RefSeq] = r.Seq
	case chain.KindCommit, chain.KindResolve, chain.KindReconcile:
		if k.first == 0 || r.Seq <= k.first || r.Kind == chain.KindCommit && k.final > k.reserve {
			return
		}
		k.final = r.Seq
	case chain.KindApproval:
		k.answer[r.RefSeq] = r
	}
}

// open reports whether the last generation is in flight: its latest
// reserve has no outcome after it.
func (k *keyHistory) open() bool { return k.first != 0 && k.final < k.reserve }

// inUse says why the receipt at seq, as of the receipts applied and the
// time at (unix ms), was not the key's to erase: it belongs to the
// generation in flight, or it is an ask waiting for its answer or whose
// approval is not consumed yet, or such an approval, or an ask or
// approval a reserve of the generation in flight consumed (they belong
// to that generation, SPEC §13, §14). "" when it was. An ask past its
// expiry can no longer be answered or consumed (SPEC §13,
// approval_expired): it waits for nothing.
func (k *keyHistory) inUse(seq, at uint64) string {
	if k.open() && seq >= k.first {
		return fmt.Sprintf("which was still in flight (its generation from seq %d has no outcome)", k.first)
	}
	r := k.bySeq[seq]
	if r == nil {
		return ""
	}
	approval := r // the approval of the ask at seq, or seq's approval
	if r.Kind == chain.KindAsk {
		approval = k.answer[r.Seq]
	}
	if approval != nil && approval.Kind == chain.KindApproval && approval.Outcome == chain.OutcomeApproved {
		if c := k.consumed[approval.Seq]; k.open() && c >= k.first {
			return fmt.Sprintf("an %s the reserve at seq %d consumed, whose generation (from seq %d) was still in flight",
				r.Kind, c, k.first)
		}
	}
	switch {
	case r.Kind == chain.KindAsk && at < r.LeaseExpiresAt:
		switch a := k.answer[r.Seq]; {
		case a == nil:
			return "an ask still waiting for its answer (awaiting_approval)"
		case a.Outcome == chain.OutcomeApproved && k.consumed[a.Seq] == 0:
			return fmt.Sprintf("an ask whose approval (seq %d) no reserve had consumed yet", a.Seq)
		}
	case r.Kind == chain.KindApproval && r.Outcome == chain.OutcomeApproved && k.consumed[r.Seq] == 0:
		if ask := k.bySeq[r.RefSeq]; ask != nil && ask.Kind == chain.KindAsk && at < ask.LeaseExpiresAt {
			return "an approval no reserve had consumed yet"
		}
	}
	return ""
}

// openGeneration follows a key's receipts (seq order) and returns the
// first seq of its last generation and whether that generation is in
// flight (keyHistory).
func openGeneration(rs []chain.Receipt, ttl uint64) (first uint64, open bool) {
	k := newKeyHistory(rs, ttl)
	k.through(^uint64(0))
	return k.first, k.open()
}

// startsGeneration reports whether the reserve r of a key already seen
// starts a new generation (keyHistory.apply).
func startsGeneration(r *chain.Receipt, bySeq map[uint64]*chain.Receipt, ttl uint64) bool {
	named, p := r.RefSeq, (*chain.Receipt)(nil)
	for hops := 0; hops < 3; hops++ {
		if named == 0 {
			return true
		}
		if p = bySeq[named]; p == nil {
			return false // not one of the key's
		}
		if p.Kind != chain.KindApproval && p.Kind != chain.KindAsk {
			break
		}
		named = p.RefSeq
	}
	switch p.Kind {
	case chain.KindReplay:
		return true
	case chain.KindCommit, chain.KindResolve, chain.KindReconcile:
		return ttl > 0 && r.RecordedAt >= p.RecordedAt+ttl
	}
	return false
}
