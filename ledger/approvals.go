package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Approvals (SPEC §13): the policy is set by an admin and recorded as a
// policy receipt; an ask is answered by an approver with an approval
// receipt; the reserve that consumes it is decided by the gate (gate.go).

// approvalEvents counts the gate's decisions and the answers.
var approvalEvents = promauto.NewCounterVec(prometheus.CounterOpts{
	Name: "ledger_approvals_total",
	Help: "Approval events: ask, approve, reject, consume, deny, unchanged_retry.",
}, []string{"decision"})

// Approval states (GET approvals?state=).
const (
	ApprovalPending  = "pending"
	ApprovalApproved = "approved"
	ApprovalRejected = "rejected"
	ApprovalExpired  = "expired"
	ApprovalConsumed = "consumed"
)

// Decisions of an answer.
const (
	DecisionApprove = "approve"
	DecisionReject  = "reject"
)

// PolicyResult is the outcome of SetPolicy.
type PolicyResult struct {
	Policy  json.RawMessage // canonical text
	Seq     uint64          // the policy receipt in force
	Changed bool
	Receipt *ReceiptRef // the policy receipt appended, nil when unchanged
	// Warnings say what the policy cannot do in this namespace.
	Warnings []string
}

// ApprovalView is one ask with its answer and its consumer.
type ApprovalView struct {
	Ask        chain.Receipt
	Summary    string
	State      string
	Answer     *chain.Receipt // nil while unanswered
	AnswerRole string
	Consumer   *chain.Receipt // the reserve that consumed the approval
	// Input is the asked input when requested and still kept ("" else).
	Input string
	// InputVerified tells, with Input, whether its fingerprint is the
	// ask's input_hash.
	InputVerified *bool
}

// AnswerRequest is an approver's decision about an ask.
type AnswerRequest struct {
	Seq      uint64
	Decision string
	Note     string
	Actor    string // the approver's token name, "" without auth
	Role     string // the approver's role, "" without auth
	// Authenticated is false on a ledger without tokens: then no rule's
	// approvers and no self-approval can be decided (SPEC §13).
	Authenticated bool
	// MCPClient, when set, is the name of the agent's MCP client that
	// answered through ledger-mcp (SPEC §13, MCP path): a self-approval,
	// accepted only from the token that asked, when the rule lists
	// mcp-client and the policy allows self-approval. It is recorded with
	// actor "<asker>/mcp-client:<name>" and role mcp-client.
	MCPClient string
}

// policyAt returns the policy recorded at seq: from the cache of the
// committed ones, else read with read and parsed (the caller caches it
// once it knows it committed).
func (n *Namespace) policyAt(ctx context.Context, seq uint64, read func(context.Context, uint64) (chain.Receipt, error)) (*Policy, error) {
	if p, ok := n.policies.Load(seq); ok {
		return p.(*Policy), nil
	}
	r, err := read(ctx, seq)
	if err != nil {
		return nil, err
	}
	if r.Kind != chain.KindPolicy {
		return nil, fmt.Errorf("policy: receipt %d is a %s", seq, r.Kind)
	}
	p, err := ParsePolicy([]byte(r.Result))
	if err != nil {
		return nil, fmt.Errorf("policy receipt %d does not parse: %w", seq, err)
	}
	return p, nil
}

// policyCommitted caches the committed policy p at seq, the latest the
// namespace has seen.
func (n *Namespace) policyCommitted(seq uint64, p *Policy) {
	n.policies.Store(seq, p)
	for last := n.lastPolicy.Load(); seq > last && !n.lastPolicy.CompareAndSwap(last, seq); last = n.lastPolicy.Load() {
	}
}

// Policy returns the namespace's policy in force and its receipt's seq
// (an empty policy and 0 without one).
func (n *Namespace) Policy(ctx context.Context) (*Policy, uint64, error) {
	seq, err := n.latestPolicySeq(ctx)
	if err != nil {
		return &Policy{}, 0, err
	}
	if seq == 0 {
		return n.policyOfPruned(ctx) // the latest policy receipt may be pruned (SPEC §16)
	}
	p, err := n.policyAt(ctx, seq, func(ctx context.Context, seq uint64) (chain.Receipt, error) {
		r, err := n.chain.GetReceipt(ctx, seq)
		if err != nil {
			return chain.Receipt{}, err
		}
		return *r, nil
	})
	if err == nil {
		n.policyCommitted(seq, p)
	}
	return p, seq, err
}

