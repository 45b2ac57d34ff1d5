package ledger

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/gowebpki/jcs"

	"github.com/effect-ledger/effect-ledger/chain"
)

// The gate of SPEC §13. It runs only where the reserve table of §4 would
// append a reserve (appendReserve), and the reserve it lets through is
// that reserve: a deny, the repeat guard or an approval can only turn an
// append into a refusal or an ask. A namespace whose chain has no policy
// receipt reads nothing more than before (PolicySeq, a field of the head).

// gateDecision is what the gate lets a reserve do.
type gateDecision struct {
	refSeq   uint64       // what the reserve names: the approval it consumes, or the §4 ref
	note     string       // the reserve's note: the request's changed (namespaces with a policy)
	consumed *ApprovalRef // the approval consumed, nil if none
	result   *ReserveResult
}

// keyGate is what a key's receipts say for the gate: the latest ask after
// the key's latest reserve or outcome, its answer, the latest deny there,
// and the reserve that last consumed an approval in the key's generation.
type keyGate struct {
	ask, answer *chain.Receipt
	first       *chain.Receipt   // the first ask after the bound: it fixes a new key's fingerprint (SPEC §2.1)
	denies      []*chain.Receipt // the denies after the bound
	consumer    *chain.Receipt
}

// pending reports whether the ask waits for an answer at now.
func (g *keyGate) pending(now uint64) bool {
	return g.ask != nil && g.answer == nil && now < g.ask.LeaseExpiresAt
}

// rejected reports whether the ask was rejected in time.
func (g *keyGate) rejected() bool {
	return g.answer != nil && g.answer.Outcome == chain.OutcomeRejected &&
		g.answer.RecordedAt < g.ask.LeaseExpiresAt
}

// readKeyGate sorts a key's receipts: bound is the seq of its latest
// reserve or outcome (0 for none), after which asks, answers and denies
// are the current ones; genStart is where its generation starts.
func readKeyGate(hist []chain.Receipt, bound, genStart uint64) keyGate {
	var g keyGate
	approvals := map[uint64]bool{}
	for i := range hist {
		r := &hist[i]
		switch r.Kind {
		case chain.KindApproval:
			approvals[r.Seq] = true
			if g.ask != nil && r.RefSeq == g.ask.Seq && g.answer == nil {
				g.answer = r
			}
		case chain.KindReserve:
			if approvals[r.RefSeq] && r.Seq >= genStart {
				g.consumer = r
			}
		}
		if r.Seq <= bound {
			continue
		}
		switch r.Kind {
		case chain.KindAsk:
			if g.first == nil {
				g.first = r
			}
			g.ask, g.answer = r, nil
		case chain.KindDeny:
			g.denies = append(g.denies, r)
		}
	}
	return g
}

// approvedFor reports whether the key's ask was approved in time and can
// still be consumed at now by its own actor only: no other request may
// take the key's effect meanwhile (SPEC §13: consumed "by the ask's
// actor").
func (g *keyGate) approvedFor(now uint64) bool {
	return g.answer != nil && g.answer.Outcome == chain.OutcomeApproved &&
		g.answer.RecordedAt < g.ask.LeaseExpiresAt && now < g.ask.LeaseExpiresAt
}

// waitingAsk returns the latest ask of hist (a key's receipts in seq
// order) that a reserve may still consume at now: unanswered, or approved
// and not consumed, and not expired; nil if none.
func waitingAsk(hist []chain.Receipt, now uint64) *chain.Receipt {
	kg := readKeyGate(hist, gateBound(hist), 0)
	if kg.pending(now) || kg.approvedFor(now) {
		return kg.ask
	}
	return nil
}

// gateBound is the seq of the latest reserve or outcome of hist, after
// which a key's asks are current (0 for none).
func gateBound(hist []chain.Receipt) uint64 {
	var bound uint64
	for _, r := range hist {
		if r.Kind == chain.KindReserve || r.Kind == chain.KindCommit || r.Kind == chain.KindResolve || r.Kind == chain.KindReconcile {
			bound = r.Seq
		}
	}
	return bound
}

// sameFingerprint reports whether receipt r (an ask or deny) was made for
// the request's tool, effect and input.
func sameFingerprint(r *chain.Receipt, a *reserveArgs) bool {
	return r.Tool == a.tool && r.Effect == a.effect && (a.inputHash == "" || a.inputHash == r.InputHash)
}

