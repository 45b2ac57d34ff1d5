package verify

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/effect-ledger/effect-ledger/chain"
)

// gateChecker checks the rules of the gate (SPEC §13) on the receipts in
// seq order: the chain pass of every strategy feeds it, so that each
// strategy reports them alike. It holds the policy in force, the asks and
// their answers, the execution that consumed each key's last approval,
// and the keys whose last outcome is a failure the repeat guard counts:
// memory grows with asks and failed calls, not with the ledger.
type gateChecker struct {
	col  *collector
	from uint64 // violations and audit entries only after from
	ttl  uint64 // key_ttl_ms: a consumed approval ends with its generation
	win  window

	policy  *gatePolicy // in force; nil: none, or one that did not parse
	unknown bool        // the policy in force did not parse: nothing is checked against it
	horizon uint64      // the longest repeat window of any policy seen

	asks      map[uint64]*askEntry
	approvals map[uint64]*approvalEntry
	consumers map[string]*consumer
	notes     map[string]reserveNote
	failures  map[[2]string]map[string]failEntry
	failGroup map[string][2]string
	swept     uint64 // receipts since failures were last swept

	denied []DeniedEffect
	unauth []UnauthenticatedApproval

	// policies, on a run that reads the chain from seq 1 (segjoin.go),
	// lists every policy receipt met, for checkPrunePolicy, which reports
	// to policyCol; nil otherwise.
	policies  *[]chain.PrunePolicy
	policyCol *collector
}

// askEntry is an ask and what became of it.
type askEntry struct {
	r          chain.Receipt // Result, Note and Open dropped
	answer     *approvalEntry
	consumedBy *chain.Receipt // the reserve that consumed its answer first
}

// approvalEntry is an approval receipt.
type approvalEntry struct {
	r          chain.Receipt // Result, Note and Open dropped
	role       string
	consumedBy uint64
	// note is what the audit shows of the approver's note (SPEC §14):
	// its value, or "" and the erase receipt that erased it.
	note       string
	noteErased uint64
}

// consumer is the execution that consumed a key's last approval, for the
// key's generation (SPEC §12, §13): its runtime retries need no new one.
type consumer struct {
	execution string
	actor     string // who consumed: only its runtime retries are covered
	finalized bool   // the key's latest reserve has an outcome
	finalAt   uint64 // its recorded_at
}

// reserveNote is a reserve's changed object (its note), kept until the
// reserve's outcome.
type reserveNote struct {
	seq   uint64
	note  string
	actor string
}

// failEntry is a key whose last outcome is one the repeat guard counts.
type failEntry struct {
	seq, at   uint64
	execution string // the execution that made the failed attempt
	actor     string // and who reserved it
	note      string // that attempt's changed object
	code      string
}

// failureSweep is how many receipts pass between sweeps of the failures
// older than every repeat window.
const failureSweep = 1 << 16

func newGateChecker(col *collector, from, ttl uint64, f AuditFilter) *gateChecker {
	return &gateChecker{col: col, from: from, ttl: ttl, win: f.window(), horizon: defaultRepeatWindowMS,
		asks: map[uint64]*askEntry{}, approvals: map[uint64]*approvalEntry{}, consumers: map[string]*consumer{},
		notes: map[string]reserveNote{}, failures: map[[2]string]map[string]failEntry{}, failGroup: map[string][2]string{}}
}

func (g *gateChecker) violation(r *chain.Receipt, rule, format string, args ...any) {
	if r.Seq > g.from {
		g.col.addf(r.Seq, rule, format, args...)
	}
}

// add takes the next receipt in seq order. Malformed receipts are
// invalid_field's and change nothing here.
func (g *gateChecker) add(r *chain.Receipt) {
	if len(r.Malformed) > 0 {
		return
	}
	switch r.Kind {
	case chain.KindPolicy:
		g.setPolicy(r)
	case chain.KindAsk:
		e := &askEntry{r: *r}
		e.r.Result, e.r.Note, e.r.Open = "", "", nil
		g.asks[r.Seq] = e
	case chain.KindApproval:
		g.approval(r)
	case chain.KindDeny:
		g.deny(r)
	case chain.KindReserve:
		g.reserve(r)
	case chain.KindCommit, chain.KindResolve:
		g.outcome(r)
	case chain.KindReconcile:
		g.reconcile(r)
		g.outcome(r)
	}
	if g.swept++; g.swept == failureSweep {
		g.sweep(r.RecordedAt)
	}
}

