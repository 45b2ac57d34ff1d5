package verify

import (
	"encoding/json"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Reconciling an unknown outcome (SPEC §15): a reconcile ends an
// interrupted key as a resolve does, by the actor of its reserve (or an
// admin) under a policy rule that allows it; the original call's commit
// may land after it, appended and exempt from double_finalization.

// Reconciliation is a reconcile receipt: an interrupted key ended by the
// actor of its reserve from what a lookup of the downstream answered,
// listed apart from a person's resolutions.
type Reconciliation struct {
	Key        string `json:"key"`
	Tool       string `json:"tool"`
	Outcome    string `json:"outcome"`
	Lookup     string `json:"lookup"` // what was asked (the evidence's lookup)
	Seq        uint64 `json:"seq"`
	Actor      string `json:"actor"`
	RecordedAt uint64 `json:"recorded_at"`
}

// ReconcileContradiction is the original call's commit of a reconciled
// reservation whose outcome or external_ref differs from the reconciled
// one: the lookup's evidence was wrong, and a person should look.
type ReconcileContradiction struct {
	Key                   string `json:"key"`
	Tool                  string `json:"tool"`
	ReconcileSeq          uint64 `json:"reconcile_seq"`
	ReconciledOutcome     string `json:"reconciled_outcome"`
	ReconciledExternalRef string `json:"reconciled_external_ref"`
	CommitSeq             uint64 `json:"commit_seq"`
	Outcome               string `json:"outcome"`
	ExternalRef           string `json:"external_ref"`
	RecordedAt            uint64 `json:"recorded_at"`
}

// reconcile checks a reconcile receipt against the key's state: it must
// end the key's latest reserve, interrupted at its recorded_at, repeat
// that reserve's execution and attempt, and carry succeeded (with an
// external_ref) or not_applied; its actor must be the reserve's or an
// admin's. The policy's part is the gate checker's.
func (s *stateChecker) reconcile(k *keyState, r *chain.Receipt) {
	switch {
	case !k.hasReserve || r.RefSeq != k.latest.seq:
		s.violation(r, RuleReconcileInvalid, "key %q: reconcile names reserve %d, but the key's latest reserve is %d", k.key, r.RefSeq, k.latest.seq)
	case k.finalized:
		s.violation(r, RuleReconcileInvalid, "key %q: reconcile of reserve %d, already finalized by %s %d", k.key, r.RefSeq, k.final.kind, k.final.seq)
	case r.RecordedAt < k.latest.lease:
		s.violation(r, RuleReconcileInvalid, "key %q: reconcile at %d while reserve %d still held its lease until %d", k.key, r.RecordedAt, k.latest.seq, k.latest.lease)
	case r.ExecutionID != k.latest.execution || r.Attempt != k.latest.attempt:
		s.violation(r, RuleReconcileInvalid, "key %q: reconcile carries execution %q attempt %d, but reserve %d is execution %q attempt %d",
			k.key, r.ExecutionID, r.Attempt, k.latest.seq, k.latest.execution, k.latest.attempt)
	case r.Outcome == chain.OutcomeSucceeded && r.ExternalRef == "":
		s.violation(r, RuleReconcileInvalid, "key %q: reconcile succeeded without the external_ref the lookup found", k.key)
	case r.Outcome != chain.OutcomeSucceeded && r.Outcome != chain.OutcomeNotApplied:
		s.violation(r, RuleReconcileInvalid, "key %q: reconcile with outcome %q, not succeeded or not_applied", k.key, truncate(r.Outcome))
	case r.Actor != k.latest.actor && s.admin != nil && !s.admin(r.Actor):
		s.violation(r, RuleReconcileNotAllowed, "key %q: reconcile by %q of reserve %d by %q; only the reserve's actor or an admin may",
			k.key, truncate(r.Actor), k.latest.seq, truncate(k.latest.actor))
	}
	r = s.shown(r)
	s.setFinal(k, r)
	s.audit.reconciliation(k, r)
}

// lateCommit checks the commit of a reservation a reconcile finalized:
// the original call landing late, appended and exempt from
// double_finalization (SPEC §15). One whose outcome or external_ref
// differs from the reconciled one is listed as contradicted.
func (s *stateChecker) lateCommit(k *keyState, r *chain.Receipt) {
	if r.ExecutionID != k.latest.execution || r.Attempt != k.latest.attempt {
		s.violation(r, RuleCommitWithoutReserve, "key %q: commit carries execution %q attempt %d, but reserve %d is execution %q attempt %d",
			k.key, r.ExecutionID, r.Attempt, k.latest.seq, k.latest.execution, k.latest.attempt)
	}
	if r = s.shown(r); r.Outcome != k.final.outcome || r.Value(chain.FieldExternalRef) != k.final.reconciledRef {
		s.audit.contradicted(k, r)
	}
}

// evidenceLookup reads the lookup of a reconcile's evidence (its note).
func evidenceLookup(note string) (string, bool) {
	var ev struct {
		Lookup *string          `json:"lookup"`
		Answer *json.RawMessage `json:"answer"`
	}
	if err := strictUnmarshal(note, &ev); err != nil || ev.Lookup == nil || *ev.Lookup == "" || ev.Answer == nil {
		return "", false
	}
	return *ev.Lookup, true
}

// checkEvidence checks a reconcile's note: the evidence object, with a
// lookup and an answer.
func checkEvidence(bad func(string, ...any), note string) {
	if _, ok := evidenceLookup(note); !ok {
		bad("reconcile with note %q, not the evidence {\"lookup\", \"answer\"}", truncate(note))
	}
}

func (b *auditBuilder) reconciliation(k *keyState, r *chain.Receipt) {
	if b.wants(k, r.Seq, r.RecordedAt) {
		lookup, _ := evidenceLookup(r.Value(chain.FieldNote))
		b.a.Reconciliations = append(b.a.Reconciliations, Reconciliation{Key: k.key, Tool: k.first.Tool,
			Outcome: r.Outcome, Lookup: lookup, Seq: r.Seq, Actor: r.Actor, RecordedAt: r.RecordedAt})
	}
}

func (b *auditBuilder) contradicted(k *keyState, r *chain.Receipt) {
	if b.wants(k, r.Seq, r.RecordedAt) {
		b.a.ReconcileContradicted = append(b.a.ReconcileContradicted, ReconcileContradiction{Key: k.key,
			Tool: k.first.Tool, ReconcileSeq: k.final.seq, ReconciledOutcome: k.final.outcome,
			ReconciledExternalRef: k.final.reconciledRef, CommitSeq: r.Seq, Outcome: r.Outcome,
			ExternalRef: r.Value(chain.FieldExternalRef), RecordedAt: r.RecordedAt})
	}
}
