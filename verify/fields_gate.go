package verify

import (
	"encoding/json"
	"slices"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// maxChangedValue bounds each value of a reserve's changed object
// (SPEC §13: strings of at most 256).
const maxChangedValue = 256

// checkPolicyFields checks a policy receipt: it sets only seq, kind,
// result (the policy's text, which the gate checker parses), actor and
// recorded_at (SPEC §2.1).
func checkPolicyFields(bad func(string, ...any), r *chain.Receipt) {
	for _, f := range [...]struct{ name, v string }{
		{"idempotency_key", r.IdempotencyKey}, {"execution_id", r.ExecutionID}, {"tool", r.Tool},
		{"effect", r.Effect}, {"input_hash", r.InputHash}, {"outcome", r.Outcome}, {"external_ref", r.ExternalRef},
		{"note", r.Note},
	} {
		notOn(bad, r.Kind, f.name, f.v)
	}
	noFailure(bad, r.Kind, r)
	for _, f := range [...]struct {
		name string
		v    uint64
	}{{"attempt", r.Attempt}, {"lease_expires_at", r.LeaseExpiresAt}, {"ref_seq", r.RefSeq}} {
		if f.v != 0 {
			bad("policy with %s %d", f.name, f.v)
		}
	}
	if r.KeyGenerated || r.Idempotent {
		bad("policy with key_generated or idempotent set")
	}
	if r.Result == "" {
		bad("policy without a result (its text)")
	}
	checkResult(bad, r.Result)
}

// checkAskFields checks what an ask carries besides the request's fields:
// no outcome, and a result {"input_hash", "summary"}, never the input.
func checkAskFields(bad func(string, ...any), r *chain.Receipt) {
	notOn(bad, r.Kind, "outcome", r.Outcome)
	notOn(bad, r.Kind, "external_ref", r.ExternalRef)
	noFailure(bad, r.Kind, r)
	checkResult(bad, r.Result)
	checkMembers(bad, r.Kind, r.Result, "input_hash", "summary")
}

// checkApprovalFields checks an approval: outcome approved or rejected,
// ref_seq its ask, result {"role"}.
func checkApprovalFields(bad func(string, ...any), r *chain.Receipt) {
	if r.Outcome != chain.OutcomeApproved && r.Outcome != chain.OutcomeRejected {
		bad("approval with outcome %q, not approved or rejected", truncate(r.Outcome))
	}
	if r.RefSeq == 0 && !r.IsMalformed("ref_seq") {
		bad("approval without ref_seq (its ask)")
	}
	notOn(bad, r.Kind, "external_ref", r.ExternalRef)
	noFailure(bad, r.Kind, r)
	checkResult(bad, r.Result)
	checkMembers(bad, r.Kind, r.Result, "role")
}

// checkMembers reports a result that is not a JSON object of strings
// with only the members named.
func checkMembers(bad func(string, ...any), kind, result string, names ...string) {
	var m map[string]string
	if err := json.Unmarshal([]byte(result), &m); err != nil || m == nil {
		bad("%s with result %q, not an object of strings", kind, truncate(result))
		return
	}
	for k := range m {
		if !slices.Contains(names, k) {
			bad("%s with result member %q", kind, truncate(k))
		}
	}
}

// checkChanged checks a reserve's note: empty, or the RFC 8785 text of
// the request's changed object (SPEC §13).
func checkChanged(bad func(string, ...any), note string) {
	if note == "" {
		return
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(note), &m); err != nil || m == nil || !chain.IsCompactJSON(note) {
		bad("reserve with note %q, not a changed object", truncate(note))
		return
	}
	for k, v := range m {
		switch {
		case k != "context_hash" && k != "component" && k != "strategy":
			bad("reserve whose changed object has member %q", truncate(k))
		case len(v) > maxChangedValue:
			bad("reserve whose changed %s is over %d bytes", k, maxChangedValue)
		}
	}
}

// checkEraseFields checks an erase receipt (SPEC §14): no key and no
// outcome, attempt 0, a reason in note (the result's set is checked
// against the stored ranges by the payload checks).
func checkEraseFields(bad func(string, ...any), r *chain.Receipt) {
	checkKeyless(bad, r, true)
	checkText(bad, "note", r.Note, ledger.MaxEraseReason)
}

// checkKeyless checks what a keyless receipt of the erase, key and prune
// kinds leaves empty: every field of a key and an effect, the failure
// fields, attempt, lease, ref_seq and both flags, and the note unless
// withNote. Their result is checked by the kind's own parser.
func checkKeyless(bad func(string, ...any), r *chain.Receipt, withNote bool) {
	for _, f := range [...]struct{ name, v string }{
		{"idempotency_key", r.IdempotencyKey}, {"execution_id", r.ExecutionID}, {"tool", r.Tool},
		{"effect", r.Effect}, {"input_hash", r.InputHash}, {"outcome", r.Outcome}, {"external_ref", r.ExternalRef},
	} {
		notOn(bad, r.Kind, f.name, f.v)
	}
	if !withNote {
		notOn(bad, r.Kind, "note", r.Note)
	}
	noFailure(bad, r.Kind, r)
	if r.Attempt != 0 || r.LeaseExpiresAt != 0 || r.RefSeq != 0 || r.KeyGenerated || r.Idempotent {
		bad("%s with an attempt, lease, ref_seq, key_generated or idempotent", r.Kind)
	}
}
