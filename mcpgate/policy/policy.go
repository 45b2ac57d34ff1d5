// Package policy is ledger-mcp's --policy file (SPEC §11, §13): rules
// that override the upstream's tool annotations (the effect class, its
// idempotence, how error answers are recorded) and carry the members of
// the ledger's gate, which an embedded ledger records as its namespace's
// policy (LedgerPolicy). The core (mcpgate.Classify) reads a call's rule
// from it.
package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/effect-ledger/effect-ledger/internal/glob"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Effect classes (SPEC §1). None and read are not effects: such calls are
// forwarded without touching the ledger.
const (
	ClassNone        = "none"
	ClassRead        = "read"
	ClassWrite       = "write"
	ClassDestructive = "destructive"
	ClassExternal    = "external"
)

// How a tool's error answer (isError, or a JSON-RPC error) is recorded
// (SPEC §4.1): OnErrorNotApplied, the default, records that the call
// applied nothing, so the same call may run again once its cause is fixed;
// OnErrorFailed records a failure that may have left something behind,
// which §4 lets run again only when retryable and idempotent (a person
// may correct it to not_applied). An unknown outcome is never either.
const (
	OnErrorNotApplied = "not_applied"
	OnErrorFailed     = "failed"
)

// Rule is one entry of a --policy file: the tools it matches (a name or a
// glob, tried against the upstream's tool name and the ledger's
// <server-name>.<tool>; `*` matches any bytes, `/` included, see
// internal/glob), the class their calls get, and the members of the
// ledger's gate (SPEC §13) for them. A rule without Effect leaves the
// class to the tool's annotations (and to later rules) and only gates.
type Rule struct {
	Tool       string `json:"tool"`
	Effect     string `json:"effect,omitempty"`
	Idempotent bool   `json:"idempotent,omitempty"`
	// OnError says how the tool's error answers are recorded:
	// "not_applied" (the default) or "failed".
	OnError string `json:"on_error,omitempty"`
	// Lookup asks the upstream whether an interrupted call applied (SPEC
	// §15, lookup.go).
	Lookup *Lookup `json:"lookup,omitempty"`
	// Subjects are templates (package template) of the subjects of the
	// calls (SPEC §14), e.g. "{{arguments.customer_id}}": opaque ids of
	// the people a call concerns, so that an erasure by subject finds its
	// key. At most 8; the gateway adds them to the client's own (subjects.go).
	Subjects []string `json:"subjects,omitempty"`

	// The gate's members (SPEC §13), which an embedded ledger records as
	// its namespace's policy (LedgerPolicy): each is taken from the first
	// matching rule that sets it.
	Approval       string   `json:"approval,omitempty"`  // "required" or "none"
	Approvers      []string `json:"approvers,omitempty"` // role:<role>, a token name, mcp-client
	ExpiresInMS    *uint64  `json:"expires_in_ms,omitempty"`
	Deny           *bool    `json:"deny,omitempty"`
	RepeatFailure  string   `json:"repeat_failure,omitempty"` // "refuse" or "allow"
	RepeatWindowMS *uint64  `json:"repeat_window_ms,omitempty"`
	// Reconcile is the ledger's own member (SPEC §15), as the ledger
	// reads it; a rule with a lookup and without it gets {"allow": true}.
	Reconcile *ledger.ReconcileRule `json:"reconcile,omitempty"`

	glob *glob.Glob // Tool compiled, by Parse
}

// gates reports whether r sets a member of the ledger's gate.
func (r *Rule) gates() bool { return r.holds() || r.Reconcile != nil }

// holds reports whether r sets a member of the gate that holds or
// refuses a reserve (SPEC §13): any but reconcile.
func (r *Rule) holds() bool {
	return r.Approval != "" || r.Approvers != nil || r.ExpiresInMS != nil || r.Deny != nil ||
		r.RepeatFailure != "" || r.RepeatWindowMS != nil
}

// toLedger reports whether r becomes rules of the ledger's policy: it
// sets a member of the gate, or names a lookup (whose reconcile the
// ledger must allow).
func (r *Rule) toLedger() bool { return r.gates() || r.Lookup != nil }

// Policy is a --policy file: rules that override the tools' annotations
// (the first matching rule with an effect wins) and carry the gate's
// members, and the gate's self_approval.
type Policy struct {
	Rules []Rule `json:"rules"`
	// SelfApproval is the gate's self_approval: "deny" (the ledger's
	// default) or "allow", which lets the agent's own client approve
	// (approvers ["mcp-client"]).
	SelfApproval string `json:"self_approval,omitempty"`
}