// latestPolicySeq reads the seq of the latest policy receipt from the
// chain (policies change rarely: a few pages at most).
func (n *Namespace) latestPolicySeq(ctx context.Context) (uint64, error) {
	f := ReceiptFilter{Kind: chain.KindPolicy, Limit: MaxPageLimit}
	var last uint64
	for {
		rs, next, err := n.chain.ListReceipts(ctx, f)
		if err != nil {
			return 0, err
		}
		if len(rs) > 0 {
			last = rs[len(rs)-1].Seq
		}
		if next == nil {
			return last, nil
		}
		f.After = *next
	}
}

// gatesNoEffect reports whether the policy last seen gates a none or read
// call of tool, which SPEC §13 refuses as effect_class_mismatch. Such
// calls append nothing, so they read the policy the namespace's last
// batch saw (the chain's, read once when none did yet).
func (n *Namespace) gatesNoEffect(ctx context.Context, tool string) (bool, error) {
	seq := n.lastPolicy.Load()
	if !n.policySeen.Load() {
		_, s, err := n.Policy(ctx) // a pruned one too (prune.go)
		if err != nil {
			return false, err
		}
		seq = max(seq, s)
		n.policySeen.Store(true)
		n.lastPolicy.Store(seq)
	}
	if seq == 0 {
		return false, nil
	}
	p, ok := n.policies.Load(seq)
	if !ok {
		pol, _, err := n.Policy(ctx)
		if err != nil {
			return false, err
		}
		p = pol
	}
	for _, e := range []string{chain.EffectWrite, chain.EffectDestructive, chain.EffectExternal} {
		g := p.(*Policy).GateFor(tool, e)
		if g.Gates() {
			return true, nil
		}
	}
	return false, nil
}

// SetPolicy records raw as the namespace's policy (SPEC §13): a policy
// receipt by actor, unless it equals the policy in force. A policy with
// "payloads": "committed" switches an inline namespace to committed
// payloads (SPEC §14), one way: every later policy records the member too.
// Errors: *Error with ECodeInvalidRequest naming the member.
func (n *Namespace) SetPolicy(ctx context.Context, raw json.RawMessage, actor string) (*PolicyResult, error) {
	p, err := ParsePolicy(raw)
	if err != nil {
		return nil, err
	}
	if p.Payloads == PayloadsCommitted && !n.committed() {
		// The switch's receipts are keyed with the fingerprint key: it
		// exists before the switch does.
		if _, err := n.FingerprintKey(ctx); err != nil {
			return nil, err
		}
	}
	var res *PolicyResult
	var set *Policy // the policy recorded
	switchAt := uint64(0)
	err = n.submit(ctx, "", func(ctx context.Context, t *batchTx) error {
		set, switchAt = p, 0
		cur, seq, err := t.policy(ctx)
		if err != nil {
			return err
		}
		committed, err := t.committed(ctx)
		if err != nil {
			return err
		}
		if committed && !n.committed() && p.Payloads == "" {
			c := *p // switched: a policy that omits the member does not switch back
			c.Payloads = PayloadsCommitted
			set = &c
		}
		if set.Retention != nil && !committed && set.Payloads != PayloadsCommitted {
			return Invalid("retention", "retention erases payloads, and this namespace keeps them inline (in its chain): switch it with \"payloads\": \"committed\" in the same policy, or create a committed namespace (docs/privacy.md)")
		}
		text, err := set.Canonical()
		if err != nil {
			return err
		}
		if len(text) > MaxPolicyBytes {
			return Invalid("policy", "the policy is larger than %d bytes", MaxPolicyBytes)
		}
		res = &PolicyResult{Policy: json.RawMessage(text), Seq: seq}
		if seq > 0 {
			if c, err := cur.Canonical(); err == nil && c == text {
				return nil
			}
		} else if set.Empty() {
			return nil // no policy and an empty one: nothing changes
		}
		r, err := t.append(ctx, chain.Receipt{Kind: chain.KindPolicy, Result: text, Actor: actor, RecordedAt: t.Now()})
		if err != nil {
			return err
		}
		if !committed && set.Payloads == PayloadsCommitted {
			switchAt = r.Seq
		}
		ref := refOf(&r)
		res.Seq, res.Changed, res.Receipt = r.Seq, true, &ref
		return nil
	})
	if err != nil {
		return nil, err
	}
	if res.Changed {
		n.policyCommitted(res.Seq, set) // none and read calls see it at once (gatesNoEffect)
	}
	if set.Archive != nil && n.KeyTTL() == 0 {
		res.Warnings = append(res.Warnings, "this namespace has no key TTL: its receipts can be archived, never pruned (docs/operations.md)")
	}
	if switchAt > 0 {
		n.learnSwitch(switchAt, switchAt)
		n.l.logger.InfoContext(ctx, "namespace switched to committed payloads", "namespace", n.name, "seq", switchAt)
	}
	return res, nil
}

