package verify

import (
	"errors"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// checkRetentionKeys checks the other half of a retention erase (SPEC
// §14): a sweep erases the values of receipts of finished keys only, so
// every receipt the erase at r lists must be of a key that was final at
// r, or of an earlier generation of its key. Each key's generation as of
// r is derived here from its own receipts, independently of the ledger's
// code (as the state checks are): one erase_invalid per key.
func (p *payloadChecker) checkRetentionKeys(r *chain.Receipt, ranges []chain.Range) {
	listed := map[string][]uint64{}
	var keys []string
	for _, rg := range ranges {
		for s := rg[0]; s <= rg[1]; s++ {
			rc, err := p.db.GetReceipt(p.ctx, s)
			if err != nil {
				p.err = errors.Join(p.err, err)
				return
			}
			if rc == nil || rc.IdempotencyKey == "" {
				continue
			}
			if listed[rc.IdempotencyKey] == nil {
				keys = append(keys, rc.IdempotencyKey)
			}
			listed[rc.IdempotencyKey] = append(listed[rc.IdempotencyKey], s)
		}
	}
	for _, key := range keys {
		rs, err := p.keyReceiptsBefore(key, r.Seq)
		if err != nil {
			p.err = errors.Join(p.err, err)
			return
		}
		first, open := openGeneration(rs, p.ttl)
		if !open {
			continue
		}
		for _, s := range listed[key] {
			if s >= first {
				p.col.addf(r.Seq, RuleEraseInvalid, "a retention erase lists receipt %d, of key %q, which was still in flight (its generation from seq %d has no outcome)",
					s, key, first)
				break
			}
		}
	}
}

// keyReceiptsBefore lists key's receipts with a seq below before.
func (p *payloadChecker) keyReceiptsBefore(key string, before uint64) ([]chain.Receipt, error) {
	var out []chain.Receipt
	f := ledger.ReceiptFilter{Key: key, Limit: ledger.MaxPageLimit}
	for {
		rs, next, err := p.db.ListReceipts(p.ctx, f)
		if err != nil {
			return nil, fmt.Errorf("read the receipts of key %q: %w", key, err)
		}
		for i := range rs {
			if rs[i].Seq >= before {
				return out, nil
			}
			out = append(out, rs[i])
		}
		if next == nil {
			return out, nil
		}
		f.After = *next
	}
}

// openGeneration follows a key's receipts (seq order) and returns the
// first seq of its last generation and whether that generation is in
// flight: its latest reserve has no commit, resolve or reconcile after
// it. A reserve starts a generation when it is the key's first, names
// nothing, names a replay (a renewal of a succeeded key, §12) or an
// outcome at least ttl older than itself (§12), following an approval to
// its ask (§13) first.
func openGeneration(rs []chain.Receipt, ttl uint64) (first uint64, open bool) {
	bySeq := make(map[uint64]*chain.Receipt, len(rs))
	for i := range rs {
		bySeq[rs[i].Seq] = &rs[i]
	}
	var reserve, final uint64
	for i := range rs {
		r := &rs[i]
		switch r.Kind {
		case chain.KindReserve:
			if first == 0 || startsGeneration(r, bySeq, ttl) {
				first, final = r.Seq, 0
			}
			reserve = r.Seq
		case chain.KindCommit, chain.KindResolve, chain.KindReconcile:
			if first == 0 || r.Seq <= first || r.Kind == chain.KindCommit && final > reserve {
				continue // before any reserve, or a late commit after a reconcile (§15)
			}
			final = r.Seq
		}
	}
	return first, first != 0 && final < reserve
}

// startsGeneration reports whether the reserve r of a key already seen
// starts a new generation (openGeneration).
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
