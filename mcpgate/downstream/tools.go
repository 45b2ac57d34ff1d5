package downstream

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
)

// Tools holds the upstream's tools by name, for their annotations.
// It is refreshed when a call names a tool it does not hold, after a
// list_changed notification and after the upstream connects again.
type Tools struct {
	mu    sync.Mutex
	tools map[string]*mcp.Tool
	stale bool
}

// NewTools returns a cache to fill.
func NewTools() *Tools { return &Tools{tools: map[string]*mcp.Tool{}, stale: true} }

// Invalidate has the next lookup list the upstream's tools again.
func (c *Tools) Invalidate() {
	c.mu.Lock()
	c.stale = true
	c.mu.Unlock()
}

// Merge adds tools seen in a tools/list answer.
func (c *Tools) Merge(tools []*mcp.Tool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range tools {
		if t != nil {
			c.tools[t.Name] = t
		}
	}
}

// Lookup returns the named tool, listing the upstream's tools first when
// the cache is stale or does not hold it. A tool the upstream does not
// list comes back nil.
func (c *Tools) Lookup(ctx context.Context, s *mcp.ClientSession, name string) (*mcp.Tool, error) {
	c.mu.Lock()
	t, ok := c.tools[name]
	stale := c.stale
	c.mu.Unlock()
	if ok && !stale {
		return t, nil
	}
	fresh, err := listTools(ctx, s)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.tools, c.stale = fresh, false
	c.mu.Unlock()
	return fresh[name], nil
}

// Bounds of listing an upstream's tools for a call: an upstream that
// hands back a cursor it already gave (or pages without end) must not
// hold the call, or a CPU, forever.
const (
	listToolsTimeout = 30 * time.Second
	maxToolPages     = 1000
)

// listTools pages through the upstream's tools/list.
func listTools(ctx context.Context, s *mcp.ClientSession) (map[string]*mcp.Tool, error) {
	ctx, cancel := context.WithTimeout(ctx, listToolsTimeout)
	defer cancel()
	tools := map[string]*mcp.Tool{}
	seen := map[string]bool{}
	params := &mcp.ListToolsParams{}
	for page := 1; ; page++ {
		res, err := s.ListTools(ctx, params)
		if err != nil {
			return nil, err
		}
		for _, t := range res.Tools {
			if t != nil {
				tools[t.Name] = t
			}
		}
		switch {
		case res.NextCursor == "":
			return tools, nil
		case seen[res.NextCursor]:
			return nil, fmt.Errorf("tools/list: the upstream repeated the cursor %q: its list never ends", ledgerport.Truncate(res.NextCursor, 64))
		case page == maxToolPages:
			return nil, fmt.Errorf("tools/list: more than %d pages", maxToolPages)
		}
		seen[res.NextCursor] = true
		params = &mcp.ListToolsParams{Cursor: res.NextCursor}
	}
}