// setPolicy puts a policy receipt in force (rule policy_unknown when its
// text does not parse).
func (g *gateChecker) setPolicy(r *chain.Receipt) {
	if g.policies != nil {
		*g.policies = append(*g.policies, chain.PrunePolicy{Seq: r.Seq, Text: r.Result})
	}
	p, err := parsePolicy(r.Result)
	if errors.Is(err, errUnknownMember) {
		g.violation(r, RuleUnsupported, "the policy has a member this verifier does not know (%v): a newer ledger wrote it, or it was altered; the reserves under it cannot be checked (a newer ledgerctl may)", err)
		g.policy, g.unknown = nil, true
		return
	}
	if err != nil {
		g.violation(r, RulePolicyUnknown, "the policy's text does not parse (%v): the reserves under it cannot be checked", err)
		g.policy, g.unknown = nil, true
		return
	}
	g.policy, g.unknown = p, false
	g.horizon = max(g.horizon, p.maxWindow())
}

// rule is what the policy in force decides for r.
func (g *gateChecker) rule(r *chain.Receipt) gateRule {
	if g.unknown {
		return gateRule{}
	}
	return g.policy.match(r.Tool, r.Effect)
}

// approval records an answer, and checks self-approval against the
// policy in force when it was given.
func (g *gateChecker) approval(r *chain.Receipt) {
	e := &approvalEntry{r: *r, role: approverRole(r.Result)}
	e.note, e.noteErased, _ = payloadValue(r, chain.FieldNote)
	e.r.Result, e.r.Note, e.r.Open = "", "", nil
	g.approvals[r.Seq] = e
	ask := g.asks[r.RefSeq]
	if ask != nil && ask.answer == nil {
		ask.answer = e
	}
	if r.Actor == "" && r.Seq > g.from && g.win.has(r.Tool, r.Seq, r.RecordedAt) {
		g.unauth = append(g.unauth, UnauthenticatedApproval{Seq: r.Seq, AskSeq: r.RefSeq, Key: r.IdempotencyKey,
			Tool: r.Tool, Outcome: r.Outcome, RecordedAt: r.RecordedAt})
	}
	if ask == nil || ask.r.Actor == "" || g.unknown || g.policy != nil && g.policy.allowSelfApproval {
		return
	}
	if r.Actor == ask.r.Actor || strings.HasPrefix(r.Actor, ask.r.Actor+"/mcp-client:") {
		g.violation(r, RuleSelfApproved, "key %q: %s answers ask %d of its own actor %q, and the policy in force denies self-approval",
			r.IdempotencyKey, r.Actor, ask.r.Seq, ask.r.Actor)
	}
}

// approverRole reads the role of an approval's result; empty if none.
func approverRole(result string) string {
	var v struct {
		Role string `json:"role"`
	}
	_ = json.Unmarshal([]byte(result), &v)
	return v.Role
}

// reconcile checks a reconcile against the policy in force (SPEC §15):
// a rule matching its tool must allow it.
func (g *gateChecker) reconcile(r *chain.Receipt) {
	if !g.unknown && !g.policy.match(r.Tool, r.Effect).reconcile {
		g.violation(r, RuleReconcileNotAllowed, "key %q: reconcile of %s, which no rule of the policy in force allows",
			r.IdempotencyKey, r.Tool)
	}
}

func (g *gateChecker) deny(r *chain.Receipt) {
	if r.Seq > g.from && g.win.has(r.Tool, r.Seq, r.RecordedAt) {
		g.denied = append(g.denied, DeniedEffect{Seq: r.Seq, Key: r.IdempotencyKey, Tool: r.Tool,
			ExecutionID: r.ExecutionID, Actor: r.Actor, RecordedAt: r.RecordedAt})
	}
}

