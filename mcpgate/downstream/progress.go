package downstream

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Progress carries the upstream's progress notifications of a
// forwarded tools/call back to the session that made the call. Each
// forwarded call gets a token of the gateway's own, because two sessions
// may well both use progress token 1.
type Progress struct {
	mu     sync.Mutex
	next   uint64
	routes map[string]progressRoute
}

type progressRoute struct {
	ctx   context.Context // the downstream request's, so the notification goes with it
	ss    *mcp.ServerSession
	token any // the client's own token
}

// NewProgress returns no routes yet.
func NewProgress() *Progress { return &Progress{routes: map[string]progressRoute{}} }

// Open returns the _meta to forward: meta (the client's as it goes
// upstream, a copy of its own), with its progress token replaced by one
// that routes back to ss. release forgets the route once the call has
// been answered.
func (p *Progress) Open(ctx context.Context, ss *mcp.ServerSession, meta mcp.Meta) (mcp.Meta, func()) {
	token, ok := meta["progressToken"]
	if !ok || token == nil || ss == nil {
		return meta, func() {}
	}
	p.mu.Lock()
	p.next++
	id := "ledger-mcp-" + strconv.FormatUint(p.next, 10)
	p.routes[id] = progressRoute{ctx: ctx, ss: ss, token: token}
	p.mu.Unlock()
	meta["progressToken"] = id
	return meta, func() {
		// The SDK hands notifications to their handler apart from
		// responses, so the last ones may be delivered after the call's
		// answer: the route stays a little longer.
		time.AfterFunc(progressGrace, func() {
			p.mu.Lock()
			delete(p.routes, id)
			p.mu.Unlock()
		})
	}
}

// progressGrace is how long a route outlives its call.
const progressGrace = 2 * time.Second

// Deliver passes one upstream progress notification on, with the
// client's own token; a notification for no open call is dropped.
func (p *Progress) Deliver(params *mcp.ProgressNotificationParams) {
	id, ok := params.ProgressToken.(string)
	if !ok {
		return
	}
	p.mu.Lock()
	r, ok := p.routes[id]
	p.mu.Unlock()
	if !ok {
		return
	}
	out := *params
	out.ProgressToken = r.token
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 5*time.Second)
	defer cancel()
	_ = r.ss.NotifyProgress(ctx, &out)
}
