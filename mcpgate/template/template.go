// Package template renders the JSON templates of ledger-mcp's --policy
// rules (SPEC §15's lookup arguments; §14's subjects): every string value,
// at any depth, may hold the placeholders {{key}} (the call's idempotency
// key) and {{arguments.NAME}} (the member NAME of the call's arguments).
// A string that is exactly one placeholder becomes the JSON value it
// names, of whatever type; a placeholder within other text is replaced by
// the value's text (a string as it is, any other value as JSON). Member
// names are never templated, and "{{" always opens a placeholder.
package template

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Placeholders.
const (
	Key           = "key"
	argumentsPart = "arguments."
)

// Vars are what a template's placeholders name.
type Vars struct {
	Key       string
	Arguments map[string]json.RawMessage
}

// ErrMissing: a placeholder names an argument the call does not have.
var ErrMissing = errors.New("template: no such argument")

// Check reports whether t is JSON whose placeholders are all well formed.
func Check(t json.RawMessage) error {
	_, err := walk(t, func(p string) (json.RawMessage, error) { return json.RawMessage(`""`), nil })
	return err
}

// Uses reports whether t holds the placeholder p anywhere ({{p}}): Key,
// or "arguments.NAME". A template that does not check uses nothing.
func Uses(t json.RawMessage, p string) bool {
	used := false
	_, err := walk(t, func(q string) (json.RawMessage, error) {
		used = used || q == p
		return json.RawMessage(`""`), nil
	})
	return err == nil && used
}

// Render is t with each placeholder replaced from v; an argument the call
// lacks is ErrMissing.
func Render(t json.RawMessage, v Vars) (json.RawMessage, error) {
	return walk(t, func(p string) (json.RawMessage, error) {
		if p == Key {
			return json.Marshal(v.Key)
		}
		name := strings.TrimPrefix(p, argumentsPart)
		val, ok := v.Arguments[name]
		if !ok {
			return nil, fmt.Errorf("%w: %q", ErrMissing, name)
		}
		return val, nil
	})
}

// walk decodes t, replaces the placeholders of its string values with
// what value returns for each, and encodes the result.
func walk(t json.RawMessage, value func(p string) (json.RawMessage, error)) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(t))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	if dec.More() {
		return nil, errors.New("template: trailing data")
	}
	out, err := fill(tree, value)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	return b, nil
}

// fill is v with its strings' placeholders replaced.
func fill(v any, value func(string) (json.RawMessage, error)) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			f, err := fill(e, value)
			if err != nil {
				return nil, err
			}
			v[k] = f
		}
	case []any:
		for i, e := range v {
			f, err := fill(e, value)
			if err != nil {
				return nil, err
			}
			v[i] = f
		}
	case string:
		return fillString(v, value)
	}
	return v, nil
}

// fillString replaces the placeholders of s: a string that is one
// placeholder becomes its value, any other the text with each
// placeholder's text in its place.
func fillString(s string, value func(string) (json.RawMessage, error)) (any, error) {
	parts, err := split(s)
	if err != nil || len(parts) == 1 && !parts[0].placeholder {
		return s, err
	}
	if len(parts) == 1 {
		return value(parts[0].text)
	}
	var b strings.Builder
	for _, p := range parts {
		if !p.placeholder {
			b.WriteString(p.text)
			continue
		}
		raw, err := value(p.text)
		if err != nil {
			return nil, err
		}
		var str string
		if json.Unmarshal(raw, &str) == nil {
			b.WriteString(str)
		} else {
			b.Write(bytes.TrimSpace(raw))
		}
	}
	return b.String(), nil
}

type part struct {
	text        string // literal text, or the placeholder's name
	placeholder bool
}

// split cuts s into literal text and placeholders, checking each
// placeholder's name.
func split(s string) ([]part, error) {
	var parts []part
	for s != "" {
		i := strings.Index(s, "{{")
		if i < 0 {
			parts = append(parts, part{text: s})
			break
		}
		if i > 0 {
			parts = append(parts, part{text: s[:i]})
		}
		j := strings.Index(s[i:], "}}")
		if j < 0 {
			return nil, fmt.Errorf("template: %q: \"{{\" without \"}}\"", s)
		}
		name := s[i+2 : i+j]
		if name != Key && (!strings.HasPrefix(name, argumentsPart) || len(name) == len(argumentsPart)) {
			return nil, fmt.Errorf("template: {{%s}} is not {{key}} or {{arguments.NAME}}", name)
		}
		parts = append(parts, part{text: name, placeholder: true})
		s = s[i+j+2:]
	}
	return parts, nil
}
