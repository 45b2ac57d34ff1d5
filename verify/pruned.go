package verify

import (
	"context"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// A run over a pruned ledger (SPEC §16, docs/design/pruning.md 2.8): P is
// the pruned prefix (receipts ≤ P pruned), K ≤ P the deleted bodies. The
// chain pass starts at K from the kept hash of K; the receipts in (K, P]
// are chain-checked only (seq, link, hash, recorded_at, pins); the state
// rules, the gate and the audit start at P+1, so that a report is the
// same before and after the deletion finishes.

// pruned is what a run knows of the ledger's pruned prefix.
type pruned struct {
	c    DB // nil: the ledger keeps no pruned prefix
	mark ledger.PruneMark
	rows []ledger.Prune
	// served is a server's pruned prefix (served.go): its bodies ≤ P are
	// unreadable, K is P; proof says how its hash was proven, bad is the
	// violation if it was not.
	served *ServedPrune
	proof  *PrunedProof
	bad    *Violation
	src    Source // reads the live receipts: the database's, or the server's
}

// any reports whether the ledger keeps a pruned prefix: a database's or
// a server's.
func (p *pruned) any() bool { return p.c != nil || p.served != nil }

// hashAt is the chain hash of receipt seq ≤ K: kept by a database, or
// the one a server proved (of P alone).
func (p *pruned) hashAt(ctx context.Context, seq uint64) (chain.Hash, error) {
	if p.served == nil {
		return keptHash(ctx, p.c, seq)
	}
	if seq != p.served.Through {
		return chain.Hash{}, fmt.Errorf("the server proves the chain hash of pruned receipt %d only, not of %d", p.served.Through, seq)
	}
	return p.served.Hash, nil
}

// livePart is the database as the state checks read it: the keys and
// groupings of the live range (after P) only. A key record whose
// generation began at or before P is pruned (its deletion may be pending).
type livePart struct {
	DB
	through uint64 // P
}

func (d livePart) KeyReceipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	return d.DB.KeyReceipts(ctx, max(after, d.through), fn)
}

func (d livePart) Keys(ctx context.Context, fn func(*ledger.KeyRecord) error) error {
	return d.DB.Keys(ctx, func(k *ledger.KeyRecord) error {
		if k.FirstSeq > 0 && k.FirstSeq <= d.through {
			return nil
		}
		return fn(k)
	})
}

func (d livePart) DuplicateSuccesses(ctx context.Context, fn func(*ledger.Success) error) error {
	return d.DB.DuplicateSuccesses(ctx, func(s *ledger.Success) error {
		if s.Seq <= d.through {
			return nil
		}
		return fn(s)
	})
}

func (d livePart) RepeatedFailures(ctx context.Context, tool string, fn func(*ledger.CallAfterFailure) error) error {
	return d.DB.RepeatedFailures(ctx, tool, func(c *ledger.CallAfterFailure) error {
		if c.Seq <= d.through {
			return nil
		}
		return fn(c)
	})
}

// readPruned reads the pruned prefix and the prune rows of a database, or
// a server's pruned prefix and the proof of its hash (zero for a ledger
// never pruned), and points the state checks at the live range.
func (v *Verifier) readPruned(ctx context.Context) (*pruned, error) {
	p := &pruned{src: v.src}
	if v.remote != nil {
		sp, err := v.remote.Pruned(ctx)
		if err != nil || sp == nil {
			return p, err
		}
		p.served, p.mark = sp, ledger.PruneMark{Through: sp.Through, Kept: sp.Through, Seq: sp.Prune}
		p.proof, p.bad = sp.prove(v.opts.Keys)
		return p, nil
	}
	if v.db == nil {
		return p, nil
	}
	if lp, ok := v.db.(livePart); ok { // a second Check
		v.db, v.src = lp.DB, lp.DB
	}
	c, mark, err := v.pruneMark(ctx)
	if err != nil || c == nil {
		return p, err
	}
	p.c, p.mark, p.src = c, mark, c
	if p.rows, err = c.Prunes(ctx); err != nil {
		return nil, fmt.Errorf("read the prune rows: %w", err)
	}
	if p.mark.Through, err = p.standing(ctx); err != nil {
		return nil, err
	}
	if mark.Kept > 0 {
		v.kept = prunedHashes(c, mark.Kept)
	}
	if p.mark.Through > 0 {
		lp := livePart{DB: v.db, through: p.mark.Through}
		v.db, v.src = lp, lp
	}
	return p, nil
}

