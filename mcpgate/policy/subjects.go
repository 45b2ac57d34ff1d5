package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/template"
)

// checkSubjects validates a rule's subjects (SPEC §14): at most
// ledger.MaxSubjects strings, each a template (package template) of
// {{key}} and {{arguments.NAME}}.
func (r *Rule) checkSubjects() error {
	if r.Subjects == nil {
		return nil
	}
	if len(r.Subjects) > ledger.MaxSubjects {
		return fmt.Errorf("subjects: at most %d", ledger.MaxSubjects)
	}
	if r.Effect == ClassNone || r.Effect == ClassRead {
		return fmt.Errorf("effect %q is not recorded, so its calls have no subjects: give the tool an effect class", r.Effect)
	}
	for i, s := range r.Subjects {
		if s == "" {
			return fmt.Errorf("subjects[%d]: empty", i)
		}
		t, err := json.Marshal(s)
		if err != nil {
			return fmt.Errorf("subjects[%d]: %w", i, err)
		}
		if err := template.Check(t); err != nil {
			return fmt.Errorf("subjects[%d]: %w", i, err)
		}
	}
	return nil
}

// Subjects returns the subjects templates of a tool's calls: those of the
// first matching rule that sets them, as each member of the gate.
func (p Policy) Subjects(tool, ledgerTool string) []string {
	for i := range p.Rules {
		if r := &p.Rules[i]; r.Subjects != nil && r.matches(tool, ledgerTool) {
			return r.Subjects
		}
	}
	return nil
}

// ErrSubjectLeftOut: a subject template rendered to no subject — an
// argument it names is missing or neither a string nor a number, or the
// text is not 1–ledger.MaxSubjectLen bytes of UTF-8. The error names the
// template, never a value.
var ErrSubjectLeftOut = errors.New("subject left out")

// RenderSubject renders one subject template for a call: a string argument
// as it is, a number as its JSON text. An argument that is missing or of
// any other type, or a text that is not a subject, is ErrSubjectLeftOut.
func RenderSubject(tmpl, key string, args json.RawMessage) (string, error) {
	var all map[string]json.RawMessage
	_ = json.Unmarshal(args, &all)
	usable := make(map[string]json.RawMessage, len(all))
	for name, v := range all {
		if len(v) > 0 && (v[0] == '"' || v[0] == '-' || v[0] >= '0' && v[0] <= '9') {
			usable[name] = v
		}
	}
	t, err := json.Marshal(tmpl)
	if err != nil {
		return "", fmt.Errorf("subject %s: %w", tmpl, err)
	}
	out, err := template.Render(t, template.Vars{Key: key, Arguments: usable})
	if errors.Is(err, template.ErrMissing) {
		return "", fmt.Errorf("%w: %s: an argument it names is missing, or is not a string or a number", ErrSubjectLeftOut, tmpl)
	} else if err != nil {
		return "", fmt.Errorf("subject %s: %w", tmpl, err)
	}
	var s string
	if json.Unmarshal(out, &s) != nil {
		s = string(out) // a number, as its JSON text
	}
	if s == "" || len(s) > ledger.MaxSubjectLen || !utf8.ValidString(s) {
		return "", fmt.Errorf("%w: %s: not 1–%d bytes of UTF-8", ErrSubjectLeftOut, tmpl, ledger.MaxSubjectLen)
	}
	return s, nil
}