// reserve checks a reserve against the policy in force: deny, approval
// and the repeat guard.
func (g *gateChecker) reserve(r *chain.Receipt) {
	g.renewal(r)
	if r.Note != "" {
		g.notes[r.IdempotencyKey] = reserveNote{seq: r.Seq, note: r.Note, actor: r.Actor}
	} else {
		delete(g.notes, r.IdempotencyKey)
	}
	rule := g.rule(r)
	var ap *approvalEntry
	if r.RefSeq != 0 {
		ap = g.approvals[r.RefSeq]
	}
	if ap != nil {
		g.consume(r, ap, rule)
	}
	if rule.deny {
		g.violation(r, RuleDeniedEffectRun, "key %q: reserve of %s, which the policy in force denies", r.IdempotencyKey, r.Tool)
	}
	if rule.approval && ap == nil && !g.covered(r) {
		g.violation(r, RuleApprovalMissing, "key %q: reserve of %s by execution %q names no approval (ref_seq %d), and no approval of the key's generation was consumed by that execution",
			r.IdempotencyKey, r.Tool, r.ExecutionID, r.RefSeq)
	}
	if rule.repeatRefuse {
		g.checkRepeat(r, rule)
	}
}

// renewal forgets the consumer of a key whose reserve r starts a new
// generation (SPEC §12): the new effect needs an approval of its own.
func (g *gateChecker) renewal(r *chain.Receipt) {
	c := g.consumers[r.IdempotencyKey]
	if c == nil {
		return
	}
	if c.finalized && g.ttl > 0 && r.RecordedAt >= c.finalAt && r.RecordedAt-c.finalAt >= g.ttl {
		delete(g.consumers, r.IdempotencyKey)
		return
	}
	c.finalized = false
}

// covered reports whether r is by the execution that consumed the last
// approval of its key's generation.
func (g *gateChecker) covered(r *chain.Receipt) bool {
	c := g.consumers[r.IdempotencyKey]
	return c != nil && c.execution == r.ExecutionID && c.actor == r.Actor
}

// consume checks the reserve r that names approval ap.
func (g *gateChecker) consume(r *chain.Receipt, ap *approvalEntry, rule gateRule) {
	if ap.consumedBy != 0 {
		g.violation(r, RuleApprovalReused, "key %q: reserve names approval %d, which reserve %d consumed already",
			r.IdempotencyKey, ap.r.Seq, ap.consumedBy)
		g.consumers[r.IdempotencyKey] = &consumer{execution: r.ExecutionID, actor: r.Actor}
		return
	}
	ap.consumedBy = r.Seq
	ask := g.asks[ap.r.RefSeq]
	if ask != nil && ask.consumedBy == nil {
		c := *r
		c.Result, c.Note, c.Open = "", "", nil
		ask.consumedBy = &c
	}
	if why := mismatch(r, ap, ask, rule); why != "" {
		g.violation(r, RuleApprovalMismatch, "key %q: reserve names approval %d, but %s", r.IdempotencyKey, ap.r.Seq, why)
	}
	// The execution's runtime retries are covered even by an approval
	// that did not match: the consumption is reported once, here.
	g.consumers[r.IdempotencyKey] = &consumer{execution: r.ExecutionID, actor: r.Actor}
}

// mismatch tells why approval ap (answering ask) cannot authorize the
// reserve r under rule; empty if it can.
func mismatch(r *chain.Receipt, ap *approvalEntry, ask *askEntry, rule gateRule) string {
	switch {
	case ap.r.Outcome != chain.OutcomeApproved:
		return "its outcome is " + quote(ap.r.Outcome)
	case ask == nil:
		return "its ref_seq names no ask"
	case ap.r.RecordedAt >= ask.r.LeaseExpiresAt:
		return "it was recorded at or after its ask's expiry " + msTime(ask.r.LeaseExpiresAt)
	case r.RecordedAt >= ask.r.LeaseExpiresAt:
		return "the reserve comes at or after the ask's expiry " + msTime(ask.r.LeaseExpiresAt)
	case ask.r.IdempotencyKey != r.IdempotencyKey:
		return "its ask is of key " + quote(ask.r.IdempotencyKey)
	case ask.r.Tool != r.Tool || ask.r.Effect != r.Effect || ask.r.InputHash != r.InputHash || ask.r.Idempotent != r.Idempotent:
		return "its ask has another fingerprint (tool " + quote(ask.r.Tool) + ", effect " + quote(ask.r.Effect) +
			", input_hash " + quote(ask.r.InputHash) + ")"
	case ask.r.Actor != r.Actor:
		return "its ask is by actor " + quote(ask.r.Actor) + ", the reserve by " + quote(r.Actor)
	case rule.approval && !rule.lists(ap.r.Actor, ap.role):
		return "the rule in force does not list its approver " + quote(ap.r.Actor) + " (role " + quote(ap.role) + ")"
	}
	return ""
}

