package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/gowebpki/jcs"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/internal/glob"
)

// The gate's policy (SPEC §13): rules by tool glob (and effect) that deny
// a reserve, send it to a person's approval, or refuse a retry that
// changes nothing. A namespace's policy is the latest `policy` receipt of
// its chain; an empty policy keeps the v1.2 behaviour.

// Policy bounds and defaults.
const (
	// DefaultApprovalExpiryMS is how long an ask waits for its answer when
	// the rule sets no expires_in_ms: 1 h.
	DefaultApprovalExpiryMS = 3_600_000
	// MaxApprovalExpiryMS bounds expires_in_ms: 30 days.
	MaxApprovalExpiryMS = 30 * 86_400_000
	// DefaultRepeatWindowMS is the repeat guard's window when the rule
	// sets no repeat_window_ms: 24 h.
	DefaultRepeatWindowMS = 86_400_000
	// MaxPolicyRules bounds a policy's rules.
	MaxPolicyRules = 256
	// MaxPolicyBytes bounds a policy's canonical text.
	MaxPolicyBytes = 64 << 10
	// MaxApprovalSummary bounds an ask's approval_summary in bytes.
	MaxApprovalSummary = 1024
	// MaxAskInput bounds the input kept for the approvers, in bytes.
	MaxAskInput = 64 << 10
	// DefaultSettleMS is how long past a lease's end a reconcile
	// not_applied waits when the rule sets no settle_ms (SPEC §15): 60 s.
	DefaultSettleMS = 60_000
	// MaxSettleMS bounds settle_ms: 30 days, so that a lease's end plus
	// it never overflows.
	MaxSettleMS = 30 * 86_400_000
)

// Approvers entries with a meaning of their own.
const (
	// ApproverMCPClient lets ledger-mcp ask the agent's own client.
	ApproverMCPClient = "mcp-client"
	// approverRolePrefix names a token role: "role:approver".
	approverRolePrefix = "role:"
)

// Self-approval settings.
const (
	SelfApprovalDeny  = "deny"
	SelfApprovalAllow = "allow"
)

// Policy is a namespace's policy as set by an admin.
type Policy struct {
	Rules        []PolicyRule `json:"rules,omitempty"`
	SelfApproval string       `json:"self_approval,omitempty"`
	// Retention erases the payloads of finished keys this old (SPEC §14).
	Retention *Retention `json:"retention,omitempty"`
	// Payloads "committed" switches an inline namespace, one way, to
	// committed payloads from the next receipt on (SPEC §14); "" leaves
	// the mode as it is.
	Payloads PayloadMode `json:"payloads,omitempty"`
	// Archive is when receipts are archived and pruned (SPEC §16).
	Archive *Archive `json:"archive,omitempty"`
}

// Archive is the policy's archive member (SPEC §16): the receipts of
// finished keys are archived and pruned once KeepMS old, and none younger
// than MinKeepMS ever is, even when asked.
type Archive struct {
	KeepMS    uint64 `json:"keep_ms"`
	MinKeepMS uint64 `json:"min_keep_ms"`
}

// MinArchiveKeepMS is the shortest archive.min_keep_ms a policy may set.
const MinArchiveKeepMS = 60_000

// Retention is the policy's retention member (SPEC §14).
type Retention struct {
	PayloadsMS uint64 `json:"payloads_ms"`
}

// MinRetentionMS is the shortest payload retention a policy may set.
const MinRetentionMS = 60_000

// PolicyRule is one rule; nil members are not set by it.
type PolicyRule struct {
	Tool           string   `json:"tool"`
	Effect         string   `json:"effect,omitempty"`
	Approval       *string  `json:"approval,omitempty"`
	Approvers      []string `json:"approvers,omitempty"`
	ExpiresInMS    *uint64  `json:"expires_in_ms,omitempty"`
	Deny           *bool    `json:"deny,omitempty"`
	RepeatFailure  *string  `json:"repeat_failure,omitempty"`
	RepeatWindowMS *uint64  `json:"repeat_window_ms,omitempty"`
	// Reconcile lets the actor of an interrupted reserve end it from a
	// downstream's answer (SPEC §15).
	Reconcile *ReconcileRule `json:"reconcile,omitempty"`

	glob *glob.Glob
}

// ReconcileRule is a rule's reconcile member (SPEC §15): allow, and how
// long past the lease a not_applied waits (nil: DefaultSettleMS).
type ReconcileRule struct {
	Allow    bool    `json:"allow"`
	SettleMS *uint64 `json:"settle_ms,omitempty"`
}