// HasGate reports whether the policy sets any member of the ledger's gate
// (SPEC §13, §15): a rule's approval, approvers, expires_in_ms, deny,
// repeat_failure, repeat_window_ms or reconcile, or self_approval.
func (p Policy) HasGate() bool {
	return p.holds() || slices.ContainsFunc(p.Rules, func(r Rule) bool { return r.Reconcile != nil })
}

// holds reports whether the policy sets a member of the gate that holds
// or refuses a reserve, or self_approval.
func (p Policy) holds() bool {
	if p.SelfApproval != "" {
		return true
	}
	for i := range p.Rules {
		if p.Rules[i].holds() {
			return true
		}
	}
	return false
}

// Load reads a policy file: a JSON list of rules, or an object
// {"rules": [...], "self_approval": "allow"|"deny"}.
func Load(file string) (Policy, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return Policy{}, fmt.Errorf("policy: %w", err)
	}
	return Parse(b)
}

// Parse parses and checks a policy, a list of rules or an object
// with rules and self_approval: unknown fields, an empty or malformed
// glob, an unknown effect class and a gate member out of its range are
// errors.
func Parse(b []byte) (Policy, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p Policy
	var err error
	if t := bytes.TrimLeft(b, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		err = dec.Decode(&p)
	} else {
		err = dec.Decode(&p.Rules)
	}
	if err != nil {
		return Policy{}, fmt.Errorf("policy: %w", err)
	}
	if dec.More() {
		return Policy{}, errors.New("policy: trailing data after the policy")
	}
	switch p.SelfApproval {
	case "", ledger.SelfApprovalAllow, ledger.SelfApprovalDeny:
	default:
		return Policy{}, fmt.Errorf("policy: self_approval %q is not one of allow, deny", p.SelfApproval)
	}
	for i := range p.Rules {
		if err := p.Rules[i].check(); err != nil {
			return Policy{}, fmt.Errorf("policy: rule %d: %w", i+1, err)
		}
	}
	return p, nil
}

// check validates a rule and compiles its glob.
func (r *Rule) check() error {
	if r.Tool == "" {
		return errors.New("empty \"tool\"")
	}
	g, err := glob.Compile(r.Tool)
	if err != nil {
		return fmt.Errorf("tool %q: %w", r.Tool, err)
	}
	r.glob = g
	switch r.OnError {
	case "", OnErrorNotApplied, OnErrorFailed:
	default:
		return fmt.Errorf("on_error %q is not one of not_applied, failed", r.OnError)
	}
	switch r.Effect {
	case ClassNone, ClassRead, ClassWrite, ClassDestructive, ClassExternal:
	case "":
		if !r.gates() && r.OnError == "" && r.Lookup == nil && r.Subjects == nil {
			return errors.New("no \"effect\", no \"on_error\" and no member of the gate (approval, approvers, expires_in_ms, deny, repeat_failure, repeat_window_ms, reconcile), nor a \"lookup\" or \"subjects\"")
		}
	default:
		return fmt.Errorf("effect %q is not one of none, read, write, destructive, external", r.Effect)
	}
	if (r.Effect == ClassNone || r.Effect == ClassRead) && (r.Approval == "required" || r.Deny != nil && *r.Deny) {
		return fmt.Errorf("effect %q is not recorded, so the ledger's gate (approval, deny) never sees its calls: "+
			"give the tool an effect class (write, destructive, external) to gate it", r.Effect)
	}
	if r.Lookup != nil {
		if r.Reconcile != nil && !r.Reconcile.Allow {
			return errors.New("a rule with a lookup cannot deny its reconcile (\"reconcile\": {\"allow\": false})")
		}
		if r.Effect == ClassNone || r.Effect == ClassRead {
			return fmt.Errorf("effect %q is not recorded, so its calls are never interrupted: a lookup needs an effect class", r.Effect)
		}
		if err := r.Lookup.check(); err != nil {
			return err
		}
	}
	if err := r.checkSubjects(); err != nil {
		return err
	}
	return r.checkGate()
}

// matches reports whether the rule's glob matches the tool's name or its
// ledger name.
func (r *Rule) matches(tool, ledgerTool string) bool {
	g := r.glob
	if g == nil {
		var err error
		if g, err = glob.Compile(r.Tool); err != nil {
			return false
		}
	}
	return g.Match(tool) || g.Match(ledgerTool)
}

// Match returns the first rule with an effect matching a tool, if any.
func (p Policy) Match(tool, ledgerTool string) (Rule, bool) {
	for _, r := range p.Rules {
		if r.Effect != "" && r.matches(tool, ledgerTool) { // a rule without effect only gates or sets on_error
			return r, true
		}
	}
	return Rule{}, false
}

