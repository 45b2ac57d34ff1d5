package mcpgate

import (
	"context"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// toolCache holds the upstream's tools by name, for their annotations.
// It is refreshed when a call names a tool it does not hold, after a
// list_changed notification and after the upstream connects again.
type toolCache struct {
	mu    sync.Mutex
	tools map[string]*mcp.Tool
	stale bool
}

func newToolCache() *toolCache { return &toolCache{tools: map[string]*mcp.Tool{}, stale: true} }

func (c *toolCache) invalidate() {
	c.mu.Lock()
	c.stale = true
	c.mu.Unlock()
}

// merge adds tools seen in a tools/list answer.
func (c *toolCache) merge(tools []*mcp.Tool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range tools {
		if t != nil {
			c.tools[t.Name] = t
		}
	}
}

// lookup returns the named tool, listing the upstream's tools first when
// the cache is stale or does not hold it. A tool the upstream does not
// list comes back nil.
func (c *toolCache) lookup(ctx context.Context, s *mcp.ClientSession, name string) (*mcp.Tool, error) {
	c.mu.Lock()
	t, ok := c.tools[name]
	stale := c.stale
	c.mu.Unlock()
	if ok && !stale {
		return t, nil
	}
	fresh := map[string]*mcp.Tool{}
	for tool, err := range s.Tools(ctx, nil) {
		if err != nil {
			return nil, err
		}
		fresh[tool.Name] = tool
	}
	c.mu.Lock()
	c.tools, c.stale = fresh, false
	c.mu.Unlock()
	return fresh[name], nil
}
