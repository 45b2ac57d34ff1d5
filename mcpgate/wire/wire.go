// Package wire is the MCP gateway's shared vocabulary for JSON-RPC
// messages as they come: the protocol revisions told apart, the members of a JSON object read and set
// without decoding the rest, and the bound on a message's size. The core
// package mcpgate and its extensions import it; it imports neither.
package wire

import (
	"bytes"
	"encoding/json"
	"errors"
)

// Version20260728 is the stateless revision: no initialize, every
// request carries its version in _meta, and a call may answer
// input_required (multi round-trip requests).
const Version20260728 = "2026-07-28"

// Stateless reports whether version has multi round-trip requests and
// resultType.
func Stateless(version string) bool { return version >= Version20260728 }

// ErrUpstreamTimeout is a call the upstream did not answer within the
// gateway's upstream timeout.
var ErrUpstreamTimeout = errors.New("no answer within the upstream timeout")

// MaxBody bounds a POSTed MCP message.
const MaxBody = 8 << 20

// HasMember reports whether the JSON object raw has the member name.
func HasMember(raw json.RawMessage, name string) bool {
	if !bytes.Contains(raw, []byte(`"`+name+`"`)) {
		return false
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return false
	}
	_, ok := obj[name]
	return ok
}

// WithMembers returns the JSON object raw with the members of set set to
// their values, or removed where the value is nil.
func WithMembers(raw json.RawMessage, set map[string]any) (json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	for name, v := range set {
		if v == nil {
			delete(obj, name)
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		obj[name] = b
	}
	return json.Marshal(obj)
}

// AsMap reads a JSON object decoded into any (or a struct, through JSON).
func AsMap(v any) (map[string]any, bool) {
	if m, ok := v.(map[string]any); ok {
		return m, true
	}
	if v == nil {
		return nil, false
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	var m map[string]any
	return m, json.Unmarshal(b, &m) == nil && m != nil
}
