package verify

import (
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
)

// chainChecker runs the structural checks over receipts in seq order,
// holding only the previous hash: memory does not grow with the chain.
type chainChecker struct {
	col    *collector
	hasher chain.Hasher
	gate   *gateChecker // the rules of SPEC §13, on the same pass
	// payloads checks the values of a committed namespace (SPEC §14);
	// nil for an inline one.
	payloads *payloadChecker

	pins   []pinCheck
	keys   rotations   // the key receipts seen (keys.go)
	pruned pruneRanges // the prune receipts seen (prune.go)
	// prunedThrough is P: the receipts up to it are chain-checked only
	// (SPEC §16); tree, on a full run after a deletion, rebuilds the
	// Merkle tree over the kept and live hashes (kept.go).
	prunedThrough uint64
	tree          *keptTree

	next        uint64     // the seq the next receipt must have
	prev        chain.Hash // stored hash of the previous receipt
	prevUnknown bool       // the previous receipt's hash is malformed and cannot be computed
	lastSeq     uint64
	// prevAt is the recorded_at of the previous receipt, when known
	// (prevAtOK: it was well formed, or the pinned receipt's on an
	// incremental run).
	prevAt, prevAtSeq uint64
	prevAtOK          bool
	count             uint64 // receipts in the chain
	checked           uint64 // receipts rehashed
	progress          func(uint64)
}

type pinCheck struct {
	pin   *Pin
	what  string
	found bool
}

// newChainChecker returns a checker that starts after the receipt at
// from (0: at the genesis), whose hash is prev and whose recorded_at is
// prevAt; the pins at or below from were checked already.
func newChainChecker(col *collector, opts Opts, from uint64, prev chain.Hash, prevAt uint64) *chainChecker {
	c := &chainChecker{col: col, next: from + 1, prev: prev, lastSeq: from, count: from, progress: opts.Progress,
		prevAt: prevAt, prevAtSeq: from, prevAtOK: from > 0}
	for _, p := range []struct {
		pin  *Pin
		what string
	}{{opts.ExpectHead, "expected head"}, {opts.Pinned, "pinned head"}} {
		if p.pin == nil || p.pin.Seq == 0 {
			continue
		}
		if len(c.pins) > 0 && *c.pins[0].pin == *p.pin {
			continue // the same pin twice is checked once
		}
		c.pins = append(c.pins, pinCheck{pin: p.pin, what: p.what, found: p.pin.Seq <= from})
	}
	return c
}

