package downstream

import (
	"context"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The SDK's server sends notifications/…/list_changed to its sessions
// when its own tools, prompts or resources change, and offers no other
// way to send them. The gateway answers every list request from the
// upstream, so its server's own lists are never shown: adding and
// removing a placeholder is how it relays an upstream's list_changed to
// every session.
const (
	placeholderName = "ledger-mcp.list-changed"
	placeholderURI  = "ledger-mcp:list-changed"
)

var errPlaceholder = errors.New("not a tool of the upstream server")

// ListChanged relays the upstream's list_changed of one list and, for
// tools, drops the annotations the gateway decides by.
func (g *Server) ListChanged(list string) {
	switch list {
	case "tools":
		g.tools.Invalidate()
		g.server.AddTool(&mcp.Tool{Name: placeholderName, InputSchema: map[string]any{"type": "object"}},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) { return nil, errPlaceholder })
		g.server.RemoveTools(placeholderName)
	case "prompts":
		g.server.AddPrompt(&mcp.Prompt{Name: placeholderName},
			func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) { return nil, errPlaceholder })
		g.server.RemovePrompts(placeholderName)
	case "resources":
		g.server.AddResource(&mcp.Resource{Name: placeholderName, URI: placeholderURI},
			func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
				return nil, errPlaceholder
			})
		g.server.RemoveResources(placeholderURI)
	}
}