// gate decides a reserve that §4 would append for k (found: k is the
// key's record) naming refSeq. since is where the key's generation
// starts (its receipts from there are read) and bound its latest reserve
// or outcome.
func (s *batchTx) gate(ctx context.Context, now uint64, a *reserveArgs, k *KeyRecord, refSeq uint64, why reserveKind) (gateDecision, error) {
	d := gateDecision{refSeq: refSeq}
	p, pseq, err := s.policy(ctx)
	if err != nil || pseq == 0 {
		return d, err
	}
	d.note = a.changed.note()
	if s.n != nil && s.n.purgeDue(now) {
		// Asked inputs past their retention go even in a namespace that
		// asks nothing more: any write of it deletes them, once a minute.
		if err := s.PurgeAskInputs(ctx, now); err != nil {
			return d, err
		}
	}
	g := p.GateFor(a.tool, a.effect)
	if a.generated && g.Gates() {
		return d, &Error{Code: ECodeKeyRequired,
			Message: "the policy gates this tool: the request must bring its own idempotency key (a generated key could never be presented again)",
			Details: map[string]any{"tool": a.tool}}
	}
	kg, err := s.keyGate(ctx, a, k, refSeq, why, g.Gates())
	if err != nil {
		return d, err
	}
	if (why == reserveNew || why == reserveRenewal) && kg.first != nil {
		// An ask made before a switch holds the plain fingerprint.
		if err := s.inputHashLike(ctx, a, kg.first.InputHash); err != nil {
			return d, err
		}
	}
	if kg.rejected() { // the refusal quotes the answer's note
		shown := *kg.answer
		if err := s.shown(ctx, &shown); err != nil {
			return d, err
		}
		kg.answer = &shown
	}
	if err := checkAsked(&kg, a, now); err != nil {
		return d, err
	}
	if (why == reserveNew || why == reserveRenewal) && kg.first != nil {
		// The first ask fixed the new key's (or generation's) fingerprint
		// and idempotent; its reserve carries them (SPEC §2.1).
		a.idempotent = kg.first.Idempotent
		if a.inputHash == "" {
			a.inputHash = kg.first.InputHash
		}
		k.Idempotent, k.InputHash = a.idempotent, a.inputHash
	}
	// A runtime retry of the execution that consumed the generation's
	// approval, by the same principal, is covered by it.
	covered := kg.consumer != nil && kg.consumer.ExecutionID == a.execution && kg.consumer.Actor == a.actor &&
		(why == reserveTakeover || why == reserveRetry || why == reserveAfterNotApplied || why == reserveEndLease)
	if why == reserveEndLease {
		// Ending a dead lease passes only where the policy in force lets
		// the execution reserve again without a person (the verifier's
		// view too); else the key is left to its lease.
		if g.Deny || g.Approval && !covered {
			return d, errEndLeaseGated
		}
		return d, nil
	}
	if g.Deny {
		return d, s.deny(ctx, now, a, k, &kg, pseq, refSeq, &g, p)
	}
	if g.RepeatRefuse && a.inputHash != "" {
		if err := s.repeatGuard(ctx, now, a, g.RepeatWindow); err != nil {
			return d, err
		}
	}
	if !g.Approval {
		return d, nil
	}
	switch {
	case covered:
		return d, nil
	case usable(&kg, a, now, &g):
		d.refSeq = kg.answer.Seq
		d.consumed = &ApprovalRef{Seq: kg.answer.Seq, AskSeq: kg.ask.Seq}
		return d, nil
	case kg.pending(now), kg.approvedFor(now):
		// One ask at a time: a pending one, or one approved for its own
		// actor, answers every other request of the key until it is
		// consumed or expires.
		d.result = askResult(a, kg.ask)
		return d, nil
	}
	d.result, err = s.ask(ctx, now, a, k, refSeq, &g)
	return d, err
}

// keyGate reads what the key's receipts say for the gate: all of them (a
// key has few, and the gate only runs where a reserve would be appended,
// never on a replay), or for a renewal those after the expired
// generation. When no rule gates the request and the key surely has no
// ask or deny, there is nothing to read.
func (s *batchTx) keyGate(ctx context.Context, a *reserveArgs, k *KeyRecord, refSeq uint64, why reserveKind, gates bool) (keyGate, error) {
	if !gates {
		may, err := s.MayHaveGateReceipts(ctx, a.key)
		if err != nil || !may {
			return keyGate{}, err
		}
	}
	since, bound, genStart := uint64(1), uint64(0), uint64(0)
	switch why {
	case reserveNew:
	case reserveRenewal:
		since, bound, genStart = refSeq+1, refSeq, refSeq+1
	default:
		bound, genStart = max(k.ReserveSeq, k.FinalSeq), k.FirstSeq
	}
	hist, err := s.KeyHistory(ctx, a.key, since)
	if err != nil {
		return keyGate{}, err
	}
	return readKeyGate(hist, bound, genStart), nil
}

