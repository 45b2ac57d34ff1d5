package mcpgate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/internal/glob"
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

// Class is how the gateway treats a tool's calls.
type Class struct {
	Effect     string
	Idempotent bool
	OnError    string // "" (OnErrorNotApplied) or OnErrorFailed
}

// errorsApplyNothing reports whether the tool's error answers are
// recorded not_applied.
func (c Class) errorsApplyNothing() bool { return c.OnError != OnErrorFailed }

// Recorded reports whether calls of this class go through the ledger.
func (c Class) Recorded() bool { return c.Effect != ClassNone && c.Effect != ClassRead }

// Rule is one entry of a --policy file: the tools it matches (a name or a
// glob, tried against the upstream's tool name and the ledger's
// <server-name>.<tool>; `*` matches any bytes, `/` included, see
// internal/glob) and the class their calls get.
type Rule struct {
	Tool       string `json:"tool"`
	Effect     string `json:"effect"`
	Idempotent bool   `json:"idempotent"`
	// OnError says how the tool's error answers are recorded:
	// "not_applied" (the default) or "failed".
	OnError string `json:"on_error,omitempty"`

	glob *glob.Glob // Tool compiled, by ParsePolicy
}

// Policy overrides the tools' annotations; the first matching rule wins.
type Policy []Rule

// LoadPolicy reads a policy file: a JSON list of rules.
func LoadPolicy(file string) (Policy, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return ParsePolicy(b)
}

// ParsePolicy parses and checks a policy: unknown fields, an empty or
// malformed glob and an unknown effect class are errors.
func ParsePolicy(b []byte) (Policy, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p Policy
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if dec.More() {
		return nil, errors.New("policy: trailing data after the list of rules")
	}
	for i, r := range p {
		if r.Tool == "" {
			return nil, fmt.Errorf("policy: rule %d: empty \"tool\"", i+1)
		}
		g, err := glob.Compile(r.Tool)
		if err != nil {
			return nil, fmt.Errorf("policy: rule %d: tool %q: %w", i+1, r.Tool, err)
		}
		p[i].glob = g
		switch r.OnError {
		case "", OnErrorNotApplied, OnErrorFailed:
		default:
			return nil, fmt.Errorf("policy: rule %d: on_error %q is not one of not_applied, failed", i+1, r.OnError)
		}
		switch r.Effect {
		case ClassNone, ClassRead, ClassWrite, ClassDestructive, ClassExternal:
		default:
			return nil, fmt.Errorf("policy: rule %d: effect %q is not one of none, read, write, destructive, external", i+1, r.Effect)
		}
	}
	return p, nil
}

// match returns the first rule matching a tool, if any.
func (p Policy) match(tool, ledgerTool string) (Rule, bool) {
	for _, r := range p {
		g := r.glob
		if g == nil {
			var err error
			if g, err = glob.Compile(r.Tool); err != nil {
				continue
			}
		}
		if g.Match(tool) || g.Match(ledgerTool) {
			return r, true
		}
	}
	return Rule{}, false
}

// Classify decides the class of a tool's calls (SPEC §11): a policy rule
// first, else the tool's annotations with MCP's defaults for absent hints
// (readOnlyHint false, destructiveHint true, idempotentHint false,
// openWorldHint true). A tool without annotations, or one the upstream
// does not list, is therefore a non-idempotent destructive effect.
func Classify(p Policy, tool, ledgerTool string, ann *mcp.ToolAnnotations) Class {
	if r, ok := p.match(tool, ledgerTool); ok {
		return Class{Effect: r.Effect, Idempotent: r.Idempotent, OnError: r.OnError}
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
