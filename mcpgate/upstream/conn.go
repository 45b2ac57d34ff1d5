package upstream

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// rawTransport keeps raw results on a stream transport's connection
// (stdio). A Streamable HTTP connection is not wrapped, since the SDK
// relies on methods of its own connection type: http.go reads the
// results off the HTTP responses instead. broken is set once the
// connection's read or write failed (an answer over the frame limit, a
// server gone): the SDK's session then refuses every request ("client is
// closing") until it has shut down, so the Upstream makes a new one at
// once (Connect).
type rawTransport struct {
	mcp.Transport
	broken *atomic.Bool
}

func (t rawTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &rawConn{Connection: c, pending: map[jsonrpc.ID]*wire.Slot{}, inits: map[jsonrpc.ID]bool{},
		sent: map[jsonrpc.ID]bool{}, broken: t.broken}, nil
}

type rawConn struct {
	mcp.Connection
	mu      sync.Mutex
	pending map[jsonrpc.ID]*wire.Slot
	inits   map[jsonrpc.ID]bool // initialize requests awaiting their answer
	sent    map[jsonrpc.ID]bool // every request awaiting its answer
	broken  *atomic.Bool
}

func (c *rawConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if req, ok := msg.(*jsonrpc.Request); ok {
		switch req.Method {
		case "tools/call":
			if p := tasks.UnliftParams(req.Params); !bytes.Equal(p, req.Params) {
				r := *req
				r.Params = p
				msg = &r
			}
		case "initialize":
			c.mu.Lock()
			c.inits[req.ID] = true
			c.mu.Unlock()
		}
	}
	if req, ok := msg.(*jsonrpc.Request); ok && req.ID.IsValid() {
		c.mu.Lock()
		if s, ok := wire.SlotOf(ctx); ok {
			c.pending[req.ID] = s
			s.MarkWritten()
		}
		c.sent[req.ID] = true
		c.mu.Unlock()
	}
	err := c.Connection.Write(ctx, msg)
	if err != nil {
		if req, ok := msg.(*jsonrpc.Request); ok {
			c.mu.Lock()
			delete(c.pending, req.ID)
			delete(c.sent, req.ID)
			c.mu.Unlock()
		}
		if ctx.Err() == nil {
			c.broken.Store(true)
		}
	}
	return err
}

func (c *rawConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err != nil {
		c.broken.Store(true)
	}
	if res, ok := msg.(*jsonrpc.Response); ok && err == nil {
		c.mu.Lock()
		s := c.pending[res.ID]
		delete(c.pending, res.ID)
		init := c.inits[res.ID]
		delete(c.inits, res.ID)
		if !c.sent[res.ID] {
			c.stray(res.ID)
		}
		delete(c.sent, res.ID)
		c.mu.Unlock()
		if init && res.Error == nil {
			res.Result = tasks.Stash(res.Result)
		}
		if s != nil {
			s.Put(res.Result, wireError(res.Error))
		}
	}
	return msg, err
}

// stray notes on every request awaiting its answer an answer whose id
// matches no request sent (the SDK drops it). c.mu is held.
func (c *rawConn) stray(id jsonrpc.ID) {
	for _, s := range c.pending {
		s.Stray(id)
	}
}

// wireError is err as the JSON-RPC error object it came as, if it did.
func wireError(err error) *jsonrpc.Error {
	if err == nil {
		return nil
	}
	var w *jsonrpc.Error
	if errors.As(err, &w) {
		return w
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
}