// checkAsked refuses a request that a pending or rejected ask of the key
// rules out: another fingerprint (422), or the rejected one (409).
func checkAsked(kg *keyGate, a *reserveArgs, now uint64) error {
	if kg.first != nil && !sameFingerprint(kg.first, a) {
		return &Error{Code: ECodeFingerprintMismatch,
			Message: "idempotency key was first used with another tool, effect or input",
			Details: map[string]any{"tool": kg.first.Tool, "effect": kg.first.Effect, "input_hash": kg.first.InputHash}}
	}
	if kg.ask == nil {
		return nil
	}
	if kg.rejected() {
		return &Error{Code: ECodeApprovalRejected,
			Message: "a person rejected this effect; the key stays rejected",
			Details: map[string]any{"approval": quoted(map[string]any{"seq": kg.answer.Seq, "ask_seq": kg.ask.Seq,
				"note": kg.answer.Value(chain.FieldNote), "actor": kg.answer.Actor}, kg.answer)}}
	}
	return nil
}

// usable reports whether the key's ask was approved in time, for this
// request's fingerprint and actor, by an approver the policy still lists,
// and can be consumed at now.
func usable(kg *keyGate, a *reserveArgs, now uint64, g *Gate) bool {
	if kg.answer == nil || kg.answer.Outcome != chain.OutcomeApproved ||
		kg.answer.RecordedAt >= kg.ask.LeaseExpiresAt || now >= kg.ask.LeaseExpiresAt {
		return false
	}
	if !sameFingerprint(kg.ask, a) || kg.ask.Actor != a.actor {
		return false
	}
	return kg.answer.Actor == "" || g.Lists(kg.answer.Actor, answerRole(kg.answer))
}

// answerRole is the approver's role an approval records in its result.
func answerRole(r *chain.Receipt) string {
	var v struct {
		Role string `json:"role"`
	}
	_ = json.Unmarshal([]byte(r.Result), &v) // a result that is not ours: no role
	return v.Role
}

// askResult is the 202 answer naming a pending ask.
func askResult(a *reserveArgs, ask *chain.Receipt) *ReserveResult {
	return &ReserveResult{Status: StatusApprovalRequired, IdempotencyKey: a.key,
		Ask: &AskRef{Seq: ask.Seq, ExpiresAt: ask.LeaseExpiresAt}, Receipt: refOf(ask)}
}

// ask appends an ask for the request and keeps its input off the chain.
func (s *batchTx) ask(ctx context.Context, now uint64, a *reserveArgs, k *KeyRecord, refSeq uint64, g *Gate) (*ReserveResult, error) {
	if a.input == "" {
		return nil, Invalid("input", "this tool needs a person's approval, who is shown the call's input: the reserve must carry input (JSON of at most %d bytes; this one has none, or more)", MaxAskInput)
	}
	res, err := json.Marshal(map[string]string{"input_hash": a.inputHash, "summary": a.summary})
	if err != nil {
		return nil, fmt.Errorf("ask result: %w", err)
	}
	canon, err := jcs.Transform(res)
	if err != nil {
		return nil, fmt.Errorf("ask result: %w", err)
	}
	expires := now + g.ExpiresInMS
	r, err := s.append(ctx, chain.Receipt{
		Kind: chain.KindAsk, IdempotencyKey: a.key, ExecutionID: a.execution, Attempt: a.attempt,
		Tool: k.Tool, Effect: k.Effect, Idempotent: k.Idempotent, InputHash: k.InputHash,
		LeaseExpiresAt: expires, Result: string(canon), RefSeq: refSeq, Actor: a.actor, RecordedAt: now,
	})
	if err != nil {
		return nil, err
	}
	if err := s.PutAskInput(ctx, r.Seq, a.input, expires+s.retentionMS(), now); err != nil {
		return nil, err
	}
	if len(a.subjects) > 0 { // the ask, its answer and input go with the subject (SPEC §14)
		if err := s.PutSubjects(ctx, a.key, r.Seq, a.subjects); err != nil {
			return nil, err
		}
	}
	s.event("ask")
	return askResult(a, &r), nil
}

// deny refuses a reserve the policy denies, appending a deny receipt
// unless the key already has one for this fingerprint under this policy.
func (s *batchTx) deny(ctx context.Context, now uint64, a *reserveArgs, k *KeyRecord, kg *keyGate, pseq, refSeq uint64, g *Gate, p *Policy) error {
	var r *chain.Receipt
	for _, d := range kg.denies {
		if d.Seq > pseq && d.Tool == k.Tool && d.Effect == k.Effect && d.InputHash == k.InputHash {
			r = d // one deny per key, fingerprint and policy in force
		}
	}
	if r == nil {
		nr, err := s.append(ctx, chain.Receipt{
			Kind: chain.KindDeny, IdempotencyKey: a.key, ExecutionID: a.execution, Attempt: a.attempt,
			Tool: k.Tool, Effect: k.Effect, Idempotent: k.Idempotent, InputHash: k.InputHash,
			RefSeq: refSeq, Actor: a.actor, RecordedAt: now,
		})
		if err != nil {
			return err
		}
		r = &nr
	}
	s.event("deny")
	return &Error{Code: ECodeDeniedByPolicy, Message: "the namespace's policy denies this tool; nothing ran",
		Details: map[string]any{"rule": g.DenyRule, "tool": p.Rules[g.DenyRule].Tool,
			"receipt": map[string]any{"seq": r.Seq, "hash": r.Hash.String()}}}
}

