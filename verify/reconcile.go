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
	Erased     Erased `json:"erased,omitempty"` // lookup: the note it is read from was erased
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
	Erased                Erased `json:"erased,omitempty"` // reconciled_external_ref, external_ref
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
	if k.hasReserve && r.RefSeq == k.latest.seq && !k.finalized {
		rr := reconciledReserve{reserve: k.latest,
			fp:           fingerprintHash(k.first.Tool, k.first.Effect, k.first.InputHash, k.first.Idempotent, k.first.KeyGenerated),
			reconcileSeq: r.Seq, outcome: r.Outcome}
		rr.ref, rr.refErased, rr.refKnown = payloadValue(r, chain.FieldExternalRef)
		k.reconciled = append(k.reconciled, rr)
	}
	s.setFinal(k, r)
	s.audit.reconciliation(k, r)
}

// reconciledReserve is a reserve a reconcile finalized, and what the
// original call's late commit of it is checked against: the reserve's
// execution, attempt and fingerprint, the reconcile's outcome and
// external_ref. The key may have been reserved again since (a rerun
// after not_applied, or a new generation): the late commit names this
// reserve all the same, and the ledger appends it (SPEC §15).
type reconciledReserve struct {
	reserve      reserveInfo
	fp           uint64 // fingerprintHash of the reserve's generation
	reconcileSeq uint64
	outcome, ref string // the reconcile's outcome and external_ref
	refErased    uint64 // the erase receipt of the external_ref, 0 if none
	refKnown     bool   // ref is the value, neither erased nor unread
	commitSeq    uint64 // the late commit, once one is seen
}

// reconciledOf returns the reconciled reserve that r, a commit, names;
// nil when r is no commit or names no reserve a reconcile finalized.
func (k *keyState) reconciledOf(r *chain.Receipt) *reconciledReserve {
	if r.Kind != chain.KindCommit {
		return nil
	}
	for i := range k.reconciled {
		if k.reconciled[i].reserve.seq == r.RefSeq {
			return &k.reconciled[i]
		}
	}
	return nil
}

// countsForAttempts reports whether r counts for the attempts of the
// key's generation: as countsForAttempts says, except the late commit of
// a reserve of an earlier generation, whose attempt is that one's.
func (k *keyState) countsForAttempts(r *chain.Receipt) bool {
	if !countsForAttempts(r.Kind) {
		return false
	}
	if r.Kind == chain.KindCommit && r.RefSeq < k.first.Seq && k.reconciledOf(r) != nil {
		return false
	}
	return true
}

// lateCommit checks the commit of a reserve a reconcile finalized: the
// original call landing late, appended and exempt from
// double_finalization, the key's state unchanged, even when the key was
// reserved again since (SPEC §15). It must carry the reserve's
// execution, attempt and fingerprint; a second commit of the reserve
// finalizes it twice, as the ledger refuses one. One whose outcome or
// external_ref differs from the reconciled one is listed as contradicted;
// an external_ref erased on either side (or not read) is not compared, as
// the ledger compares a commit re-sent after erasure (SPEC §14).
func (s *stateChecker) lateCommit(k *keyState, r *chain.Receipt, rr *reconciledReserve) {
	if fingerprintHash(r.Tool, r.Effect, r.InputHash, r.Idempotent, r.KeyGenerated) != rr.fp {
		s.violation(r, RuleFingerprintChanged,
			"key %q: the late commit of reserve %d has tool=%s effect=%s input_hash=%s idempotent=%t key_generated=%t, another fingerprint than that reserve's",
			k.key, rr.reserve.seq, r.Tool, r.Effect, r.InputHash, r.Idempotent, r.KeyGenerated)
	}
	switch {
	case r.ExecutionID != rr.reserve.execution || r.Attempt != rr.reserve.attempt:
		s.violation(r, RuleCommitWithoutReserve, "key %q: commit carries execution %q attempt %d, but reserve %d is execution %q attempt %d",
			k.key, r.ExecutionID, r.Attempt, rr.reserve.seq, rr.reserve.execution, rr.reserve.attempt)
	case rr.commitSeq != 0:
		s.violation(r, RuleDoubleFinalization, "key %q: reserve %d, reconciled by %d, already has the late commit %d",
			k.key, rr.reserve.seq, rr.reconcileSeq, rr.commitSeq)
	default:
		rr.commitSeq = r.Seq
		r = s.shown(r)
		ref, refErased, known := payloadValue(r, chain.FieldExternalRef)
		if r.Outcome != rr.outcome || known && rr.refKnown && ref != rr.ref {
			s.audit.contradicted(k, r, rr, ref, refErased)
		}
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

// reconciliation records the reconcile r of k, shown with its values.
func (b *auditBuilder) reconciliation(k *keyState, r *chain.Receipt) {
	if b.wants(k, r.Seq, r.RecordedAt) {
		note, erasedBy, _ := payloadValue(r, chain.FieldNote)
		lookup, _ := evidenceLookup(note)
		rc := Reconciliation{Key: k.key, Tool: k.first.Tool, Outcome: r.Outcome, Lookup: lookup, Seq: r.Seq,
			Actor: r.Actor, RecordedAt: r.RecordedAt}
		rc.Erased.add("lookup", erasedBy)
		b.a.Reconciliations = append(b.a.Reconciliations, rc)
	}
}

// contradicted records the late commit r of the reserve rr reconciled,
// whose external_ref shows as ref (erased by refErased).
func (b *auditBuilder) contradicted(k *keyState, r *chain.Receipt, rr *reconciledReserve, ref string, refErased uint64) {
	if b.wants(k, r.Seq, r.RecordedAt) {
		c := ReconcileContradiction{Key: k.key, Tool: k.first.Tool, ReconcileSeq: rr.reconcileSeq,
			ReconciledOutcome: rr.outcome, ReconciledExternalRef: rr.ref, CommitSeq: r.Seq, Outcome: r.Outcome,
			ExternalRef: ref, RecordedAt: r.RecordedAt}
		c.Erased.add("reconciled_external_ref", rr.refErased)
		c.Erased.add("external_ref", refErased)
		b.a.ReconcileContradicted = append(b.a.ReconcileContradicted, c)
	}
}
