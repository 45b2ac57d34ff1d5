package mcpgate

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/serverreq"
)

// Requests from the server (SPEC §11.1: an older upstream's elicitation,
// sampling and roots during a call, forwarded to the call's client) are
// the extension in package serverreq; this file gives it the gateway's
// upstream connection (serverreq.Upstream). The call's path reaches it
// in callTool (the call's own upstream session and route) and in finish
// (serverreq.MissingCapability).

// upstreamHost is the Upstream as the server requests extension reaches
// it.
type upstreamHost struct{ u *Upstream }

func (h upstreamHost) Session(ctx context.Context) (*mcp.ClientSession, error) {
	return h.u.Session(ctx)
}

func (h upstreamHost) Shared(ctx context.Context) (*mcp.ClientSession, func() bool, error) {
	return h.u.sessionOf(ctx)
}

func (h upstreamHost) Connect(ctx context.Context, c *mcp.Client) (*mcp.ClientSession, func() bool, error) {
	return h.u.connect(ctx, c)
}

func (h upstreamHost) Adopt(p *serverreq.Peer) bool { return h.u.adopt(p) }