// repeatGuard refuses a reserve of a (tool, input) whose latest outcome
// on some key within window failed, unless this execution made that
// attempt or the request's changed differs from the attempt's (SPEC §13);
// the most recent such failure is named.
func (s *batchTx) repeatGuard(ctx context.Context, now uint64, a *reserveArgs, window uint64) error {
	last := map[string]*chain.Receipt{}
	var order []string
	collect := func(r *chain.Receipt) bool {
		prev, ok := last[r.IdempotencyKey]
		if !ok {
			order = append(order, r.IdempotencyKey)
		}
		if !ok || r.Seq > prev.Seq {
			c := *r
			last[r.IdempotencyKey] = &c
		}
		return true
	}
	// After a switch (SPEC §14) the same input is recorded plain by the
	// keys reserved before it and keyed by later ones: both count.
	other, err := s.otherInputHash(ctx, a)
	if err != nil {
		return err
	}
	for _, h := range []string{a.inputHash, other} {
		if h == "" {
			continue
		}
		if err := s.RecentOutcomes(ctx, a.tool, h, now-min(now, window), collect); err != nil {
			return err
		}
	}
	// Every failure in the window must let the reserve through: made by
	// this execution, or differing from what the request changed.
	var failed *chain.Receipt
	for _, key := range order {
		r := last[key]
		if r.Kind == chain.KindReconcile || !CountsAsFailure(r.Outcome, r.ErrorCode) { // SPEC §15: exempt
			continue
		}
		reserve, err := s.attemptOf(ctx, r)
		if err != nil {
			return err
		}
		if r.ExecutionID == a.execution && reserve.Actor == a.actor {
			continue // that execution's own runtime retries, decided by §4
		}
		if !a.changed.differsFrom(reserve.Note) && (failed == nil || r.Seq > failed.Seq) {
			failed = r
		}
	}
	if failed == nil {
		return nil
	}
	s.event("unchanged_retry")
	shown := *failed // the refusal quotes its error message
	if err := s.shown(ctx, &shown); err != nil {
		return err
	}
	return &Error{Code: ECodeUnchangedRetry,
		Message: "the same call failed recently and nothing in it changed; a retry must change something (changed: context_hash, component or strategy)",
		Details: map[string]any{"failed": quoted(map[string]any{"idempotency_key": failed.IdempotencyKey, "seq": failed.Seq,
			"error_code": failed.ErrorCode, "error_message": shown.Value(chain.FieldErrorMessage)}, &shown)}}
}

// attemptOf returns the reserve of the attempt an outcome ended (a
// correction names the outcome it corrects, which names the reserve).
func (s *batchTx) attemptOf(ctx context.Context, outcome *chain.Receipt) (chain.Receipt, error) {
	r := *outcome
	for range 3 {
		if r.Kind == chain.KindReserve || r.RefSeq == 0 {
			break
		}
		next, err := s.Receipt(ctx, r.RefSeq)
		if err != nil {
			return r, err
		}
		r = next
	}
	return r, nil
}

// policy returns the policy in force and its seq (nil, 0 without one).
func (s *batchTx) policy(ctx context.Context) (*Policy, uint64, error) {
	seq, err := s.PolicySeq(ctx)
	if err != nil || seq == 0 {
		return nil, 0, err
	}
	if s.n == nil {
		return nil, 0, fmt.Errorf("policy: no namespace")
	}
	if p, ok := s.policies[seq]; ok {
		return p, seq, nil
	}
	p, err := s.n.policyAt(ctx, seq, s.Receipt)
	if err != nil {
		return nil, 0, err
	}
	if s.policies == nil {
		s.policies = map[uint64]*Policy{}
	}
	s.policies[seq] = p // cached for the namespace once the batch commits
	return p, seq, nil
}

// retentionMS is how long asked inputs are kept after the answer or the
// expiry.
func (s *batchTx) retentionMS() uint64 {
	if s.n == nil {
		return uint64(DefaultApprovalInputRetention.Milliseconds())
	}
	return uint64(s.n.l.cfg.ApprovalInputRetention.Milliseconds())
}