// UnmarshalJSON decodes the member strictly, naming a bad member by its
// path under reconcile.
func (r *ReconcileRule) UnmarshalJSON(raw []byte) error {
	type plain ReconcileRule
	return decodeStrict(raw, (*plain)(r), "reconcile.")
}

// Gate is what a policy decides for one (tool, effect): each member from
// the first matching rule that sets it.
type Gate struct {
	Deny     bool
	DenyRule int // index of the rule that set Deny, -1 if none
	// Approval is true when a person must approve.
	Approval     bool
	Approvers    []string // empty: any approver or admin token
	ExpiresInMS  uint64
	RepeatRefuse bool
	RepeatWindow uint64
	SelfApproval bool // self-approval allowed
	// Reconcile is true when the actor of an interrupted reserve may
	// reconcile it (SPEC §15); SettleMS is its settle time.
	Reconcile     bool
	SettleMS      uint64
	approvalsRule int
}

// Gates reports whether the gate holds or refuses reserves (deny or
// approval), the rules that make a none/read call a class mismatch and
// a generated key unusable.
func (g *Gate) Gates() bool { return g.Deny || g.Approval }

// ParsePolicy decodes and checks a policy text: unknown members, bad globs
// and values out of range are invalid_request errors naming the member.
func ParsePolicy(raw []byte) (*Policy, error) {
	var p Policy
	if isNull(raw) {
		return &p, nil
	}
	if err := CheckIJSON(raw); err != nil {
		return nil, Invalid("policy", "the policy is not valid JSON: %v", err)
	}
	var top struct {
		Rules        []json.RawMessage `json:"rules"`
		SelfApproval string            `json:"self_approval"`
		Retention    *Retention        `json:"retention"`
		Payloads     *string           `json:"payloads"`
		Archive      json.RawMessage   `json:"archive"`
	}
	if err := decodeStrict(raw, &top, ""); err != nil {
		return nil, err
	}
	if !isNull(top.Archive) {
		var err error
		if p.Archive, err = parseArchive(top.Archive); err != nil {
			return nil, err
		}
	}
	p.SelfApproval, p.Retention = top.SelfApproval, top.Retention
	if top.Payloads != nil {
		if PayloadMode(*top.Payloads) != PayloadsCommitted {
			return nil, Invalid("payloads", `payloads can only be "committed": a namespace switches one way, from inline to committed, and never back (docs/privacy.md)`)
		}
		p.Payloads = PayloadsCommitted
	}
	p.Rules = make([]PolicyRule, len(top.Rules))
	for i, r := range top.Rules {
		if err := decodeStrict(r, &p.Rules[i], fmt.Sprintf("rules[%d].", i)); err != nil {
			return nil, err
		}
	}
	if len(p.Rules) == 0 {
		p.Rules = nil
	}
	return &p, p.check()
}

// parseArchive decodes the archive member: both of its members are
// required, 60,000 ≤ min_keep_ms ≤ keep_ms ≤ MaxKeyTTL.
func parseArchive(raw json.RawMessage) (*Archive, error) {
	var a struct {
		KeepMS    *uint64 `json:"keep_ms"`
		MinKeepMS *uint64 `json:"min_keep_ms"`
	}
	if err := decodeStrict(raw, &a, "archive."); err != nil {
		return nil, err
	}
	switch {
	case a.KeepMS == nil:
		return nil, Invalid("archive.keep_ms", "archive.keep_ms is required: how old a finished key's receipts are when they are archived and pruned")
	case a.MinKeepMS == nil:
		return nil, Invalid("archive.min_keep_ms", "archive.min_keep_ms is required: the age below which no receipt is ever pruned, even when asked")
	case *a.MinKeepMS < MinArchiveKeepMS || *a.MinKeepMS > MaxKeyTTL:
		return nil, Invalid("archive.min_keep_ms", "archive.min_keep_ms must be from %d to %d", MinArchiveKeepMS, uint64(MaxKeyTTL))
	case *a.KeepMS < *a.MinKeepMS || *a.KeepMS > MaxKeyTTL:
		return nil, Invalid("archive.keep_ms", "archive.keep_ms must be from archive.min_keep_ms (%d) to %d", *a.MinKeepMS, uint64(MaxKeyTTL))
	}
	return &Archive{KeepMS: *a.KeepMS, MinKeepMS: *a.MinKeepMS}, nil
}

