package verify

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/internal/glob"
)

// The verifier reads a namespace's policy (SPEC §13) from its policy
// receipts with a parser of its own: it is deliberately independent of
// the server's code, so that a bug there is not repeated here.

// Policy defaults (SPEC §13).
const (
	defaultRepeatWindowMS = 24 * 3600 * 1000
	selfApprovalDeny      = "deny"
	selfApprovalAllow     = "allow"
)

// gatePolicy is a parsed policy: its rules in order and whether an
// approver may answer their own ask.
type gatePolicy struct {
	rules             []policyRule
	allowSelfApproval bool
	retentionMS       uint64 // SPEC §14; 0: none
}

// policyRule is one rule; a nil member is one the rule does not set.
type policyRule struct {
	tool          *glob.Glob
	effect        string // empty: any class
	approval      *bool
	approvers     []string
	hasApprovers  bool
	deny          *bool
	repeatRefuse  *bool
	repeatWindow  *uint64
	expiresInMS   *uint64
	approvalValue string
	reconcile     *bool // the reconcile member's allow (SPEC §15)
}

// gateRule is what a policy decides for one request: each member taken
// from the first matching rule that sets it.
type gateRule struct {
	approval     bool
	approvers    []string
	deny         bool
	repeatRefuse bool
	repeatWindow uint64
	reconcile    bool
}

// errUnknownMember: a policy member (of the policy, a rule or a rule's
// reconcile) this verifier does not know — a newer ledger's, SPEC §14:
// unsupported (exit 2), not policy_unknown.
var errUnknownMember = errors.New("unknown member")

// parsePolicy parses a policy receipt's result. Unknown members, values
// of the wrong type and bad globs are errors: the verifier cannot check a
// policy it does not understand.
func parsePolicy(text string) (*gatePolicy, error) {
	var top map[string]json.RawMessage
	if err := strictUnmarshal(text, &top); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	p := &gatePolicy{}
	for name, raw := range top {
		var err error
		switch name {
		case "rules":
			p.rules, err = parseRules(raw)
		case "self_approval":
			p.allowSelfApproval, err = parseSelfApproval(raw)
		case "payloads": // SPEC §14: switches an inline namespace, one way (payloadswitch.go)
			var mode string
			if err = strictUnmarshal(string(raw), &mode); err == nil && mode != "committed" {
				err = fmt.Errorf("payloads %q: a namespace switches one way, to committed, never back", mode)
			}
		case "archive": // SPEC §16: the prune receipts' floor
			err = checkArchive(raw)
		case "retention": // SPEC §14: checked by the retention erasures' rules
			var r struct {
				PayloadsMS uint64 `json:"payloads_ms"`
			}
			err = strictUnmarshal(string(raw), &r)
			p.retentionMS = r.PayloadsMS
		default:
			err = fmt.Errorf("%w %q", errUnknownMember, name)
		}
		if err != nil {
			return nil, fmt.Errorf("policy: %w", err)
		}
	}
	return p, nil
}

// checkArchive parses the archive member (SPEC §16): both members,
// numbers, with min_keep_ms ≤ keep_ms; a member this verifier does not
// know is errUnknownMember.
func checkArchive(raw json.RawMessage) error {
	var m map[string]json.RawMessage
	if err := strictUnmarshal(string(raw), &m); err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	var ms [2]uint64 // keep_ms, min_keep_ms
	for i, name := range []string{"keep_ms", "min_keep_ms"} {
		v, ok := m[name]
		if !ok {
			return fmt.Errorf("archive: %s missing", name)
		}
		if err := strictUnmarshal(string(v), &ms[i]); err != nil {
			return fmt.Errorf("archive.%s: %w", name, err)
		}
	}
	for name := range m {
		if name != "keep_ms" && name != "min_keep_ms" {
			return fmt.Errorf("archive: %w %q", errUnknownMember, name)
		}
	}
	if ms[1] > ms[0] {
		return fmt.Errorf("archive: min_keep_ms %d above keep_ms %d", ms[1], ms[0])
	}
	return nil
}

