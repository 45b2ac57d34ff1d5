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
	// list holds every prune receipt whose result parses, in seq order:
	// --segments joins a segment to each (segments.go).
	list []pruned
}

// pruned is one prune receipt's seq and result.
type pruned struct {
	seq uint64
	res chain.PruneResult
}

// add checks the prune receipt r's result (chain.ParsePruneResult), its
// range below r itself and following the earlier prunes' (prune_invalid).
func (p *pruneRanges) add(col *collector, r *chain.Receipt) {
	res, err := chain.ParsePruneResult(r.Result)
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
	p.list = append(p.list, pruned{seq: r.Seq, res: *res})
}
