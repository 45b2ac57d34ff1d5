package mcpgate

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/upstream"
)

// Upstream is the connection to the real MCP server (package upstream).
type Upstream = upstream.Upstream

// UpstreamOptions configures an Upstream.
type UpstreamOptions = upstream.Options

// DialCommand starts argv as an MCP server over stdio and initializes it.
// The error names the command when it cannot be started or does not
// answer initialize.
func DialCommand(ctx context.Context, argv []string, o UpstreamOptions) (*Upstream, error) {
	return upstream.DialCommand(ctx, argv, o)
}

// DialTransport connects to an MCP server over transports that
// newTransport makes, one for each connection (the first one now, another
// after one ends): a stream transport such as mcp.CommandTransport or
// mcp.InMemoryTransport. name names the server in messages.
func DialTransport(ctx context.Context, name string, newTransport func() mcp.Transport, o UpstreamOptions) (*Upstream, error) {
	return upstream.DialTransport(ctx, name, newTransport, o)
}

// DialURL reaches the MCP server at url over Streamable HTTP.
func DialURL(ctx context.Context, url string, o UpstreamOptions) (*Upstream, error) {
	return upstream.DialURL(ctx, url, o)
}
