package downstream

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A client may cancel a request with notifications/cancelled. The
// gateway lets a tools/call it has already forwarded run to its answer,
// and records it (call.go), but MCP says a cancelled request gets no
// response: cancelTransport drops the responses to requests its client
// cancelled. The SDK would send them, since the handler still returns.

// cancelTransport wraps a downstream transport.
type cancelTransport struct{ mcp.Transport }

func (t cancelTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &cancelConn{Connection: c, inFlight: map[jsonrpc.ID]bool{}}, nil
}

// cancelConn tracks the client's requests in flight, each with whether
// the client cancelled it, so only the response to a request cancelled
// while in flight is dropped (an id the client reuses later is answered).
type cancelConn struct {
	mcp.Connection
	mu       sync.Mutex
	inFlight map[jsonrpc.ID]bool // id → cancelled
}

func (c *cancelConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	req, ok := msg.(*jsonrpc.Request)
	if !ok || err != nil {
		return msg, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case req.ID.IsValid():
		c.inFlight[req.ID] = false
	case req.Method == "notifications/cancelled":
		var p struct {
			RequestID any `json:"requestId"`
		}
		if json.Unmarshal(req.Params, &p) != nil {
			break
		}
		if id, ierr := jsonrpc.MakeID(p.RequestID); ierr == nil {
			if _, ok := c.inFlight[id]; ok {
				c.inFlight[id] = true
			}
		}
	}
	return msg, err
}

func (c *cancelConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if res, ok := msg.(*jsonrpc.Response); ok {
		c.mu.Lock()
		drop := c.inFlight[res.ID]
		delete(c.inFlight, res.ID)
		c.mu.Unlock()
		if drop {
			return nil
		}
	}
	return c.Connection.Write(ctx, msg)
}