// strictUnmarshal decodes one JSON value with nothing after it; a null
// is an error.
func strictUnmarshal(text string, v any) error {
	if text == "" || text == "null" {
		return errors.New("empty")
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

func parseSelfApproval(raw json.RawMessage) (bool, error) {
	var s string
	if err := strictUnmarshal(string(raw), &s); err != nil {
		return false, fmt.Errorf("self_approval: %w", err)
	}
	switch s {
	case selfApprovalDeny:
		return false, nil
	case selfApprovalAllow:
		return true, nil
	}
	return false, fmt.Errorf("self_approval %q is not deny or allow", s)
}

func parseRules(raw json.RawMessage) ([]policyRule, error) {
	var list []map[string]json.RawMessage
	if err := strictUnmarshal(string(raw), &list); err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	rules := make([]policyRule, 0, len(list))
	for i, m := range list {
		r, err := parseRule(m)
		if err != nil {
			return nil, fmt.Errorf("rules[%d]: %w", i, err)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// parseRule parses one rule: tool is required, every other member is
// optional.
func parseRule(m map[string]json.RawMessage) (policyRule, error) {
	var r policyRule
	if m == nil {
		return r, errors.New("not an object")
	}
	if _, ok := m["tool"]; !ok {
		return r, errors.New("tool is required")
	}
	for name, raw := range m {
		if err := r.set(name, raw); err != nil {
			return r, fmt.Errorf("%s: %w", name, err)
		}
	}
	return r, nil
}

// set parses one member of a rule.
func (r *policyRule) set(name string, raw json.RawMessage) error {
	switch name {
	case "tool":
		return r.setTool(raw)
	case "effect":
		return r.setEffect(raw)
	case "approval":
		return r.setApproval(raw)
	case "approvers":
		r.hasApprovers = true
		return strictUnmarshal(string(raw), &r.approvers)
	case "deny":
		var b bool
		err := strictUnmarshal(string(raw), &b)
		r.deny = &b
		return err
	case "repeat_failure":
		return r.setRepeat(raw)
	case "repeat_window_ms":
		r.repeatWindow = new(uint64)
		return parseMS(raw, r.repeatWindow)
	case "expires_in_ms":
		r.expiresInMS = new(uint64)
		return parseMS(raw, r.expiresInMS)
	case "reconcile":
		return r.setReconcile(raw)
	}
	return errUnknownMember
}

// setReconcile takes {"allow": bool, "settle_ms": N} (SPEC §15); both
// members are optional, and allow defaults to false.
func (r *policyRule) setReconcile(raw json.RawMessage) error {
	var m map[string]json.RawMessage
	if err := strictUnmarshal(string(raw), &m); err != nil {
		return err
	}
	if m == nil {
		return errors.New("not an object")
	}
	r.reconcile = new(bool)
	for name, v := range m {
		var err error
		switch name {
		case "allow":
			err = strictUnmarshal(string(v), r.reconcile)
		case "settle_ms":
			var ms uint64
			err = parseMS(v, &ms)
		default:
			err = errUnknownMember
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

func (r *policyRule) setTool(raw json.RawMessage) error {
	var s string
	if err := strictUnmarshal(string(raw), &s); err != nil {
		return err
	}
	g, err := glob.Compile(s)
	if err != nil {
		return fmt.Errorf("bad glob: %w", err)
	}
	r.tool = g
	return nil
}

func (r *policyRule) setEffect(raw json.RawMessage) error {
	if err := strictUnmarshal(string(raw), &r.effect); err != nil {
		return err
	}
	switch r.effect {
	case chain.EffectNone, chain.EffectRead, chain.EffectWrite, chain.EffectDestructive, chain.EffectExternal:
		return nil
	}
	return fmt.Errorf("%q is not an effect class", r.effect)
}

// setApproval takes "required" (approval needed) or "none" (not needed).
func (r *policyRule) setApproval(raw json.RawMessage) error {
	if err := strictUnmarshal(string(raw), &r.approvalValue); err != nil {
		return err
	}
	switch r.approvalValue {
	case "required":
		r.approval = new(bool)
		*r.approval = true
	case "none":
		r.approval = new(bool)
	default:
		return fmt.Errorf("%q is not required or none", r.approvalValue)
	}
	return nil
}

// setRepeat takes "refuse" (the repeat guard) or "allow".
func (r *policyRule) setRepeat(raw json.RawMessage) error {
	var s string
	if err := strictUnmarshal(string(raw), &s); err != nil {
		return err
	}
	switch s {
	case "refuse":
		r.repeatRefuse = new(bool)
		*r.repeatRefuse = true
	case "allow":
		r.repeatRefuse = new(bool)
	default:
		return fmt.Errorf("%q is not refuse or allow", s)
	}
	return nil
}

// parseMS parses a non-negative integer number of milliseconds.
func parseMS(raw json.RawMessage, v *uint64) error {
	var n json.Number
	if err := strictUnmarshal(string(raw), &n); err != nil {
		return err
	}
	u, err := strconv.ParseUint(n.String(), 10, 64)
	if err != nil {
		return fmt.Errorf("%s is not a non-negative integer: %w", n, err)
	}
	*v = u
	return nil
}

// match returns what the policy decides for a request of tool with
// effect class effect: each member from the first matching rule that sets
// it (SPEC §13). A nil policy decides nothing.
func (p *gatePolicy) match(tool, effect string) gateRule {
	g := gateRule{repeatWindow: defaultRepeatWindowMS}
	if p == nil {
		return g
	}
	var approval, approvers, deny, repeat, window, reconcile bool
	for i := range p.rules {
		r := &p.rules[i]
		if !r.tool.Match(tool) || r.effect != "" && r.effect != effect {
			continue
		}
		if !approval && r.approval != nil {
			approval, g.approval = true, *r.approval
		}
		if !approvers && r.hasApprovers {
			approvers, g.approvers = true, r.approvers
		}
		if !deny && r.deny != nil {
			deny, g.deny = true, *r.deny
		}
		if !repeat && r.repeatRefuse != nil {
			repeat, g.repeatRefuse = true, *r.repeatRefuse
		}
		if !window && r.repeatWindow != nil {
			window, g.repeatWindow = true, *r.repeatWindow
		}
		if !reconcile && r.reconcile != nil {
			reconcile, g.reconcile = true, *r.reconcile
		}
	}
	return g
}

// maxWindow is the longest repeat window any rule sets (at least the
// default): failures older than it cannot refuse a reserve under p.
func (p *gatePolicy) maxWindow() uint64 {
	w := uint64(defaultRepeatWindowMS)
	if p == nil {
		return w
	}
	for _, r := range p.rules {
		if r.repeatWindow != nil {
			w = max(w, *r.repeatWindow)
		}
	}
	return w
}

// lists reports whether an approval by actor with role satisfies the
// rule's approvers (SPEC §13): `role:<role>` entries (an admin may do what
// an approver may), token names, and `mcp-client` for an answer made
// through the agent's own client. No approvers: any approver or admin.
// An approval without an actor (a ledger without tokens) cannot be
// decided and is accepted.
func (g gateRule) lists(actor, role string) bool {
	if actor == "" {
		return true
	}
	if len(g.approvers) == 0 {
		return role == "approver" || role == "admin"
	}
	for _, a := range g.approvers {
		switch {
		case a == "mcp-client":
			if strings.Contains(actor, "/mcp-client:") {
				return true
			}
		case strings.HasPrefix(a, "role:"):
			if r := a[len("role:"):]; r == role || r == "approver" && role == "admin" {
				return true
			}
		case actor == a || actor == "token:"+a:
			return true
		}
	}
	return false
}
