// Package wire is the MCP gateway's shared vocabulary for JSON-RPC
// messages as they come: the protocol revisions told apart, the members of
// a JSON object (and of its _meta) read and set without decoding the rest,
// the requests a server sends its client, and the bound on a message's size. The core
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

// AsksClient reports whether method is one of the requests a server
// sends its client: elicitation/create, sampling/createMessage and
// roots/list.
func AsksClient(method string) bool {
	switch method {
	case "elicitation/create", "sampling/createMessage", "roots/list":
		return true
	}
	return false
}

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

// EditObject decodes the JSON object raw, lets edit change its members
// and encodes it again. It returns raw as it is where raw is not an
// object, edit reports false or the object does not encode.
func EditObject(raw json.RawMessage, edit func(obj map[string]json.RawMessage) bool) json.RawMessage {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil || obj == nil || !edit(obj) {
		return raw
	}
	out, err := json.Marshal(obj)
	if err != nil {
		return raw
	}
	return out
}

// EditMeta is EditObject that hands edit the members of the object's
// _meta too (none where it has no _meta, or a null one), and puts them
// back as its _meta, which is dropped when edit leaves it empty. It
// returns raw as it is where _meta is not an object.
func EditMeta(raw json.RawMessage, edit func(obj, meta map[string]json.RawMessage) bool) json.RawMessage {
	return EditObject(raw, func(obj map[string]json.RawMessage) bool {
		var meta map[string]json.RawMessage
		if m, ok := obj["_meta"]; ok && json.Unmarshal(m, &meta) != nil {
			return false
		}
		if meta == nil {
			meta = map[string]json.RawMessage{}
		}
		if !edit(obj, meta) {
			return false
		}
		if len(meta) == 0 {
			delete(obj, "_meta")
			return true
		}
		b, err := json.Marshal(meta)
		obj["_meta"] = b
		return err == nil
	})
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