// Answer records an approver's decision about the ask at req.Seq (SPEC
// §13). replayed is true when the same decision was recorded before (the
// original is returned). Errors: *Error with ECodeUnknownApproval,
// ECodeAlreadyAnswered, ECodeApprovalExpired, ECodeSelfApproval,
// ECodeForbidden or ECodeInvalidRequest.
func (n *Namespace) Answer(ctx context.Context, req AnswerRequest) (view *ApprovalView, replayed bool, err error) {
	if req.Decision != DecisionApprove && req.Decision != DecisionReject {
		return nil, false, Invalid("decision", `decision must be "approve" or "reject"`)
	}
	if len([]rune(req.Note)) > MaxNoteLen {
		return nil, false, Invalid("note", "note must be at most %d characters", MaxNoteLen)
	}
	err = n.submit(ctx, "", func(ctx context.Context, t *batchTx) error {
		var err error
		view, replayed, err = decideAnswer(ctx, t, t.Now(), &req)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	if !replayed {
		approvalEvents.WithLabelValues(req.Decision).Inc()
	}
	return view, replayed, nil
}

// decideAnswer runs the answer rules of SPEC §13 in one transaction.
func decideAnswer(ctx context.Context, t *batchTx, now uint64, req *AnswerRequest) (*ApprovalView, bool, error) {
	unknown := &Error{Code: ECodeUnknownApproval, Message: fmt.Sprintf("no ask at seq %d", req.Seq)}
	if req.Seq == 0 || req.Seq > t.Head().Seq {
		return nil, false, unknown
	}
	ask, err := t.Receipt(ctx, req.Seq)
	if err != nil {
		return nil, false, err
	}
	if ask.Kind != chain.KindAsk {
		return nil, false, unknown
	}
	hist, err := t.KeyHistory(ctx, ask.IdempotencyKey, ask.Seq)
	if err != nil {
		return nil, false, err
	}
	v := viewOf(&ask, hist, now)
	// Who may answer comes first: a token that may not answer learns
	// nothing of the ask's answer or expiry.
	p, _, err := t.policy(ctx)
	if err != nil {
		return nil, false, err
	}
	if err := mayAnswer(p, &ask, req); err != nil {
		return nil, false, err
	}
	outcome := chain.OutcomeApproved
	if req.Decision == DecisionReject {
		outcome = chain.OutcomeRejected
	}
	actor, role := req.Actor, req.Role // not req's: the batch may run this again
	if req.MCPClient != "" {
		actor, role = ask.Actor+"/"+ApproverMCPClient+":"+req.MCPClient, ApproverMCPClient
	}
	if v.Answer != nil {
		// Only the approver who answered, sending the same decision
		// again, gets the original (a retry); anyone else learns that the
		// ask is answered.
		if v.Answer.Outcome == outcome && v.Answer.Actor == actor {
			return v, true, nil
		}
		return nil, false, &Error{Code: ECodeAlreadyAnswered, Message: "this ask was already answered",
			Details: map[string]any{"answer": map[string]any{"seq": v.Answer.Seq, "outcome": v.Answer.Outcome, "actor": v.Answer.Actor}}}
	}
	if now >= ask.LeaseExpiresAt {
		return nil, false, &Error{Code: ECodeApprovalExpired, Message: "this ask expired before it was answered",
			Details: map[string]any{"expires_at": ask.LeaseExpiresAt}}
	}
	result, _ := json.Marshal(map[string]string{"role": role})
	r, err := t.append(ctx, chain.Receipt{Kind: chain.KindApproval, IdempotencyKey: ask.IdempotencyKey,
		Tool: ask.Tool, Effect: ask.Effect, Idempotent: ask.Idempotent, InputHash: ask.InputHash,
		Outcome: outcome, Result: string(result), RefSeq: ask.Seq, Actor: actor, Note: req.Note, RecordedAt: now})
	if err != nil {
		return nil, false, err
	}
	if err := t.SetAskInputDeadline(ctx, ask.Seq, now+t.retentionMS(), now); err != nil {
		return nil, false, err
	}
	if err := t.answerPending(ctx, &ask, &r); err != nil {
		return nil, false, err
	}
	v.Answer, v.AnswerRole, v.State = &r, role, outcome
	return v, false, nil
}

// mayAnswer checks the approver against the policy in force (SPEC §13).
func mayAnswer(p *Policy, ask *chain.Receipt, req *AnswerRequest) error {
	g := p.GateFor(ask.Tool, ask.Effect)
	if req.MCPClient != "" {
		return mayAnswerAsClient(&g, ask, req)
	}
	if !req.Authenticated {
		return nil // a ledger without tokens: nobody to tell apart
	}
	if ask.Actor != "" && req.Actor == ask.Actor && !g.SelfApproval {
		return &Error{Code: ECodeSelfApproval, Message: "the token that asked may not approve its own effect (self_approval is deny)",
			Details: map[string]any{"actor": req.Actor}}
	}
	if req.Role != RoleApprover && req.Role != RoleAdmin || !g.Lists(req.Actor, req.Role) {
		return &Error{Code: ECodeForbidden, Message: "this token is not among the rule's approvers",
			Details: map[string]any{"approvers": g.Approvers, "role": req.Role}}
	}
	return nil
}

// mayAnswerAsClient checks an answer the agent's own MCP client gave
// through ledger-mcp: a self-approval by construction (SPEC §13).
func mayAnswerAsClient(g *Gate, ask *chain.Receipt, req *AnswerRequest) error {
	if len(req.MCPClient) > 128 || !visibleASCII(req.MCPClient) {
		return Invalid("client", "client is the MCP client's name: 1–128 visible ASCII")
	}
	listed := false
	for _, a := range g.Approvers {
		listed = listed || a == ApproverMCPClient
	}
	switch {
	case !listed:
		return &Error{Code: ECodeForbidden, Message: "the rule does not list mcp-client among its approvers",
			Details: map[string]any{"approvers": g.Approvers}}
	case !g.SelfApproval:
		return &Error{Code: ECodeSelfApproval, Message: "an answer through the agent's own MCP client is a self-approval, and the policy denies self-approval",
			Details: map[string]any{"actor": ask.Actor}}
	case req.Actor != ask.Actor:
		return &Error{Code: ECodeForbidden, Message: "only the token that asked (the gateway's own) may relay its client's answer",
			Details: map[string]any{"actor": req.Actor}}
	}
	return nil
}

// viewOf derives an ask's state from the key's receipts from the ask on.
func viewOf(ask *chain.Receipt, hist []chain.Receipt, now uint64) *ApprovalView {
	v := &ApprovalView{Ask: *ask, State: ApprovalPending}
	var s struct {
		Summary string `json:"summary"`
	}
	_ = json.Unmarshal([]byte(ask.Value(chain.FieldResult)), &s) // a malformed (or erased) result shows no summary
	v.Summary = s.Summary
	for i := range hist {
		r := &hist[i]
		switch {
		case r.Kind == chain.KindApproval && r.RefSeq == ask.Seq && v.Answer == nil:
			v.Answer = r
			v.AnswerRole = answerRole(r)
		case r.Kind == chain.KindReserve && v.Answer != nil && r.RefSeq == v.Answer.Seq && v.Consumer == nil:
			v.Consumer = r
		}
	}
	switch {
	case v.Consumer != nil:
		v.State = ApprovalConsumed
	case v.Answer != nil && v.Answer.RecordedAt >= ask.LeaseExpiresAt:
		v.State = ApprovalExpired
	case v.Answer != nil && v.Answer.Outcome == chain.OutcomeRejected:
		v.State = ApprovalRejected
	case now >= ask.LeaseExpiresAt:
		v.State = ApprovalExpired
	case v.Answer != nil:
		v.State = ApprovalApproved
	}
	return v
}

// Approval returns the ask at seq with its state, and its input when
// withInput (approvers and admins). Errors: *Error ECodeUnknownApproval,
// ECodePruned (SPEC §16).
func (n *Namespace) Approval(ctx context.Context, seq uint64, withInput bool) (*ApprovalView, error) {
	ask, err := n.GetReceipt(ctx, seq)
	if err != nil || ask.Kind != chain.KindAsk {
		var e *Error
		if err == nil || errors.As(err, &e) && e.Code != ECodePruned {
			return nil, &Error{Code: ECodeUnknownApproval, Message: fmt.Sprintf("no ask at seq %d", seq)}
		}
		return nil, err
	}
	v, err := n.view(ctx, ask)
	if err != nil || !withInput {
		return v, err
	}
	in, found, err := n.chain.AskInput(ctx, seq, n.now())
	if err != nil {
		return nil, err
	}
	if found {
		v.Input = in
		fp, err := Fingerprint([]byte(in))
		if err == nil {
			fp, err = n.hashLike(ctx, fp, ask.InputHash)
		}
		ok := err == nil && fp == ask.InputHash
		v.InputVerified = &ok
	}
	return v, nil
}

// view reads the receipts of ask's key from the ask on and derives its
// state.
func (n *Namespace) view(ctx context.Context, ask *chain.Receipt) (*ApprovalView, error) {
	f := ReceiptFilter{Key: ask.IdempotencyKey, After: ask.Seq - 1, Limit: MaxPageLimit}
	var hist []chain.Receipt
	for range 10 { // an ask is answered and consumed within its key's next receipts
		rs, next, err := n.ListReceipts(ctx, f) // with their values: an answer's note
		if err != nil {
			return nil, err
		}
		hist = append(hist, rs...)
		if next == nil {
			break
		}
		f.After = *next
	}
	return viewOf(ask, hist, n.now()), nil
}

// now is the namespace's clock in unix ms.
func (n *Namespace) now() uint64 { return uint64(n.l.cfg.Now().UnixMilli()) }

// Approvals lists asks after seq after in seq order, those in state
// (all when ""), at most limit, and the seq to continue after (nil at
// the end).
func (n *Namespace) Approvals(ctx context.Context, state string, after uint64, limit int) ([]ApprovalView, *uint64, error) {
	switch state {
	case "", ApprovalPending, ApprovalApproved, ApprovalRejected, ApprovalExpired, ApprovalConsumed:
	default:
		return nil, nil, Invalid("state", "state must be pending, approved, rejected, expired or consumed")
	}
	if limit == 0 {
		limit = DefaultPageLimit
	}
	if limit < 1 || limit > MaxPageLimit {
		return nil, nil, Invalid("limit", "limit must be from 1 to %d", MaxPageLimit)
	}
	f := ReceiptFilter{Kind: chain.KindAsk, After: after, Limit: limit}
	var out []ApprovalView
	for {
		asks, next, err := n.ListReceipts(ctx, f) // with the asks' summaries
		if err != nil {
			return nil, nil, err
		}
		for i := range asks {
			v, err := n.view(ctx, &asks[i])
			if err != nil {
				return nil, nil, err
			}
			if state == "" || v.State == state {
				out = append(out, *v)
			}
			if len(out) == limit {
				if i == len(asks)-1 && next == nil {
					return out, nil, nil
				}
				s := asks[i].Seq
				return out, &s, nil
			}
		}
		if next == nil {
			return out, nil, nil
		}
		f.After = *next
	}
}