// standing is P as the chain stands for it: the largest range of a
// prune row whose receipt is a prune receipt of that range and digest,
// or whose receipt is itself deleted (≤ K). A row without its receipt
// prunes nothing here (checkRows reports it): the state checks are not
// skipped on the word of a row alone.
func (p *pruned) standing(ctx context.Context) (uint64, error) {
	through := p.mark.Kept
	for _, row := range p.rows {
		if row.Seq <= p.mark.Kept {
			through = max(through, row.Through)
			continue
		}
		r, err := readReceipt(ctx, p.c, row.Seq)
		if err != nil {
			return 0, fmt.Errorf("read prune receipt %d: %w", row.Seq, err)
		}
		if r == nil || r.Kind != chain.KindPrune {
			continue
		}
		if res, err := chain.ParsePruneResult(r.Result); err == nil && res.From == row.From && res.Through == row.Through && res.Digest == row.Digest {
			through = max(through, row.Through)
		}
	}
	return through, nil
}

// pinIntact compares a pin at or below K with the kept hash: the body is
// gone, the hash the tree binds is the check. A server proves the hash of
// P alone: a pin below it cannot be checked, and is not intact.
func (p *pruned) pinIntact(ctx context.Context, pin *Pin) (bool, error) {
	if p.served != nil && (pin.Seq != p.served.Through || !p.proof.Proven) {
		return false, nil
	}
	h, err := p.hashAt(ctx, pin.Seq)
	if err != nil {
		return false, err
	}
	return h.String() == pin.Hash, nil
}

// checkKeptPins reports the pins of a full run at or below K whose hash
// is not the kept one (head_mismatch): the chain pass starts after them.
func (p *pruned) checkKeptPins(ctx context.Context, col *collector, opts Opts) error {
	for _, c := range []struct {
		pin  *Pin
		what string
	}{{opts.ExpectHead, "expected head"}, {opts.Pinned, "pinned head"}} {
		if c.pin == nil || c.pin.Seq == 0 || c.pin.Seq > p.mark.Kept || p.served != nil && c.pin.Seq != p.served.Through {
			continue // below a server's P: unverified_pruned
		}
		h, err := p.hashAt(ctx, c.pin.Seq)
		if err != nil {
			return err
		}
		if h.String() != c.pin.Hash {
			col.addf(c.pin.Seq, RuleHeadMismatch, "%s %d:%s, but the ledger keeps hash %s for seq %d (its body was pruned)",
				c.what, c.pin.Seq, c.pin.Hash, h, c.pin.Seq)
		}
		if opts.ExpectHead != nil && opts.Pinned != nil && *opts.ExpectHead == *opts.Pinned {
			break // the same pin twice is checked once
		}
	}
	return nil
}

// learnRows gives the chain checker the prunes whose receipts the chain
// pass does not read (at or below from): their ranges, and for the
// receipts deleted (≤ K) their rows in the audit's pruned_ranges, checked
// to follow each other (prune_invalid).
func (p *pruned) learnRows(col *collector, pr *pruneRanges, from uint64, list bool) {
	for _, row := range p.rows {
		if row.Seq > from {
			continue
		}
		if row.Seq > p.mark.Kept || !list { // live, or in an incremental run's trusted prefix
			pr.through = max(pr.through, row.Through)
			continue
		}
		if row.From != pr.through+1 {
			col.addf(row.Seq, RulePruneInvalid, "the prune row of receipt %d (body deleted) prunes %d…%d, which does not follow the pruned range 1…%d",
				row.Seq, row.From, row.Through, pr.through)
		}
		pr.through = max(pr.through, row.Through)
		pr.list = append(pr.list, PrunedRange{Seq: row.Seq, From: row.From, Through: row.Through, Digest: row.Digest, Segment: row.Segment})
	}
}