// OnError is how a tool's error answers are recorded: the on_error of the
// first matching rule that sets it (as each member of the gate, SPEC
// §13), so a rule of its own, {"tool": …, "on_error": "failed"}, applies
// beside a class from the annotations or a later rule.
func (p Policy) OnError(tool, ledgerTool string) string {
	for _, r := range p.Rules {
		if r.OnError != "" && r.matches(tool, ledgerTool) {
			return r.OnError
		}
	}
	return ""
}

// LedgerPolicy is the gate's part of the policy as the ledger's policy
// of a namespace (SPEC §13), with the reconcile each lookup needs (SPEC
// §15), for a gateway whose ledger tool names are <serverName>.<tool>, or
// nil when the policy sets no member of the gate and names no lookup.
// Each rule's glob matches the tool's name or its ledger name (Match);
// the ledger matches ledger names only, so a rule becomes two: its glob
// as written (a ledger name) and the glob under the server's prefix (the
// upstream's name), adjacent, so that the first rule setting a member is
// the same for every ledger name. The ledger's own parser checks the
// result, and its error names the member at fault.
func (p Policy) LedgerPolicy(serverName string) (json.RawMessage, error) {
	return p.LedgerPolicyOver(serverName, nil)
}

// LedgerPolicyOver is LedgerPolicy for a namespace whose policy in force
// is inForce: a policy that sets members of the gate that hold or refuse
// a reserve (SPEC §13), or self_approval, replaces it; one that only
// names lookups (and their reconcile) keeps it, with the lookups'
// reconcile rules first (those of an earlier start, rules of the same
// glob that set only reconcile, replaced), so that a policy set by a
// person stays in force.
func (p Policy) LedgerPolicyOver(serverName string, inForce *ledger.Policy) (json.RawMessage, error) {
	out := ledger.Policy{SelfApproval: p.SelfApproval}
	prefix := globEscape(ToolNamePart(serverName)) + "."
	ours := map[string]bool{}
	for i := range p.Rules {
		r := &p.Rules[i]
		if !r.toLedger() {
			continue
		}
		lr := r.ledgerRule()
		out.Rules = append(out.Rules, lr)
		ours[lr.Tool] = true
		if r.Tool != "*" { // "*" matches every ledger name already
			lr.Tool = prefix + r.Tool
			out.Rules = append(out.Rules, lr)
			ours[lr.Tool] = true
		}
	}
	if len(out.Rules) == 0 && !p.HasGate() {
		return nil, nil
	}
	if inForce != nil { // the namespace's own members: a gateway's file never sets them
		out.Retention, out.Archive = inForce.Retention, inForce.Archive
	}
	if !p.holds() && inForce != nil {
		out.SelfApproval = inForce.SelfApproval
		for _, r := range inForce.Rules {
			if !(ours[r.Tool] && onlyReconciles(r)) {
				out.Rules = append(out.Rules, r)
			}
		}
	}
	if out.Rules == nil {
		out.Rules = []ledger.PolicyRule{}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if _, err := ledger.ParsePolicy(b); err != nil {
		return nil, fmt.Errorf("policy: the gate's members: %w", err)
	}
	return b, nil
}

// onlyReconciles reports whether a rule of the ledger's policy sets
// reconcile and no other member: the rule a lookup adds.
func onlyReconciles(r ledger.PolicyRule) bool {
	return r.Reconcile != nil && r.Effect == "" && r.Approval == nil && r.Approvers == nil && r.ExpiresInMS == nil &&
		r.Deny == nil && r.RepeatFailure == nil && r.RepeatWindowMS == nil
}

// ledgerRule is the rule's gate members as a rule of the ledger's policy.
func (r *Rule) ledgerRule() ledger.PolicyRule {
	lr := ledger.PolicyRule{Tool: r.Tool, Approvers: r.Approvers, ExpiresInMS: r.ExpiresInMS, Deny: r.Deny,
		RepeatWindowMS: r.RepeatWindowMS, Reconcile: r.Reconcile}
	if r.Approval != "" {
		lr.Approval = &r.Approval
	}
	if r.RepeatFailure != "" {
		lr.RepeatFailure = &r.RepeatFailure
	}
	if r.Lookup != nil && lr.Reconcile == nil {
		lr.Reconcile = &ledger.ReconcileRule{Allow: true}
	}
	return lr
}

// checkGate checks the rule's gate members by the ledger's rules.
func (r *Rule) checkGate() error {
	if !r.gates() {
		return nil
	}
	b, err := json.Marshal(ledger.Policy{Rules: []ledger.PolicyRule{r.ledgerRule()}})
	if err != nil {
		return err
	}
	var e *ledger.Error
	if _, err := ledger.ParsePolicy(b); errors.As(err, &e) {
		return errors.New(e.Message)
	} else if err != nil {
		return err
	}
	return nil
}

// globEscape makes s a glob that matches s only.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
