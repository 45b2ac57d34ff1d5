package verify

import (
	"github.com/effect-ledger/effect-ledger/chain"
)

// chainChecker runs the structural checks over receipts in seq order,
// holding only the previous hash: memory does not grow with the chain.
type chainChecker struct {
	col    *collector
	hasher chain.Hasher

	pins    []pinCheck
	from    uint64 // receipts up to from are trusted
	started bool

	next     uint64     // the seq the next receipt must have
	prev     chain.Hash // stored hash of the previous receipt
	lastSeq  uint64
	count    uint64 // receipts in the chain
	checked  uint64 // receipts rehashed
	progress func(uint64)
}

type pinCheck struct {
	pin   *Pin
	what  string
	found bool
}

func newChainChecker(col *collector, opts Opts, from uint64) *chainChecker {
	c := &chainChecker{col: col, from: from, next: 1, progress: opts.Progress}
	for _, p := range []struct {
		pin  *Pin
		what string
	}{{opts.ExpectHead, "expected head"}, {opts.Pinned, "pinned head"}} {
		if p.pin != nil && p.pin.Seq > 0 {
			c.pins = append(c.pins, pinCheck{pin: p.pin, what: p.what})
		}
	}
	return c
}

// after is the seq the scan starts after: the pinned receipt itself is
// read on incremental runs, to check that it still carries its hash.
func (c *chainChecker) after() uint64 {
	if c.from == 0 {
		return 0
	}
	return c.from - 1
}

func (c *chainChecker) add(r *chain.Receipt) {
	if c.from > 0 && !c.started {
		c.started = true
		c.count = c.from
		c.lastSeq, c.next, c.prev = c.from, c.from+1, r.Hash
		c.checkPins(r)
		if r.Seq != c.from {
			c.col.addf(r.Seq, RuleHeadMismatch, "pinned receipt %d is missing: the chain continues at %d", c.from, r.Seq)
		}
		return
	}
	c.count++
	c.checked++
	switch {
	case c.count == 1 && r.Seq != 1:
		c.col.addf(r.Seq, RuleGenesis, "the chain starts at seq %d, not 1", r.Seq)
	case r.Seq != c.next:
		c.col.addf(r.Seq, RuleSeqGap, "seq %d follows %d; want %d", r.Seq, c.lastSeq, c.next)
	}
	if c.count == 1 && c.from == 0 {
		if r.PrevHash != chain.ZeroHash {
			c.col.addf(r.Seq, RuleGenesis, "first receipt has prev_hash %s, want 32 zero bytes", r.PrevHash)
		}
	} else if r.PrevHash != c.prev {
		c.col.addf(r.Seq, RuleBrokenLink, "prev_hash %s, but the previous receipt (seq %d) has hash %s", r.PrevHash, c.lastSeq, c.prev)
	}
	if got := c.hasher.Hash(r.PrevHash, r); got != r.Hash {
		c.col.addf(r.Seq, RuleHashMismatch, "stored hash %s, computed %s", r.Hash, got)
	}
	checkFields(c.col, r)
	c.checkPins(r)
	c.prev, c.lastSeq, c.next = r.Hash, r.Seq, r.Seq+1
	if c.progress != nil && c.count%65536 == 0 {
		c.progress(r.Seq)
	}
}

func (c *chainChecker) checkPins(r *chain.Receipt) {
	for i := range c.pins {
		p := &c.pins[i]
		if p.pin.Seq != r.Seq {
			continue
		}
		p.found = true
		if r.Hash.String() != p.pin.Hash {
			c.col.addf(r.Seq, RuleHeadMismatch, "%s %d:%s, but the chain has %s at seq %d", p.what, p.pin.Seq, p.pin.Hash, r.Hash, r.Seq)
		}
	}
}

func (c *chainChecker) finish() {
	if c.from > 0 && !c.started {
		c.col.addf(c.from, RuleHeadMismatch, "pinned receipt %d is missing: the chain is empty or truncated", c.from)
		c.count = 0
	}
	for _, p := range c.pins {
		if !p.found {
			c.col.addf(p.pin.Seq, RuleHeadMismatch, "%s %d:%s is not in the chain, which ends at seq %d (truncated?)", p.what, p.pin.Seq, p.pin.Hash, c.lastSeq)
		}
	}
	if c.progress != nil {
		c.progress(c.lastSeq)
	}
}

// checkFields flags values no ledger writes.
func checkFields(col *collector, r *chain.Receipt) {
	switch r.Kind {
	case chain.KindReserve, chain.KindCommit, chain.KindReplay, chain.KindResolve:
	default:
		col.addf(r.Seq, RuleInvalidField, "kind %q", r.Kind)
	}
	switch r.Effect {
	case chain.EffectWrite, chain.EffectDestructive, chain.EffectExternal:
	default:
		col.addf(r.Seq, RuleInvalidField, "effect %q", r.Effect)
	}
	outcome := r.Kind == chain.KindCommit || r.Kind == chain.KindResolve
	switch {
	case outcome && r.Outcome != chain.OutcomeSucceeded && r.Outcome != chain.OutcomeFailed:
		col.addf(r.Seq, RuleInvalidField, "%s with outcome %q", r.Kind, r.Outcome)
	case !outcome && r.Outcome != "":
		col.addf(r.Seq, RuleInvalidField, "%s with outcome %q", r.Kind, r.Outcome)
	}
	if r.Attempt == 0 {
		col.addf(r.Seq, RuleInvalidField, "attempt 0")
	}
}
