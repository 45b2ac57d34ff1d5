package ledger

import (
	"errors"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
)

// How a key's record follows from its receipts: the one rule for the
// record the write path keeps (decideReserve writes it; the SQLite key
// index and both drivers' KeyDrift derive it again from the receipts with
// NextRecord). The verifier keeps its own, independent copy on purpose
// (verify/state.go): it must not trust the code it checks.

// NextRecord applies receipt r of a key to the key's record k (found: k
// holds one) and reports whether it changed it. ref reads the receipt a
// reserve's ref_seq names (nil when there is none). A reserve leaves
// TokenHash to the caller; the gate's receipts and replays change nothing.
func NextRecord(k *KeyRecord, found bool, r *chain.Receipt, ttl uint64, ref func(uint64) (*chain.Receipt, error)) (bool, error) {
	switch r.Kind {
	case chain.KindReserve:
		gen := !found
		if !gen {
			var err error
			if gen, err = StartsGeneration(r, ttl, ref); err != nil {
				return false, err
			}
		}
		if gen {
			*k = KeyRecord{Key: r.IdempotencyKey, Generated: r.KeyGenerated, Tool: r.Tool, Effect: r.Effect,
				InputHash: r.InputHash, Idempotent: r.Idempotent, FirstSeq: r.Seq}
		}
		k.ReserveSeq, k.LeaseExpiresAt = r.Seq, r.LeaseExpiresAt
		return true, nil
	case chain.KindCommit, chain.KindResolve, chain.KindReconcile:
		// A commit of a reservation that already has an outcome is the
		// original call's late commit after a reconcile (SPEC §15): the
		// key's state does not change.
		if !found || r.Seq <= k.FirstSeq || r.Kind == chain.KindCommit && k.finalized() {
			return false, nil
		}
		k.FinalSeq = r.Seq
		return true, nil
	}
	return false, nil
}

// ErrPrunedRef is what a ref function of StartsGeneration returns for a
// pruned receipt: a reserve naming one starts a generation (SPEC §16).
var ErrPrunedRef = errors.New("the receipt named was pruned")

// StartsGeneration reports whether the reserve r of a known key starts a
// new generation of it: it names nothing, a pruned receipt, a replay (SPEC
// §12's renewal of a succeeded key), or an outcome at least ttl older than
// itself. A
// reserve that consumed an approval (SPEC §13) names the approval, which
// names its ask, which names what the reserve would otherwise have named.
func StartsGeneration(r *chain.Receipt, ttl uint64, ref func(uint64) (*chain.Receipt, error)) (bool, error) {
	named, p := r.RefSeq, (*chain.Receipt)(nil)
	for hops := 0; hops < 3; hops++ {
		if named == 0 {
			return true, nil
		}
		var err error
		if p, err = ref(named); errors.Is(err, ErrPrunedRef) {
			return true, nil // a generation never straddles a prune (SPEC §16)
		} else if err != nil {
			return false, fmt.Errorf("receipt %d named by %d: %w", named, r.Seq, err)
		}
		if p == nil || p.IdempotencyKey != r.IdempotencyKey {
			return false, nil
		}
		if p.Kind != chain.KindApproval && p.Kind != chain.KindAsk {
			break
		}
		named = p.RefSeq
	}
	switch p.Kind {
	case chain.KindReplay:
		return true, nil
	case chain.KindCommit, chain.KindResolve, chain.KindReconcile:
		return ttl > 0 && r.RecordedAt >= p.RecordedAt+ttl, nil
	}
	return false, nil
}

// DeriveRecord replays a key's receipts (in seq order; those of other keys
// are skipped) into its record, without its token hash. ref reads a
// receipt the list may not hold.
func DeriveRecord(key string, receipts []chain.Receipt, ttl uint64, ref func(uint64) (*chain.Receipt, error)) (KeyRecord, bool, error) {
	k := KeyRecord{Key: key}
	found := false
	in := func(seq uint64) (*chain.Receipt, error) {
		for i := range receipts {
			if receipts[i].Seq == seq {
				return &receipts[i], nil
			}
		}
		return ref(seq)
	}
	for i := range receipts {
		r := &receipts[i]
		if r.IdempotencyKey != key {
			continue
		}
		changed, err := NextRecord(&k, found, r, ttl, in)
		if err != nil {
			return k, false, err
		}
		found = found || changed
	}
	return k, found, nil
}

// RecordDrift describes how a stored record differs from the derived one
// (KeyDrift's answer): nothing when they agree.
func RecordDrift(stored *KeyRecord, found bool, derived *KeyRecord, dfound bool) []string {
	if found == dfound && (!found || *stored == *derived) {
		return nil
	}
	var out []string
	if found {
		out = append(out, "stored: "+describeRecord(stored))
	}
	if dfound {
		out = append(out, "derived: "+describeRecord(derived))
	}
	return out
}

func describeRecord(k *KeyRecord) string {
	return fmt.Sprintf("first_seq=%d reserve_seq=%d lease_expires_at=%d final_seq=%d tool=%s effect=%s input_hash=%s idempotent=%t key_generated=%t",
		k.FirstSeq, k.ReserveSeq, k.LeaseExpiresAt, k.FinalSeq, k.Tool, k.Effect, k.InputHash, k.Idempotent, k.Generated)
}