func quote(s string) string { return `"` + truncate(s) + `"` }

// checkRepeat reports r when the repeat guard in force refuses it: a key
// with r's tool and input_hash (r's own included) whose last outcome,
// within the window, counts as a failure, made by another execution,
// and r's changed object has no value that differs from that attempt's.
func (g *gateChecker) checkRepeat(r *chain.Receipt, rule gateRule) {
	if r.InputHash == "" {
		return
	}
	var hit *failEntry
	var hitKey string
	for key, f := range g.failures[[2]string{r.Tool, r.InputHash}] {
		if f.at > r.RecordedAt || r.RecordedAt-f.at >= rule.repeatWindow || f.execution == r.ExecutionID && f.actor == r.Actor ||
			changedDiffers(r.Note, f.note) {
			continue
		}
		if hit == nil || f.seq < hit.seq {
			hit, hitKey = &f, key
		}
	}
	if hit != nil {
		g.violation(r, RuleUnchangedRetry, "key %q: reserve of %s repeats the call whose last outcome under key %q failed at seq %d (%s), by another execution and with nothing changed",
			r.IdempotencyKey, r.Tool, hitKey, hit.seq, hit.code)
	}
}

// changedDiffers reports whether the changed object of a reserve (its
// note) has a value that differs from the failed attempt's.
func changedDiffers(note, failed string) bool {
	now, before := parseChanged(note), parseChanged(failed)
	for k, v := range now {
		if before[k] != v {
			return true
		}
	}
	return false
}

// parseChanged reads a changed object; empty or unreadable: none.
func parseChanged(note string) map[string]string {
	var m map[string]string
	if note != "" {
		_ = json.Unmarshal([]byte(note), &m)
	}
	return m
}

// outcome records a commit or resolve: the key's last outcome, for the
// repeat guard, and the end of its generation's latest reserve.
func (g *gateChecker) outcome(r *chain.Receipt) {
	key := r.IdempotencyKey
	if c := g.consumers[key]; c != nil {
		c.finalized, c.finalAt = true, r.RecordedAt
	}
	note, exec, actor := "", r.ExecutionID, r.Actor
	if n, ok := g.notes[key]; ok && n.seq == r.RefSeq {
		note, actor = n.note, n.actor
		delete(g.notes, key)
	} else if id, ok := g.failGroup[key]; ok { // a correction keeps the attempt it corrects
		f := g.failures[id][key]
		note, exec, actor = f.note, f.execution, f.actor
	}
	g.dropFailure(key)
	if r.InputHash == "" || !isFailure(r) {
		return
	}
	id := [2]string{r.Tool, r.InputHash}
	if g.failures[id] == nil {
		g.failures[id] = map[string]failEntry{}
	}
	g.failures[id][key] = failEntry{seq: r.Seq, at: r.RecordedAt, execution: exec, actor: actor, note: note, code: r.ErrorCode}
	g.failGroup[key] = id
}

func (g *gateChecker) dropFailure(key string) {
	id, ok := g.failGroup[key]
	if !ok {
		return
	}
	delete(g.failGroup, key)
	delete(g.failures[id], key)
	if len(g.failures[id]) == 0 {
		delete(g.failures, id)
	}
}

// sweep forgets the failures older than every repeat window seen.
func (g *gateChecker) sweep(now uint64) {
	g.swept = 0
	for id, group := range g.failures {
		for key, f := range group {
			if f.at <= now && now-f.at >= g.horizon {
				delete(group, key)
				delete(g.failGroup, key)
			}
		}
		if len(group) == 0 {
			delete(g.failures, id)
		}
	}
}
