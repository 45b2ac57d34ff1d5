package mcpgate

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/serverreq"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// caller is what the gateway knows of the client that made a call.
type caller struct {
	name       string // clientInfo.name, as the ledger records it
	elicitForm bool   // it takes form elicitations
	elicitURL  bool   // it takes URL elicitations (MCP 2025-11-25)
	// caps: a 2026-07-28 client's capabilities, from its request's _meta
	// (for a parked call, park.go).
	caps *mcp.ClientCapabilities
}

// describeCaller reads the calling client's name and whether it takes
// form elicitations: from a 2026-07-28 request's _meta, else from its
// session's initialize. It runs before DescribeClient rewrites _meta.
func describeCaller(req mcp.Request, version string) caller {
	var name string
	var caps map[string]any
	if wire.Stateless(version) {
		if p := req.GetParams(); p != nil {
			meta := p.GetMeta()
			name = jsonField(meta[mcp.MetaKeyClientInfo], "name")
			caps, _ = wire.AsMap(meta[mcp.MetaKeyClientCapabilities])
		}
	} else if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss.InitializeParams() != nil {
		ip := ss.InitializeParams()
		if ip.ClientInfo != nil {
			name = ip.ClientInfo.Name
		}
		caps = serverreq.WireCapabilities(ip.Capabilities)
	}
	c := caller{name: clientName(name)}
	if wire.Stateless(version) {
		c.caps = serverreq.WireClientCapabilities(caps)
	}
	if e, ok := wire.AsMap(caps["elicitation"]); ok {
		_, form := e["form"]
		_, url := e["url"]
		c.elicitForm = form || !url // an empty elicitation capability is form's
		c.elicitURL = url
	}
	return c
}

// jsonField is the string member name of a JSON object v.
func jsonField(v any, name string) string {
	m, _ := wire.AsMap(v)
	s, _ := m[name].(string)
	return s
}

// clientName is a client's name as the ledger takes it in an actor: 1–128
// visible ASCII bytes, others replaced with '_'; "unknown" for none.
func clientName(name string) string {
	b := []byte(name)
	for i := range b {
		if b[i] < 0x21 || b[i] > 0x7E {
			b[i] = '_'
		}
	}
	if len(b) > 128 {
		b = b[:128]
	}
	if len(b) == 0 {
		return "unknown"
	}
	return string(b)
}