// decodeStrict decodes one JSON value into v, refusing unknown members
// and trailing data with an invalid_request naming the member (at is
// the path of v: "" or "rules[2].").
func decodeStrict(raw []byte, v any, at string) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var ute *json.UnmarshalTypeError
	var nested *Error
	switch {
	case err == nil && dec.More():
		return Invalid("policy", "trailing data after the policy")
	case err == nil:
		return nil
	case errors.As(err, &nested): // a member's own decoder (ReconcileRule)
		field, _ := nested.Details["field"].(string)
		return Invalid(at+field, "%s (in %s)", nested.Message, strings.TrimSuffix(at, "."))
	case errors.As(err, &ute) && ute.Field != "":
		return Invalid(at+ute.Field, "%s%s must be a JSON %s", at, ute.Field, jsonKind(ute.Type.Kind().String()))
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		return Invalid(at+name, "unknown member %q in the policy", at+name)
	}
	field := strings.TrimSuffix(at, ".")
	if field == "" {
		field = "policy"
	}
	return Invalid(field, "the policy does not decode: %v", err)
}

// jsonKind names a Go kind as the JSON type it decodes from.
func jsonKind(k string) string {
	switch k {
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "slice":
		return "array"
	case "struct", "map":
		return "object"
	}
	return "number"
}

