package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/effect-ledger/effect-ledger/mcpgate/template"
)

// Lookup is a rule's lookup (SPEC §15): the upstream's read-only tool the
// gateway calls when a call of the rule's tools is interrupted with no
// outcome, and its arguments, a template (package template) of {{key}}
// and {{arguments.NAME}}. The tool must be annotated readOnlyHint: true by
// the upstream (the gateway checks it at start).
type Lookup struct {
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// ByKey reports whether the lookup asks by the call's idempotency key: only
// then is "nothing found" evidence that nothing applied (a search by other
// arguments that finds nothing is none).
func (l *Lookup) ByKey() bool { return template.Uses(l.Arguments, template.Key) }

// check validates a lookup: a tool name and an object of arguments whose
// placeholders are well formed.
func (l *Lookup) check() error {
	if l.Tool == "" {
		return errors.New("lookup: empty \"tool\"")
	}
	if len(l.Arguments) == 0 || string(l.Arguments) == "null" {
		l.Arguments = json.RawMessage("{}")
	}
	if t := bytes.TrimLeft(l.Arguments, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return errors.New("lookup: \"arguments\" must be a JSON object")
	}
	if err := template.Check(l.Arguments); err != nil {
		return fmt.Errorf("lookup: arguments: %w", err)
	}
	return nil
}

// Lookup returns the lookup of a tool's calls: that of the first matching
// rule that sets one, as each member of the gate (SPEC §13).
func (p Policy) Lookup(tool, ledgerTool string) (*Lookup, bool) {
	for i := range p.Rules {
		if r := &p.Rules[i]; r.Lookup != nil && r.matches(tool, ledgerTool) {
			return r.Lookup, true
		}
	}
	return nil, false
}

// LookupTools are the upstream tools the policy's lookups call, each once,
// for the check that they are read-only.
func (p Policy) LookupTools() []string {
	var tools []string
	seen := map[string]bool{}
	for _, r := range p.Rules {
		if r.Lookup != nil && !seen[r.Lookup.Tool] {
			seen[r.Lookup.Tool] = true
			tools = append(tools, r.Lookup.Tool)
		}
	}
	return tools
}
