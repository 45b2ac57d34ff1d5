//lint:file-ignore SA1019 roots are deprecated (SEP-2577), not gone: a client that has them is relayed them

package serverreq

import (
	"context"
	"encoding/json"
	"reflect"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// DescribeClient makes the per-request _meta of a forwarded request
// (SEP-2575) describe the downstream client, for the revision the
// upstream negotiated (SPEC §11.1): an upstream before 2026-07-28 gets
// none of it (its session's initialize said who the client is); a
// 2026-07-28 upstream gets its own version and the client's info and
// capabilities, from the request or from the client's session, never
// the gateway's.
func (ps *Peers) DescribeClient(ctx context.Context, req mcp.Request) error {
	p := req.GetParams()
	if p == nil || reflect.ValueOf(p).IsNil() {
		return nil
	}
	s, err := ps.up.Session(ctx)
	if err != nil {
		return err
	}
	upVersion := ""
	if ir := s.InitializeResult(); ir != nil {
		upVersion = ir.ProtocolVersion
	}
	meta := p.GetMeta()
	if !wire.Stateless(upVersion) {
		if meta == nil {
			return nil
		}
		for _, k := range []string{mcp.MetaKeyProtocolVersion, mcp.MetaKeyClientInfo, mcp.MetaKeyClientCapabilities} {
			delete(meta, k)
		}
		p.SetMeta(meta)
		return nil
	}
	out := map[string]any{}
	for k, v := range meta {
		out[k] = v
	}
	out[mcp.MetaKeyProtocolVersion] = upVersion
	var ip *mcp.InitializeParams
	if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
		ip = ss.InitializeParams()
	}
	if _, ok := out[mcp.MetaKeyClientInfo]; !ok && ip != nil && ip.ClientInfo != nil {
		out[mcp.MetaKeyClientInfo] = ip.ClientInfo
	}
	caps, ok := out[mcp.MetaKeyClientCapabilities]
	if !ok && ip != nil {
		caps = WireCapabilities(ip.Capabilities)
	}
	if caps == nil {
		caps = map[string]any{}
	}
	// The client's capabilities as they are, the tasks extension
	// included: the gateway forwards its tasks (package tasks).
	out[mcp.MetaKeyClientCapabilities] = caps
	p.SetMeta(out)
	return nil
}

// WireCapabilities is a session's client capabilities in the form of
// 2026-07-28's _meta: roots only if the client declared them.
func WireCapabilities(c *mcp.ClientCapabilities) map[string]any {
	out := map[string]any{}
	if c == nil {
		return out
	}
	b, err := json.Marshal(c)
	if err == nil {
		_ = json.Unmarshal(b, &out)
	}
	// The SDK decodes a client's roots capability into a struct that
	// cannot say it was absent: only a listChanged one is known to exist.
	delete(out, "roots")
	switch {
	case c.RootsV2 != nil:
		out["roots"] = c.RootsV2
	case c.Roots.ListChanged:
		out["roots"] = map[string]any{"listChanged": true}
	}
	return out
}