// check validates p and compiles its globs.
func (p *Policy) check() error {
	switch p.SelfApproval {
	case "", SelfApprovalDeny, SelfApprovalAllow:
	default:
		return Invalid("self_approval", "self_approval must be %q or %q", SelfApprovalDeny, SelfApprovalAllow)
	}
	if len(p.Rules) > MaxPolicyRules {
		return Invalid("rules", "at most %d rules", MaxPolicyRules)
	}
	if r := p.Retention; r != nil && (r.PayloadsMS < MinRetentionMS || r.PayloadsMS > MaxKeyTTL) {
		return Invalid("retention.payloads_ms", "retention.payloads_ms must be from %d to %d", MinRetentionMS, uint64(MaxKeyTTL))
	}
	for i := range p.Rules {
		if err := p.Rules[i].check(fmt.Sprintf("rules[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

func (r *PolicyRule) check(at string) error {
	if r.Tool == "" || len(r.Tool) > 256 {
		return Invalid(at+".tool", "tool is a glob of 1–256 bytes")
	}
	g, err := glob.Compile(r.Tool)
	if err != nil {
		return Invalid(at+".tool", "tool glob: %v", err)
	}
	r.glob = g
	if r.Effect != "" && (!isEffectClass(r.Effect) || r.Effect == chain.EffectNone || r.Effect == chain.EffectRead) {
		return Invalid(at+".effect", "effect must be write, destructive or external")
	}
	if r.Approval != nil && *r.Approval != "required" && *r.Approval != "none" {
		return Invalid(at+".approval", `approval must be "required" or "none"`)
	}
	if len(r.Approvers) == 0 {
		r.Approvers = nil // an empty list sets nothing, as its canonical text (which omits it) says
	}
	for _, a := range r.Approvers {
		if a == "" || len(a) > 128 || !visibleASCII(a) {
			return Invalid(at+".approvers", "an approver is role:<role>, a token name or mcp-client (1–128 visible ASCII)")
		}
	}
	if r.ExpiresInMS != nil && (*r.ExpiresInMS < 1000 || *r.ExpiresInMS > MaxApprovalExpiryMS) {
		return Invalid(at+".expires_in_ms", "expires_in_ms must be from 1000 to %d", uint64(MaxApprovalExpiryMS))
	}
	if r.RepeatFailure != nil && *r.RepeatFailure != "refuse" && *r.RepeatFailure != "allow" {
		return Invalid(at+".repeat_failure", `repeat_failure must be "refuse" or "allow"`)
	}
	if r.RepeatWindowMS != nil && (*r.RepeatWindowMS < 1 || *r.RepeatWindowMS > 366*86_400_000) {
		return Invalid(at+".repeat_window_ms", "repeat_window_ms must be from 1 to %d", uint64(366*86_400_000))
	}
	if r.Reconcile != nil && r.Reconcile.SettleMS != nil && *r.Reconcile.SettleMS > MaxSettleMS {
		return Invalid(at+".reconcile.settle_ms", "settle_ms must be from 0 to %d", uint64(MaxSettleMS))
	}
	return nil
}

// Canonical is the policy's RFC 8785 text, what a policy receipt records.
func (p *Policy) Canonical() (string, error) {
	raw, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("policy: %w", err)
	}
	c, err := jcs.Transform(raw)
	if err != nil {
		return "", fmt.Errorf("policy: %w", err)
	}
	return string(c), nil
}

// Empty reports whether p has no rules, the default self-approval, no
// retention, payloads or archive member.
func (p *Policy) Empty() bool {
	return p == nil || len(p.Rules) == 0 && p.SelfApproval != SelfApprovalAllow && p.Retention == nil && p.Payloads == "" &&
		p.Archive == nil
}

// GateFor resolves the members that apply to (tool, effect).
func (p *Policy) GateFor(tool, effect string) Gate {
	g := Gate{DenyRule: -1, approvalsRule: -1, ExpiresInMS: DefaultApprovalExpiryMS,
		RepeatWindow: DefaultRepeatWindowMS, SettleMS: DefaultSettleMS}
	if p == nil {
		return g
	}
	g.SelfApproval = p.SelfApproval == SelfApprovalAllow
	var approval, approvers, expires, deny, repeat, window, reconcile bool
	for i := range p.Rules {
		r := &p.Rules[i]
		if !r.matches(tool, effect) {
			continue
		}
		if !approval && r.Approval != nil {
			approval, g.Approval = true, *r.Approval == "required"
			g.approvalsRule = i
		}
		if !approvers && r.Approvers != nil {
			approvers, g.Approvers = true, r.Approvers
		}
		if !expires && r.ExpiresInMS != nil {
			expires, g.ExpiresInMS = true, *r.ExpiresInMS
		}
		if !deny && r.Deny != nil {
			deny, g.Deny = true, *r.Deny
			if g.Deny {
				g.DenyRule = i
			}
		}
		if !repeat && r.RepeatFailure != nil {
			repeat, g.RepeatRefuse = true, *r.RepeatFailure == "refuse"
		}
		if !window && r.RepeatWindowMS != nil {
			window, g.RepeatWindow = true, *r.RepeatWindowMS
		}
		if !reconcile && r.Reconcile != nil {
			reconcile, g.Reconcile = true, r.Reconcile.Allow
			if r.Reconcile.SettleMS != nil {
				g.SettleMS = *r.Reconcile.SettleMS
			}
		}
	}
	return g
}

func (r *PolicyRule) matches(tool, effect string) bool {
	if r.glob == nil {
		g, err := glob.Compile(r.Tool)
		if err != nil {
			return false
		}
		r.glob = g
	}
	return r.glob.Match(tool) && (r.Effect == "" || r.Effect == effect)
}

// Lists reports whether the gate's approvers admit an approver with this
// token name (actor) and role. An empty list admits approver and admin
// roles.
func (g *Gate) Lists(actor, role string) bool {
	if len(g.Approvers) == 0 {
		return role == RoleApprover || role == RoleAdmin || role == ""
	}
	for _, a := range g.Approvers {
		// An admin may do whatever an approver may.
		if r, ok := strings.CutPrefix(a, approverRolePrefix); ok && role != "" && (r == role || r == RoleApprover && role == RoleAdmin) {
			return true
		}
		if a == ApproverMCPClient {
			if strings.Contains(actor, "/"+ApproverMCPClient+":") {
				return true
			}
			continue // the entry names relayed answers, never a token
		}
		if a == actor && actor != "" {
			return true
		}
	}
	return false
}

// Changed is a reserve's claim of what differs from a failed attempt
// (SPEC §13 repeat guard); stored in every reserve's note of a namespace
// with a policy.
type Changed struct {
	ContextHash string `json:"context_hash,omitempty"`
	Component   string `json:"component,omitempty"`
	Strategy    string `json:"strategy,omitempty"`
}

// note is c's RFC 8785 text ("{}" when empty).
func (c *Changed) note() string {
	if c == nil {
		return "{}"
	}
	raw, _ := json.Marshal(c) // strings only: cannot fail
	out, err := jcs.Transform(raw)
	if err != nil {
		return "{}"
	}
	return string(out)
}

// differsFrom reports whether c names a value that differs from the one
// recorded in a failed attempt's reserve note (a member c leaves empty
// does not count).
func (c *Changed) differsFrom(note string) bool {
	if c == nil {
		return false
	}
	var old Changed
	_ = json.Unmarshal([]byte(note), &old) // an empty or old note: nothing recorded
	return c.ContextHash != "" && c.ContextHash != old.ContextHash ||
		c.Component != "" && c.Component != old.Component ||
		c.Strategy != "" && c.Strategy != old.Strategy
}
