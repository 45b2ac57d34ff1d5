package verify

import (
	"github.com/effect-ledger/effect-ledger/chain"
)

// checkPruneFields checks a prune receipt's fields other than its result
// (SPEC §16): attempt 0 and nothing else but an actor; pruneRanges checks
// the result.
func checkPruneFields(bad func(string, ...any), r *chain.Receipt) {
	checkKeyless(bad, r, false)
}

// pruneRanges follows the chain's prune receipts: each prunes the range
// that follows the previous one's, the first from receipt 1.
type pruneRanges struct {
	through uint64 // the last prune's
	// list holds every prune receipt checked whose result parses, in seq
	// order: the audit's pruned_ranges, and --segments joins a segment
	// to each (segments.go).
	list []PrunedRange
	// open: the prunes up to floor (a server's P) went with their
	// receipts, unread; the first prune read is taken to follow them when
	// its range starts at or below floor+1.
	open  bool
	floor uint64
}

// add checks the prune receipt r's result (chain.ParsePruneResult), its
// range below r itself and following the earlier prunes' (prune_invalid).
func (p *pruneRanges) add(col *collector, r *chain.Receipt) {
	res, err := chain.ParsePruneResult(r.Result)
	if err == nil && p.open {
		p.open = false
		if res.From >= 1 && res.From-1 <= p.floor {
			p.through = res.From - 1
		}
	}
	switch {
	case err != nil:
		col.addf(r.Seq, RulePruneInvalid, "%v", err)
		return
	case res.Through >= r.Seq || res.Policy.Seq >= r.Seq:
		col.addf(r.Seq, RulePruneInvalid, "the range %d…%d (policy %d) is not below the prune receipt itself", res.From, res.Through, res.Policy.Seq)
	case res.From != p.through+1:
		col.addf(r.Seq, RulePruneInvalid, "the range %d…%d does not follow the pruned range 1…%d", res.From, res.Through, p.through)
	}
	p.through = max(p.through, res.Through)
	p.list = append(p.list, PrunedRange{Seq: r.Seq, Actor: r.Actor, RecordedAt: r.RecordedAt, From: res.From,
		Through: res.Through, Digest: res.Digest})
}

// learn takes a prune receipt of the trusted prefix of an incremental run:
// its range, unchecked.
func (p *pruneRanges) learn(r *chain.Receipt) {
	if res, err := chain.ParsePruneResult(r.Result); err == nil {
		p.through = max(p.through, res.Through)
	}
}

// checkReference reports a receipt whose ref_seq names a pruned receipt
// (pruned_reference). A prune receipt's own ref_seq is invalid_field's.
func (p *pruneRanges) checkReference(col *collector, r *chain.Receipt) {
	if through := max(p.through, p.floor); r.RefSeq > 0 && r.RefSeq <= through && r.Kind != chain.KindPrune {
		col.addf(r.Seq, RulePrunedReference, "ref_seq %d names a receipt pruned (1…%d): a key pruned whole is a new key, with ref_seq 0", r.RefSeq, through)
	}
}

// checkPruneAllowed reports a prune receipt in a namespace without a key
// TTL, whose receipts can be archived but never pruned (SPEC §16):
// prune_invalid.
func (g *gateChecker) checkPruneAllowed(r *chain.Receipt) {
	if g != nil && r.Seq > g.from && g.ttl == 0 {
		g.col.addf(r.Seq, RulePruneInvalid, "a prune in a namespace without a key TTL: its receipts can be archived, never pruned")
	}
}

// checkPrunePolicy reports a prune receipt whose policy is not the one in
// force after its range (the latest policy receipt at or before its
// through), on a run that met every policy receipt (prune_invalid).
func (g *gateChecker) checkPrunePolicy(r *chain.Receipt) {
	if g == nil || g.policies == nil {
		return
	}
	res, err := chain.ParsePruneResult(r.Result)
	if err != nil {
		return // prune_invalid already
	}
	var want chain.PrunePolicy
	for _, p := range *g.policies {
		if p.Seq <= res.Through {
			want = p
		}
	}
	if res.Policy != want {
		g.policyCol.addf(r.Seq, RulePruneInvalid, "it carries policy receipt %d, but the policy in force after its range (%d…%d) is receipt %d's",
			res.Policy.Seq, res.From, res.Through, want.Seq)
	}
}
