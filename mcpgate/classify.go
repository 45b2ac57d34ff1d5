package mcpgate

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/policy"
)

// Effect classes (SPEC §1). None and read are not effects: such calls are
// forwarded without touching the ledger.
const (
	ClassNone        = policy.ClassNone
	ClassRead        = policy.ClassRead
	ClassWrite       = policy.ClassWrite
	ClassDestructive = policy.ClassDestructive
	ClassExternal    = policy.ClassExternal
)

// How a tool's error answers are recorded (SPEC §4.1, policy.OnErrorNotApplied).
const (
	OnErrorNotApplied = policy.OnErrorNotApplied
	OnErrorFailed     = policy.OnErrorFailed
)

// Policy is a --policy file (package policy).
type Policy = policy.Policy

// Rule is one entry of a --policy file.
type Rule = policy.Rule

// LoadPolicy reads a policy file (policy.Load).
func LoadPolicy(file string) (Policy, error) { return policy.Load(file) }

// ParsePolicy parses and checks a policy (policy.Parse).
func ParsePolicy(b []byte) (Policy, error) { return policy.Parse(b) }

// Class is how the gateway treats a tool's calls.
type Class struct {
	Effect     string
	Idempotent bool
	OnError    string // "" (OnErrorNotApplied) or OnErrorFailed, from the first matching rule that sets it
}

// errorsApplyNothing reports whether the tool's error answers are
// recorded not_applied.
func (c Class) errorsApplyNothing() bool { return c.OnError != OnErrorFailed }

// Recorded reports whether calls of this class go through the ledger.
func (c Class) Recorded() bool { return c.Effect != ClassNone && c.Effect != ClassRead }

// Classify decides the class of a tool's calls (SPEC §11): a policy rule
// first, else the tool's annotations with MCP's defaults for absent hints
// (readOnlyHint false, destructiveHint true, idempotentHint false,
// openWorldHint true). A tool without annotations, or one the upstream
// does not list, is therefore a non-idempotent destructive effect. How
// its error answers are recorded is the policy's onError.
func Classify(p Policy, tool, ledgerTool string, ann *mcp.ToolAnnotations) Class {
	c := classify(p, tool, ledgerTool, ann)
	if c.Recorded() {
		c.OnError = p.OnError(tool, ledgerTool)
	}
	return c
}

// classify is Classify's effect class and idempotence.
func classify(p Policy, tool, ledgerTool string, ann *mcp.ToolAnnotations) Class {
	if r, ok := p.Match(tool, ledgerTool); ok {
		return Class{Effect: r.Effect, Idempotent: r.Idempotent}
	}
	if ann == nil {
		ann = &mcp.ToolAnnotations{}
	}
	if ann.ReadOnlyHint {
		return Class{Effect: ClassRead}
	}
	c := Class{Effect: ClassWrite, Idempotent: ann.IdempotentHint}
	switch {
	case ann.DestructiveHint == nil || *ann.DestructiveHint:
		c.Effect = ClassDestructive
	case ann.OpenWorldHint == nil || *ann.OpenWorldHint:
		c.Effect = ClassExternal
	}
	return c
}
