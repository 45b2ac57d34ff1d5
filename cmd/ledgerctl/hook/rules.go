package hook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/internal/glob"
)

// Rule says what the calls it matches do. Tool is a glob over the ledger
// tool name (<agent>.<tool_name>), Command one over tool_input.command
// (shells); an empty one matches anything. Effect is a class of SPEC §1
// ("read" and "none" are not recorded); Dedupe gives the call a key
// derived from what it does, so that the same call in one scope runs
// once.
type Rule struct {
	Tool       string `json:"tool"`
	Command    string `json:"command"`
	Effect     string `json:"effect"`
	Idempotent bool   `json:"idempotent"`
	Dedupe     bool   `json:"dedupe"`

	tool, command *glob.Glob
}

// Rules are a policy file's rules in order: the first that matches wins.
type Rules []Rule

// readTools are each agent's tools that only read: without a rule, they
// are not recorded.
var readTools = map[string][]string{
	"claude-code": {"Read", "Grep", "Glob", "LS", "WebSearch", "TodoWrite", "NotebookRead"},
}

// classes are the effect classes a rule may name.
var classes = []client.Class{client.ClassNone, client.ClassRead, client.ClassWrite, client.ClassDestructive, client.ClassExternal}

// LoadRules reads a policy file: a JSON list of rules.
func LoadRules(path string) (Rules, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("hook policy: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var rules Rules
	if err := dec.Decode(&rules); err != nil {
		return nil, fmt.Errorf("hook policy %s: %w", path, err)
	}
	for i := range rules {
		r := &rules[i]
		if !slices.Contains(classes, client.Class(r.Effect)) {
			return nil, fmt.Errorf("hook policy %s: rule %d: effect must be none, read, write, destructive or external, got %q", path, i, r.Effect)
		}
		if r.Tool != "" {
			if r.tool, err = glob.Compile(r.Tool); err != nil {
				return nil, fmt.Errorf("hook policy %s: rule %d: %w", path, i, err)
			}
		}
		if r.Command != "" {
			if r.command, err = glob.Compile(r.Command); err != nil {
				return nil, fmt.Errorf("hook policy %s: rule %d: %w", path, i, err)
			}
		}
	}
	return rules, nil
}

// Match returns the rule for a call of the agent's tool (tool is the
// agent's own name, ledgerTool <agent>.<tool>) with input: the first
// matching rule, else read for the agent's read tools and a write without
// dedupe for every other.
func (rs Rules) Match(agent, tool, ledgerTool string, input json.RawMessage) Rule {
	var cmd struct {
		Command any `json:"command"`
	}
	_ = json.Unmarshal(input, &cmd) // not an object: no command
	command, isString := cmd.Command.(string)
	for _, r := range rs {
		if r.tool != nil && !r.tool.Match(ledgerTool) {
			continue
		}
		if r.command != nil && (!isString || !r.command.Match(command)) {
			continue
		}
		return r
	}
	if slices.Contains(readTools[agent], tool) {
		return Rule{Effect: string(client.ClassRead)}
	}
	return Rule{Effect: string(client.ClassWrite)}
}

// records reports whether calls under r are effects the ledger records.
func (r Rule) records() bool {
	return r.Effect != string(client.ClassRead) && r.Effect != string(client.ClassNone)
}