func (c *chainChecker) add(r *chain.Receipt) {
	c.count++
	c.checked++
	switch {
	case c.count == 1 && r.Seq != 1:
		c.col.addf(r.Seq, RuleGenesis, "the chain starts at seq %d, not 1", r.Seq)
	case r.Seq != c.next && !r.IsMalformed("seq"):
		c.col.addf(r.Seq, RuleSeqGap, "seq %d follows %d; want %d", r.Seq, c.lastSeq, c.next)
	}
	prevOK, hashOK, bodyOK := true, true, true
	for _, m := range r.Malformed { // checkFields reports each
		switch m.Field {
		case "prev_hash":
			prevOK = false
		case "hash":
			hashOK = false
		default:
			bodyOK = false // no canonical body: the receipt cannot be hashed
		}
	}
	switch {
	case c.prevUnknown || !prevOK:
	case c.count == 1:
		if r.PrevHash != chain.ZeroHash {
			c.col.addf(r.Seq, RuleGenesis, "first receipt has prev_hash %s, want 32 zero bytes", r.PrevHash)
		}
	case r.PrevHash != c.prev:
		c.col.addf(r.Seq, RuleBrokenLink, "prev_hash %s, but the previous receipt (seq %d) has hash %s", r.PrevHash, c.lastSeq, c.prev)
	}
	next, nextOK := r.Hash, hashOK
	if bodyOK && prevOK {
		got := c.hasher.Hash(r.PrevHash, r)
		if hashOK && got != r.Hash {
			c.col.addf(r.Seq, RuleHashMismatch, "stored hash %s, computed %s", r.Hash, got)
		}
		if !hashOK { // the next link is checked against what the hash should be
			next, nextOK = got, true
		}
	}
	c.tree.add(r.Hash)
	if c.isPruned(r) { // its chain only, and the prunes
		if r.Kind == chain.KindPrune && bodyOK {
			c.pruned.add(c.col, r)
		}
		c.checkRecordedAt(r)
		c.checkPins(r)
		c.prev, c.prevUnknown, c.lastSeq, c.next = next, !nextOK, r.Seq, r.Seq+1
		if c.progress != nil && c.count%65536 == 0 {
			c.progress(r.Seq)
		}
		return
	}
	if r.Kind == chain.KindErase && c.payloads == nil {
		c.col.addf(r.Seq, RuleEraseInvalid, "an erase receipt in a namespace that keeps its payloads inline")
	}
	v := c.payloads.check(r) // r with its values, in a committed namespace
	checkFields(c.col, v)
	c.pruned.checkReference(c.col, r)
	switch r.Kind {
	case chain.KindKey:
		c.keys.add(c.col, r)
	case chain.KindPrune:
		c.pruned.add(c.col, r)
		c.gate.checkPruneAllowed(r)
		c.gate.checkPrunePolicy(r)
	}
	if c.gate != nil {
		c.gate.add(v)
	}
	c.checkRecordedAt(r)
	c.checkPins(r)
	c.prev, c.prevUnknown, c.lastSeq, c.next = next, !nextOK, r.Seq, r.Seq+1
	if c.progress != nil && c.count%65536 == 0 {
		c.progress(r.Seq)
	}
}

// checkRecordedAt reports a receipt recorded before its predecessor:
// recorded times never decrease within a chain (contract v1.3). A
// malformed recorded_at is invalid_field's, and the next receipt is not
// compared with it.
func (c *chainChecker) checkRecordedAt(r *chain.Receipt) {
	if r.IsMalformed("recorded_at") {
		c.prevAtOK = false
		return
	}
	if c.prevAtOK && r.RecordedAt < c.prevAt {
		c.col.addf(r.Seq, RuleRecordedAtDecreased, "recorded_at %d (%s) is before the %d (%s) of seq %d: recorded times must not decrease within a chain",
			r.RecordedAt, msTime(r.RecordedAt), c.prevAt, msTime(c.prevAt), c.prevAtSeq)
	}
	c.prevAt, c.prevAtSeq, c.prevAtOK = r.RecordedAt, r.Seq, true
}

// msTime formats unix milliseconds as RFC 3339 UTC with milliseconds.
func msTime(ms uint64) string {
	return time.UnixMilli(int64(ms)).UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

func (c *chainChecker) checkPins(r *chain.Receipt) {
	for i := range c.pins {
		p := &c.pins[i]
		if p.pin.Seq != r.Seq {
			continue
		}
		p.found = true
		if r.Hash.String() != p.pin.Hash || r.IsMalformed("hash") {
			c.col.addf(r.Seq, RuleHeadMismatch, "%s %d:%s, but the chain has %s at seq %d", p.what, p.pin.Seq, p.pin.Hash, r.Hash, r.Seq)
		}
	}
}

func (c *chainChecker) finish() {
	for _, p := range c.pins {
		if !p.found {
			c.col.addf(p.pin.Seq, RuleHeadMismatch, "%s %d:%s is not in the chain, which ends at seq %d (truncated?)", p.what, p.pin.Seq, p.pin.Hash, c.lastSeq)
		}
	}
	if c.progress != nil {
		c.progress(c.lastSeq)
	}
}

// isPruned reports whether r is a receipt of the pruned prefix, which the
// chain pass checks for its links only (a seq that is not a number is not).
func (c *chainChecker) isPruned(r *chain.Receipt) bool {
	return c.prunedThrough > 0 && r.Seq <= c.prunedThrough && !r.IsMalformed("seq")
}
