//lint:file-ignore SA1019 roots are deprecated (SEP-2577), not gone: a client that has them is relayed them

package serverreq

import (
	"bytes"
	"encoding/json"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ErrCapabilityMissing is a request the client cannot answer: it did not
// declare the capability.
var ErrCapabilityMissing = errors.New("the client lacks the capability")

// HasRoots reports whether a client declared roots, as far as the SDK
// lets a server tell (see WireCapabilities).
func HasRoots(c *mcp.ClientCapabilities) bool {
	_, ok := WireCapabilities(c)["roots"]
	return ok
}

// Relayable is what the gateway advertises upstream for a client with
// capabilities c: the capabilities it can relay the requests of, and no
// other (never the SDK's default roots).
func Relayable(c *mcp.ClientCapabilities) *mcp.ClientCapabilities {
	out := &mcp.ClientCapabilities{}
	if c == nil {
		return out
	}
	out.Elicitation, out.Sampling = c.Elicitation, c.Sampling
	if HasRoots(c) {
		rc := &mcp.RootCapabilities{ListChanged: c.Roots.ListChanged}
		if c.RootsV2 != nil {
			rc.ListChanged = c.RootsV2.ListChanged
		}
		out.RootsV2 = rc
	}
	return out
}

// SameCapabilities reports whether a and b advertise the same
// capabilities upstream.
func SameCapabilities(a, b *mcp.ClientCapabilities) bool {
	ja, err1 := json.Marshal(WireCapabilities(a))
	jb, err2 := json.Marshal(WireCapabilities(b))
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

// WireClientCapabilities reads a 2026-07-28 request's client
// capabilities (_meta) into the SDK's type: the ones the gateway relays.
func WireClientCapabilities(m map[string]any) *mcp.ClientCapabilities {
	out := &mcp.ClientCapabilities{}
	decode := func(v any, dst any) bool {
		b, err := json.Marshal(v)
		return err == nil && json.Unmarshal(b, dst) == nil
	}
	if v, ok := m["elicitation"]; ok {
		e := &mcp.ElicitationCapabilities{}
		if decode(v, e) {
			out.Elicitation = e
		}
	}
	if v, ok := m["sampling"]; ok {
		s := &mcp.SamplingCapabilities{}
		if decode(v, s) {
			out.Sampling = s
		}
	}
	if v, ok := m["roots"]; ok {
		rc := &mcp.RootCapabilities{}
		if decode(v, rc) {
			out.RootsV2 = rc
		}
	}
	return out
}
