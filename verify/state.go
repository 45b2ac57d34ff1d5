package verify

import (
	"cmp"
	"hash/maphash"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// keyState is what the state checks remember of one key.
type keyState struct {
	key string
	// The fingerprint and flags of the key's first receipt.
	first chain.Receipt

	hasReserve bool
	latest     reserveInfo // the latest reserve
	finalized  bool        // the latest reserve has a commit or resolve
	final      finalInfo

	attempts []execAttempt // highest attempt per execution; usually one

	// reconciled are the key's reserves a reconcile finalized, whose
	// original call's commit may still land, after the key's rerun too
	// (SPEC §15). Usually none.
	reconciled []reconciledReserve

	gate gateLink // the key's latest ask and its answer
}

// gateLink ties the key's latest ask to the approval that answered it, so
// that a reserve consuming the approval is checked as the reserve the ask
// stood for: its ref_seq names the approval, whose ref_seq names the ask,
// whose ref_seq names what the reserve would otherwise name (SPEC §13).
type gateLink struct {
	askSeq, askRef, approvalSeq uint64
	consumed                    bool // a reserve named approvalSeq
}

// ref is what a reserve naming refSeq names for the rules of §4 and §12.
func (g gateLink) ref(refSeq uint64) uint64 {
	if refSeq != 0 && refSeq == g.approvalSeq {
		return g.askRef
	}
	return refSeq
}

// reused reports whether refSeq names an approval an earlier reserve
// consumed: approval_reused (the gate checker's) says all there is.
func (g gateLink) reused(refSeq uint64) bool {
	return refSeq != 0 && refSeq == g.approvalSeq && g.consumed
}

// holdsNoState reports whether a receipt of kind starts no key state when
// it is the key's first: policy, deny and approval receipts fix nothing
// (SPEC §2.1).
func holdsNoState(kind string) bool {
	return chain.Keyless(kind) || kind == chain.KindDeny || kind == chain.KindApproval
}

// countsForAttempts reports whether a receipt of kind counts for the
// attempt rule of §4 and attempt_order. The gate's receipts do not: an
// ask stands for a reserve not appended, and the reserve that consumes
// its approval may be the same request, waiting (SPEC §13).
func countsForAttempts(kind string) bool {
	return !chain.Keyless(kind) && kind != chain.KindAsk && kind != chain.KindApproval && kind != chain.KindDeny
}

// execAttempt is the highest attempt of an execution, which is named by
// its keyed hash (stringHash): the compact key states of the single pass
// keep no strings.
type execAttempt struct {
	execution uint64
	attempt   uint64
}

// hashSeed keys the hashes that stand in for strings in key states. It
// is random per process, so that no edited ledger can aim at a collision.
var hashSeed, hashSeed2 = maphash.MakeSeed(), maphash.MakeSeed()

// stringHash is the keyed 64-bit hash of s.
func stringHash(s string) uint64 { return maphash.String(hashSeed, s) }

// stringHash2 is a second keyed hash of s, independent of stringHash.
func stringHash2(s string) uint64 { return maphash.String(hashSeed2, s) }

// attempt returns the highest attempt recorded for an execution.
func (k *keyState) attempt(execution string) (uint64, bool) {
	h := stringHash(execution)
	for _, a := range k.attempts {
		if a.execution == h {
			return a.attempt, true
		}
	}
	return 0, false
}

func (k *keyState) record(execution string, attempt uint64) {
	h := stringHash(execution)
	for i := range k.attempts {
		if k.attempts[i].execution == h {
			k.attempts[i].attempt = max(k.attempts[i].attempt, attempt)
			return
		}
	}
	k.attempts = append(k.attempts, execAttempt{h, attempt})
}

type reserveInfo struct {
	seq, attempt, lease, recordedAt uint64
	execution, actor                string
}

// reserveOf is what the key state keeps of reserve r.
func reserveOf(r *chain.Receipt) reserveInfo {
	return reserveInfo{seq: r.Seq, attempt: r.Attempt, lease: r.LeaseExpiresAt, recordedAt: r.RecordedAt,
		execution: r.ExecutionID, actor: r.Actor}
}

type finalInfo struct {
	seq, recordedAt      uint64
	kind, outcome, code  string
	retryable, succeeded bool
}

// finalOf is what the key state keeps of the outcome r.
func finalOf(r *chain.Receipt) finalInfo {
	return finalInfo{seq: r.Seq, recordedAt: r.RecordedAt, kind: r.Kind, outcome: r.Outcome,
		code: r.ErrorCode, retryable: r.Retryable, succeeded: r.Outcome == chain.OutcomeSucceeded}
}

// state is the key's state at unix ms t (SPEC §3).
func (k *keyState) state(t uint64) string {
	switch {
	case k.finalized && k.final.succeeded:
		return "succeeded"
	case k.finalized && k.final.outcome == chain.OutcomeNotApplied:
		return "not_applied"
	case k.finalized:
		return "failed"
	case !k.hasReserve:
		return "none"
	case t < k.latest.lease:
		return "reserved"
	default:
		return "interrupted"
	}
}

// stateChecker replays receipts through the rules of SPEC §3–4, per key,
// and the key lifetime of SPEC §12.
type stateChecker struct {
	col   *collector
	audit *auditBuilder
	from  uint64 // violations are reported only for seq > from
	// ttl is the ledger's key_ttl_ms: a reserve at least this long after
	// a key's outcome starts a new generation of the key (0: never).
	ttl  uint64
	keys map[string]*keyState
	// In grouped mode one keyState is reused for key after key. fresh
	// tells whether the key has a receipt after from: a key pass bounded
	// by the chain pass's end can read a key whose later receipts it
	// leaves out, and such a key is not this run's to finish.
	grouped keyState
	fresh   bool
	drift   *driftChecker // cross-checks the keys table, in grouped full runs
	// admin reports whether an actor is an admin token (Opts.Admin); nil:
	// unknown, and a reconcile by another actor than its reserve's is
	// accepted (SPEC §15).
	admin func(actor string) bool
	// open returns a committed receipt with its values (SPEC §14), for
	// the few checks that compare values: a reconcile's and a late
	// commit's external_ref, the evidence's lookup. nil: receipts carry
	// them (a server's) or the namespace is inline.
	open func(r *chain.Receipt) (*chain.Receipt, error)
	err  error // the first value that could not be read
	// prunes are the ledger's prunes on a run joined to the segments
	// (segjoin.go): a key whose generation ended within a prune's range
	// was pruned whole, and a reserve after that prune starts it anew
	// with ref_seq 0 (SPEC §16).
	prunes []ledger.Prune
}

// prunedAt is how far the prunes appended before receipt seq pruned.
func (s *stateChecker) prunedAt(seq uint64) uint64 {
	var p uint64
	for _, pr := range s.prunes {
		if pr.Seq < seq {
			p = max(p, pr.Through)
		}
	}
	return p
}

// shown returns r with its values (open).
func (s *stateChecker) shown(r *chain.Receipt) *chain.Receipt {
	if s.open == nil {
		return r
	}
	v, err := s.open(r)
	if err != nil {
		s.err = cmp.Or(s.err, err)
		return r
	}
	return v
}

func newStateChecker(col *collector, audit *auditBuilder, from, ttl uint64) *stateChecker {
	return &stateChecker{col: col, audit: audit, from: from, ttl: ttl, keys: map[string]*keyState{}}
}

func (s *stateChecker) violation(r *chain.Receipt, rule, format string, args ...any) {
	if r.Seq > s.from {
		s.col.addf(r.Seq, rule, format, args...)
	}
}

// addGrouped takes receipts grouped by key: when the key changes, the
// previous key is finished and its state reused for the next.
func (s *stateChecker) addGrouped(r *chain.Receipt, now uint64) {
	k := &s.grouped
	if k.key != r.IdempotencyKey || k.first.Seq == 0 {
		if holdsNoState(r.Kind) {
			s.skipGrouped(r, now)
			return
		}
		s.finishGrouped(now)
		*k = keyState{key: r.IdempotencyKey, first: *r, attempts: k.attempts[:0]}
		s.fresh = false
		s.first(k, r)
	} else {
		s.next(k, r)
	}
	s.fresh = s.fresh || s.from == 0 || r.Seq > s.from
	if k.countsForAttempts(r) {
		k.record(r.ExecutionID, r.Attempt)
	}
}

// skipGrouped takes a receipt that starts no state as a key's first: the
// key held before it is finished, and the next receipt of its key is
// taken as the first.
func (s *stateChecker) skipGrouped(r *chain.Receipt, now uint64) {
	if s.grouped.key == r.IdempotencyKey {
		return
	}
	s.finishGrouped(now)
	s.grouped = keyState{key: r.IdempotencyKey, attempts: s.grouped.attempts[:0]}
	s.fresh = false
}

// finishGrouped finishes the key of grouped mode, if one is held and it
// has a receipt after from.
func (s *stateChecker) finishGrouped(now uint64) {
	if s.grouped.first.Seq != 0 && s.fresh {
		s.finishKey(&s.grouped, now)
	}
}

// flush finishes a key of the map: its final state goes to the audit.
func (s *stateChecker) flush(key string, now uint64) {
	if k, ok := s.keys[key]; ok {
		s.finishKey(k, now)
		delete(s.keys, key)
	}
}

func (s *stateChecker) finishKey(k *keyState, now uint64) {
	s.audit.finishKey(k, now)
	if s.drift != nil {
		s.drift.key(k)
	}
}

// finish flushes every key still held.
func (s *stateChecker) finish(now uint64) {
	for key := range s.keys {
		s.flush(key, now)
	}
	s.finishGrouped(now)
	s.grouped, s.fresh = keyState{}, false
}

// add applies one receipt to its key's state, held in a map.
func (s *stateChecker) add(r *chain.Receipt) {
	k := s.keys[r.IdempotencyKey]
	if k == nil && holdsNoState(r.Kind) || chain.Keyless(r.Kind) {
		return
	}
	if k == nil {
		k = &keyState{key: r.IdempotencyKey, first: *r}
		s.keys[r.IdempotencyKey] = k
		s.first(k, r)
	} else {
		s.next(k, r)
	}
	if k.countsForAttempts(r) {
		k.record(r.ExecutionID, r.Attempt)
	}
}

// next applies a receipt after the key's first, reporting broken rules.
func (s *stateChecker) next(k *keyState, r *chain.Receipt) {
	if r.Kind == chain.KindReserve && s.expired(k, r.RecordedAt) {
		s.renew(k, r)
		return
	}
	if rr := k.reconciledOf(r); rr != nil {
		s.lateCommit(k, r, rr) // checked against its reserve, wherever the key is now
		return
	}
	// The gate's receipts of an expired key belong to its next generation,
	// which its renewing reserve starts.
	gateOfNext := (r.Kind == chain.KindAsk || r.Kind == chain.KindApproval || r.Kind == chain.KindDeny) && s.expired(k, r.RecordedAt)
	if !gateOfNext && (r.Tool != k.first.Tool || r.Effect != k.first.Effect || r.InputHash != k.first.InputHash ||
		r.Idempotent != k.first.Idempotent || r.KeyGenerated != k.first.KeyGenerated) {
		s.violation(r, RuleFingerprintChanged,
			"key %q: tool=%s effect=%s input_hash=%s idempotent=%t key_generated=%t, but its first receipt (seq %d) has tool=%s effect=%s input_hash=%s idempotent=%t key_generated=%t",
			k.key, r.Tool, r.Effect, r.InputHash, r.Idempotent, r.KeyGenerated,
			k.first.Seq, k.first.Tool, k.first.Effect, k.first.InputHash, k.first.Idempotent, k.first.KeyGenerated)
	}
	switch r.Kind {
	case chain.KindReserve:
		s.reserve(k, r)
	case chain.KindCommit, chain.KindResolve:
		s.finalize(k, r)
	case chain.KindReconcile:
		s.reconcile(k, r)
	case chain.KindReplay:
		s.replay(k, r)
	case chain.KindAsk:
		k.gate = gateLink{askSeq: r.Seq, askRef: r.RefSeq}
	case chain.KindApproval:
		if r.RefSeq == k.gate.askSeq && k.gate.approvalSeq == 0 {
			k.gate.approvalSeq = r.Seq
		}
	}
}

// first handles the first receipt of a key: it must be a new reserve.
func (s *stateChecker) first(k *keyState, r *chain.Receipt) {
	k.first.Result, k.first.Note, k.first.ErrorMessage, k.first.ExternalRef = "", "", "", ""
	switch {
	case r.Kind == chain.KindReserve && r.RefSeq == 0:
		k.hasReserve = true
		k.latest = reserveOf(r)
	case r.Kind == chain.KindReserve:
		s.violation(r, RuleRetryNotAllowed, "key %q: first reserve claims to retry seq %d, but the key has no earlier receipt", k.key, r.RefSeq)
		k.hasReserve = true
		k.latest = reserveOf(r)
	case r.Kind == chain.KindReplay:
		s.violation(r, RuleReplayWithoutSuccess, "key %q: replay of seq %d, but the key has no earlier receipt", k.key, r.RefSeq)
	case r.Kind == chain.KindAsk:
		// SPEC §2.1: the first ask fixes the fingerprint; the reserve
		// that consumes its answer starts the key's state.
		k.gate = gateLink{askSeq: r.Seq, askRef: r.RefSeq}
	case r.Kind == chain.KindReconcile:
		s.violation(r, RuleReconcileInvalid, "key %q: reconcile of reserve %d, but the key has no earlier reserve", k.key, r.RefSeq)
		s.setFinal(k, r)
	case r.Kind != chain.KindCommit && r.Kind != chain.KindResolve:
		// an unknown kind changes no state: checkFields reports it
	default:
		s.violation(r, RuleCommitWithoutReserve, "key %q: %s of reserve %d, but the key has no earlier reserve", k.key, r.Kind, r.RefSeq)
		s.setFinal(k, r)
	}
}

// expired reports whether k, as replayed so far, is expired at unix ms t
// (SPEC §12): finalized, with an outcome recorded at least ttl before t.
// This is the verifier's own copy of when a key starts a new generation,
// kept apart on purpose from the write path's (ledger.StartsGeneration):
// a verifier that shared the code it checks would share its bugs.
func (s *stateChecker) expired(k *keyState, t uint64) bool {
	return s.ttl > 0 && k.finalized && t >= k.final.recordedAt && t-k.final.recordedAt >= s.ttl
}

// renew starts a new generation of the expired key k at reserve r: a new
// effect, decided as for a new key, so the fingerprint, the attempts and
// the state start again from r. Its ref_seq must name a receipt of the
// previous generation from its outcome on (the key's latest receipt).
func (s *stateChecker) renew(k *keyState, r *chain.Receipt) {
	prunedWhole := r.RefSeq == 0 && k.final.seq > 0 && k.final.seq <= s.prunedAt(r.Seq)
	if ref := k.gate.ref(r.RefSeq); !prunedWhole && (ref < k.final.seq || ref >= r.Seq) {
		s.violation(r, RuleRetryNotAllowed, "key %q: the reserve renewing it names ref_seq %d, but its previous generation ended at seq %d",
			k.key, ref, k.final.seq)
	}
	s.audit.renewed(k, r, k.final.seq)
	k.first = *r
	k.first.Result, k.first.Note, k.first.ErrorMessage, k.first.ExternalRef = "", "", "", ""
	k.attempts = k.attempts[:0]
	k.hasReserve, k.finalized, k.final = true, false, finalInfo{}
	k.latest = reserveOf(r)
}

func (s *stateChecker) reserve(k *keyState, r *chain.Receipt) {
	st := k.state(r.RecordedAt)
	if !k.gate.reused(r.RefSeq) {
		s.checkReserve(k, r, st, k.gate.ref(r.RefSeq))
	}
	if r.RefSeq != 0 && r.RefSeq == k.gate.approvalSeq {
		k.gate.consumed = true
	}
	if !k.hasReserve && k.first.Kind == chain.KindAsk { // the key's first reserve, after its ask
		k.first = *r
		k.first.Result, k.first.Note, k.first.ErrorMessage, k.first.ExternalRef = "", "", "", ""
	}
	prev, seen := k.attempt(r.ExecutionID)
	if seen && r.Attempt <= prev {
		s.violation(r, RuleAttemptOrder, "key %q: execution %q reserves attempt %d after recording attempt %d", k.key, r.ExecutionID, r.Attempt, prev)
	}
	s.audit.reserve(k, r, st, seen, prev)
	if st == "not_applied" {
		s.audit.notAppliedRerun(k, r)
	}
	k.hasReserve, k.finalized = true, false
	k.latest = reserveOf(r)
}

// endsOwnLease reports whether r, a reserve while the key's reserve holds
// its lease, is that reservation's own execution ending it (SPEC §11,
// ledger.EndLeases): ref_seq names it, and r's lease is the shortest
// there is, so the key is interrupted at once.
func endsOwnLease(k *keyState, r *chain.Receipt, ref uint64) bool {
	return r.ExecutionID == k.latest.execution && ref == k.latest.seq &&
		r.LeaseExpiresAt-r.RecordedAt == ledger.MinLeaseMS
}

// checkReserve applies the rules of §4 and §4.1 to a reserve of a key in
// state st; ref is what it names, past an approval it consumes.
func (s *stateChecker) checkReserve(k *keyState, r *chain.Receipt, st string, ref uint64) {
	switch st {
	case "none": // the key has only an ask: the reserve is its first
		if ref != 0 {
			s.violation(r, RuleRetryNotAllowed, "key %q: first reserve claims to retry seq %d, but the key has no earlier reserve", k.key, ref)
		}
	case "succeeded":
		s.violation(r, RuleReserveAfterSuccess, "key %q succeeded at seq %d; a later reserve must be a replay", k.key, k.final.seq)
	case "reserved":
		if endsOwnLease(k, r, ref) {
			return // SPEC §11: a gateway's start ends its dead process's lease
		}
		s.violation(r, RuleRetryNotAllowed, "key %q: reserve while reserve %d holds the lease until %d (recorded_at %d)", k.key, k.latest.seq, k.latest.lease, r.RecordedAt)
	case "interrupted":
		if !k.first.Idempotent {
			s.violation(r, RuleRetryNotAllowed, "key %q is not idempotent: interrupted reserve %d must be resolved by a person, not taken over", k.key, k.latest.seq)
		} else if ref != k.latest.seq {
			s.violation(r, RuleRetryNotAllowed, "key %q: takeover names ref_seq %d, but the interrupted reserve is %d", k.key, ref, k.latest.seq)
		}
	case "not_applied":
		// SPEC §4.1: decided as a new key of the same generation, by any
		// execution; the reserve names the not_applied outcome.
		if ref != k.final.seq {
			s.violation(r, RuleRetryNotAllowed, "key %q: reserve after not_applied names ref_seq %d, but the not_applied outcome is %d", k.key, ref, k.final.seq)
		}
	case "failed":
		switch {
		case !k.final.retryable:
			s.violation(r, RuleRetryNotAllowed, "key %q: retry after the non-retryable failure %s at seq %d", k.key, k.final.code, k.final.seq)
		case !k.first.Idempotent:
			s.violation(r, RuleRetryNotAllowed, "key %q: retry of a key not declared idempotent (failure at seq %d)", k.key, k.final.seq)
		case ref != k.final.seq:
			s.violation(r, RuleRetryNotAllowed, "key %q: retry names ref_seq %d, but the failure is %d", k.key, ref, k.final.seq)
		}
	}
}

func (s *stateChecker) finalize(k *keyState, r *chain.Receipt) {
	if k.finalized && r.Kind == chain.KindResolve && r.RefSeq == k.final.seq && k.hasReserve {
		s.correction(k, r)
		return
	}
	switch {
	case !k.hasReserve || r.RefSeq != k.latest.seq:
		s.violation(r, RuleCommitWithoutReserve, "key %q: %s names reserve %d, but the key's latest reserve is %d", k.key, r.Kind, r.RefSeq, k.latest.seq)
	case k.finalized:
		s.violation(r, RuleDoubleFinalization, "key %q: reserve %d was already finalized by %s %d", k.key, r.RefSeq, k.final.kind, k.final.seq)
	case r.ExecutionID != k.latest.execution || r.Attempt != k.latest.attempt:
		s.violation(r, RuleCommitWithoutReserve, "key %q: %s carries execution %q attempt %d, but reserve %d is execution %q attempt %d",
			k.key, r.Kind, r.ExecutionID, r.Attempt, k.latest.seq, k.latest.execution, k.latest.attempt)
	case r.Kind == chain.KindResolve && r.RecordedAt < k.latest.lease:
		s.violation(r, RuleDoubleFinalization, "key %q: resolve at %d while reserve %d still held its lease until %d", k.key, r.RecordedAt, k.latest.seq, k.latest.lease)
	}
	s.setFinal(k, r)
	if r.Kind == chain.KindResolve {
		s.audit.resolution(k, s.shown(r))
	}
}

// correction checks a resolve that names the key's final receipt: an
// admin's correction of a failed key to not_applied (SPEC §4.1), exempt
// from double_finalization. Any other outcome, or a correction of a key
// that did not fail, finalizes the reserve twice.
func (s *stateChecker) correction(k *keyState, r *chain.Receipt) {
	switch {
	case r.Outcome != chain.OutcomeNotApplied || k.final.outcome != chain.OutcomeFailed:
		s.violation(r, RuleDoubleFinalization, "key %q: resolve with outcome %s names %s %d (outcome %s); only a failure is corrected, and only to not_applied",
			k.key, r.Outcome, k.final.kind, k.final.seq, k.final.outcome)
	case r.ExecutionID != k.latest.execution || r.Attempt != k.latest.attempt:
		s.violation(r, RuleCommitWithoutReserve, "key %q: correction carries execution %q attempt %d, but reserve %d is execution %q attempt %d",
			k.key, r.ExecutionID, r.Attempt, k.latest.seq, k.latest.execution, k.latest.attempt)
	}
	s.setFinal(k, r)
	s.audit.resolution(k, s.shown(r))
}

func (s *stateChecker) setFinal(k *keyState, r *chain.Receipt) {
	k.finalized = true
	k.final = finalOf(r)
}

func (s *stateChecker) replay(k *keyState, r *chain.Receipt) {
	switch {
	case !k.finalized || !k.final.succeeded:
		s.violation(r, RuleReplayWithoutSuccess, "key %q: replay while the key is %s", k.key, k.state(r.RecordedAt))
	case r.RefSeq != k.final.seq:
		s.violation(r, RuleReplayWithoutSuccess, "key %q: replay names seq %d, but the success is seq %d", k.key, r.RefSeq, k.final.seq)
	} // fields a replay must not carry are the chain pass's (checkFields)
	s.audit.replay(k, r)
}
