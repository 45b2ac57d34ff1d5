package verify

import (
	"github.com/effect-ledger/effect-ledger/chain"
)

// The rules of key receipts (SPEC §9.2).

// RuleKeyRotationConflict: a key receipt retires a key an earlier one
// retired, or announces a key an earlier one announced.
const RuleKeyRotationConflict = "key_rotation_conflict"

// checkKeyReceiptFields checks a key receipt's fields: like a policy,
// only kind, result (its RFC 8785 {"retires", "vkey"}), actor and
// recorded_at are set (SPEC §2.1, §9.2).
func checkKeyReceiptFields(bad func(string, ...any), r *chain.Receipt) {
	checkKeyless(bad, r, false)
	if _, err := chain.ParseKeyResult(r.Result); err != nil {
		bad("key receipt: %v", err)
	}
}

// rotations remembers the keys the chain's key receipts announced and
// retired, for key_rotation_conflict. An incremental run sees only the
// receipts after its pinned head.
type rotations struct {
	announced map[string]uint64 // key id → seq of the key receipt
	retired   map[string]uint64
}

// add checks the key receipt r against the earlier ones.
func (k *rotations) add(col *collector, r *chain.Receipt) {
	res, err := chain.ParseKeyResult(r.Result)
	if err != nil {
		return // invalid_field says so
	}
	_, id, _ := chain.ParseVerifierKey(res.VKey)
	if k.announced == nil {
		k.announced, k.retired = map[string]uint64{}, map[string]uint64{}
	}
	if s, ok := k.retired[res.Retires]; ok {
		col.addf(r.Seq, RuleKeyRotationConflict, "retires key %s, which key receipt %d retired already", res.Retires, s)
	}
	if s, ok := k.announced[id]; ok {
		col.addf(r.Seq, RuleKeyRotationConflict, "announces key %s, which key receipt %d announced already", id, s)
	} else if s, ok := k.retired[id]; ok {
		col.addf(r.Seq, RuleKeyRotationConflict, "announces key %s, which key receipt %d retired", id, s)
	}
	k.announced[id] = r.Seq
	if _, ok := k.retired[res.Retires]; !ok {
		k.retired[res.Retires] = r.Seq
	}
}