// checkRows reports a prune row after from that no prune receipt of the
// chain pass stands for, with its range and digest (prune_invalid): a
// prunes row is written with its receipt, never alone.
func (p *pruned) checkRows(col *collector, pr *pruneRanges, from, through uint64) {
	seen := make(map[uint64]*PrunedRange, len(pr.list))
	for i := range pr.list {
		seen[pr.list[i].Seq] = &pr.list[i]
	}
	for _, row := range p.rows {
		if r := seen[row.Seq]; r != nil && r.Segment == "" {
			r.Segment = row.Segment
		}
		if row.Seq <= from || row.Seq > through {
			continue
		}
		r := seen[row.Seq]
		switch {
		case r == nil:
			col.addf(row.Seq, RulePruneInvalid, "a prune row of %d…%d names receipt %d, which is not a prune receipt of the chain", row.From, row.Through, row.Seq)
		case r.From != row.From || r.Through != row.Through || r.Digest != row.Digest:
			col.addf(row.Seq, RulePruneInvalid, "the prune row of receipt %d (%d…%d, %s) is not the receipt's (%d…%d, %s)",
				row.Seq, row.From, row.Through, row.Digest, r.From, r.Through, r.Digest)
		}
	}
}

// policyAtP is the policy the latest prune carries (SPEC §16: the policy
// in force at P+1), as a policy receipt for the gate; nil without one.
func (p *pruned) policyAtP(ctx context.Context) (*chain.Receipt, error) {
	var latest uint64
	for i := range p.rows {
		if p.rows[i].Through == p.mark.Through {
			latest = p.rows[i].Seq
		}
	}
	if p.served != nil {
		latest = p.served.Prune // checkServedPrune checks it prunes through P
	}
	if latest == 0 || p.mark.Through == 0 {
		return nil, nil
	}
	r, err := readReceipt(ctx, p.src, latest) // above P: live
	if err != nil {
		return nil, fmt.Errorf("read prune receipt %d: %w", latest, err)
	}
	if r == nil || r.Kind != chain.KindPrune {
		return nil, nil // a row without its receipt: checkRows reports it
	}
	res, err := chain.ParsePruneResult(r.Result)
	if err != nil || res.Policy.Seq == 0 {
		return nil, nil // prune_invalid's, or no policy in force
	}
	return &chain.Receipt{Seq: res.Policy.Seq, Kind: chain.KindPolicy, Result: res.Policy.Text, RecordedAt: r.RecordedAt}, nil
}

// beginPruned sets a run up on a pruned ledger: the pins at or below K
// against the kept hashes, the prunes the chain pass does not read, the
// gate's policy in force at P+1 (carried by the latest prune receipt),
// and on a full run after a deletion the kept hashes against the tree.
func (v *Verifier) beginPruned(ctx context.Context, r *run) error {
	pr := r.pruned
	if pr.bad != nil {
		r.chainCol.addf(pr.bad.Seq, pr.bad.Rule, "%s", pr.bad.Detail)
	}
	if pr.served != nil { // the prunes ≤ P went with their receipts
		r.cc.pruned.open, r.cc.pruned.floor = true, pr.mark.Through
	}
	if !pr.any() || pr.mark.Through == 0 && len(pr.rows) == 0 {
		return nil
	}
	if err := pr.checkKeptPins(ctx, r.chainCol, v.opts); err != nil {
		return err
	}
	pr.learnRows(r.chainCol, &r.cc.pruned, r.from, !r.trusted)
	pol, err := pr.policyAtP(ctx)
	if err != nil {
		return err
	}
	if pol != nil {
		r.gate.add(pol)
	}
	if !r.trusted && pr.mark.Kept > 0 && pr.c != nil {
		if r.tree, err = newKeptTree(ctx, pr.c, pr.mark.Kept, r.chainCol); err != nil {
			return err
		}
		r.cc.tree = r.tree
	}
	return nil
}

// unverifiedPruned notes the pruned receipts after the pinned head (the
// --state pin, else --expect-head's) that no joined segment covers: the
// run checked their hashes at most, never their bodies.
func (r *run) unverifiedPruned(opts Opts) {
	pin := opts.Pinned
	if pin == nil {
		pin = opts.ExpectHead
	}
	through := r.pruned.mark.Through
	if pin == nil || !r.pruned.any() || pin.Seq >= through {
		return
	}
	from := pin.Seq + 1
	for moved := true; moved; {
		moved = false
		for _, j := range r.joined {
			if j.From <= from && j.Through >= from {
				from, moved = j.Through+1, true
			}
		}
	}
	if from <= through {
		r.unverified = []uint64{from, through}
	}
}
