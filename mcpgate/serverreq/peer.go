//lint:file-ignore SA1019 sampling, roots and logging are deprecated (SEP-2577), not gone: a client that has them is relayed them

// Package serverreq is the MCP gateway's extension for requests from
// the server (SPEC §11.1). An upstream that negotiated a revision before
// 2026-07-28 asks its client with server→client requests (elicitation/create,
// sampling/createMessage, roots/list) while a call runs, and nothing in
// them names the call. So each downstream session of such a revision
// gets upstream sessions of its own (SPEC §11.1), with the capabilities
// and client info of that client alone advertised upstream, and each
// call in flight holds one of them alone: whatever the upstream asks on
// it belongs to that call and is forwarded to its client (over HTTP, on
// the call's own stream). One call at a time uses the peer's first
// session; calls at once open more, up to maxPeerCalls, kept for the
// next ones. The shared session stays for the tool cache and
// list_changed; over stdio it speaks for the one client and is its
// peer's first session (peer.shared), so the upstream starts once.
//
// The extension keeps its own state (Peers: the downstream sessions'
// peers and what it needs of the gateway's upstream) and reaches the
// gateway's connection through Upstream, four methods. A call's route
// (Route) says what became of the requests asked on it; a parked call
// (the rounds extension) answers them through Asker.
package serverreq

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
)

// maxPeerCalls bounds the calls one downstream session has in flight
// upstream at once (and so its upstream sessions): more wait.
const maxPeerCalls = 16

// Peer is a downstream session's own upstream sessions; or, without a
// session (ss nil), a parking peer's (NewParking): its client's
// capabilities and info are caps and impl.
type Peer struct {
	ps    *Peers
	ss    *mcp.ServerSession
	caps  *mcp.ClientCapabilities
	impl  *mcp.Implementation
	slots chan struct{} // one per call in flight

	// first makes the first session one at a time: requests that come
	// together (a tools/list and a call) start one upstream, not one each.
	first  sync.Mutex
	mu     sync.Mutex
	client *mcp.Client
	cs     *mcp.ClientSession // the first: lists, tasks, and a call
	spare  []*mcp.ClientSession
	busy   map[*mcp.ClientSession]*Route // the calls in flight, by session
	// ended are busy sessions whose connection ended: not kept for the
	// next call.
	ended map[*mcp.ClientSession]bool
	// broken reports, of each session, whether its connection failed
	// (Upstream.Connect): such a session, still shutting down, is not
	// used again.
	broken map[*mcp.ClientSession]func() bool
	// maxSpare bounds the idle sessions kept (0: as many as were opened,
	// at most maxPeerCalls).
	maxSpare int
	level    mcp.LoggingLevel // the client's logging level, for a new upstream session
	closed   bool
	// shared: the first session is the Upstream's shared one, which
	// speaks for this client (a stdio gateway's one client,
	// UpstreamOptions.Client): its upstream is started once.
	shared bool
}

// Route is one call in flight on a peer: where its server→client
// requests go, and what became of them.
type Route struct {
	ctx context.Context // the downstream request's: over HTTP the request goes on its stream
	// answered counts the requests the client answered; missing is the
	// first request that could not be forwarded, and first whether it
	// came before any was answered (the upstream cannot have acted on an
	// answer yet).
	answered int
	missing  error
	first    bool
	// Park answers the requests of a parked call (a parking peer's).
	Park Asker
	// watch is the call's upstream timeout (Watch), held while a request
	// of the upstream waits for the client.
	watch atomic.Pointer[Watchdog]
}

// Session returns the peer's first upstream session, connecting when
// there is none (a stdio upstream: one more process).
func (p *Peer) Session(ctx context.Context) (*mcp.ClientSession, error) {
	p.first.Lock()
	defer p.first.Unlock()
	if p.shared {
		return p.sharedSession(ctx)
	}
	p.mu.Lock()
	p.dropBroken()
	cs, closed := p.cs, p.closed
	p.mu.Unlock()
	switch {
	case closed:
		return nil, errPeerClosed
	case cs != nil:
		return cs, nil
	}
	cs, err := p.connect(ctx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		_ = cs.Close()
		return nil, errPeerClosed
	case p.cs == nil:
		p.cs = cs
	default:
		p.spare = append(p.spare, cs) // another call connected first
	}
	return p.cs, nil
}

var errPeerClosed = errors.New("upstream: the client's session ended")

// sharedSession makes the Upstream's shared session, connected again
// after it ended, the peer's first.
func (p *Peer) sharedSession(ctx context.Context) (*mcp.ClientSession, error) {
	cs, broken, err := p.ps.up.Shared(ctx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	closed, known := p.closed, p.broken[cs] != nil
	if !closed {
		p.cs = cs
	}
	p.mu.Unlock()
	if closed {
		return nil, errPeerClosed
	}
	if !known {
		p.track(ctx, cs, broken)
	}
	return cs, nil
}

// dropBroken forgets the idle sessions whose connection failed, so that
// the next call connects again. p.mu is held.
func (p *Peer) dropBroken() {
	gone := func(cs *mcp.ClientSession) bool { f := p.broken[cs]; return f != nil && f() }
	if p.cs != nil && p.busy[p.cs] == nil && gone(p.cs) {
		p.ps.logger.Warn("upstream connection failed: connecting again", "upstream", p.ps.cfg.Name)
		p.cs = nil
	}
	p.spare = slices.DeleteFunc(p.spare, gone)
}

// connect opens one more upstream session for the client. It holds no
// lock while it does: the upstream may ask on the new session at once.
func (p *Peer) connect(ctx context.Context) (*mcp.ClientSession, error) {
	p.mu.Lock()
	if p.client == nil {
		p.client = p.newClient()
	}
	c := p.client
	p.mu.Unlock()
	// A context of its own, cancelled with ctx: the downstream request's
	// carries its protocol revision, which the SDK's client would offer
	// the upstream instead of negotiating its own.
	cctx, cancel := context.WithCancel(context.Background())
	defer context.AfterFunc(ctx, cancel)()
	defer cancel()
	cs, broken, err := p.ps.up.Connect(cctx, c)
	if err != nil {
		return nil, err
	}
	p.track(cctx, cs, broken)
	return cs, nil
}

// track notes the peer's upstream session cs, whose connection has
// failed when broken says so, sets the client's logging level on it, and
// forgets it once it ends.
func (p *Peer) track(ctx context.Context, cs *mcp.ClientSession, broken func() bool) {
	p.mu.Lock()
	if p.broken == nil {
		p.broken = map[*mcp.ClientSession]func() bool{}
	}
	p.broken[cs] = broken
	level := p.level
	p.mu.Unlock()
	if level != "" {
		_ = cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: level})
	}
	go func() {
		_ = cs.Wait()
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.cs == cs {
			p.cs = nil
		}
		p.spare = slices.DeleteFunc(p.spare, func(x *mcp.ClientSession) bool { return x == cs })
		delete(p.broken, cs)
		if p.busy[cs] != nil {
			if p.ended == nil {
				p.ended = map[*mcp.ClientSession]bool{}
			}
			p.ended[cs] = true
		}
	}()
}

// newClient is the client of the peer's upstream sessions: the
// downstream client's info and the capabilities it can be relayed.
func (p *Peer) newClient() *mcp.Client {
	impl, down := p.impl, p.caps
	if p.ss != nil {
		impl, down = &mcp.Implementation{Name: "ledger-mcp", Version: p.ps.cfg.Version}, p.Caps()
		if ip := p.ss.InitializeParams(); ip != nil && ip.ClientInfo != nil {
			impl = ip.ClientInfo
		}
	}
	c := mcp.NewClient(impl, &mcp.ClientOptions{
		Capabilities: Relayable(down),
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			p.ps.cfg.Progress(r.Params)
		},
		LoggingMessageHandler: p.Log,
		MultiRoundTrip:        &mcp.MultiRoundTripOptions{Disabled: true},
	})
	c.AddReceivingMiddleware(p.AnswerUpstream)
	for _, m := range tasks.Methods { // a task made on a session is polled on it
		_ = mcp.AddSendingCustomMethod[*tasks.Params, *tasks.Result](c, m)
	}
	return c
}

// Acquire gives a call an upstream session of its own, for as long as
// it runs: the first session if it is free, else a spare one, else a
// new one. done gives it back.
func (p *Peer) Acquire(ctx context.Context) (cs *mcp.ClientSession, r *Route, done func(), err error) {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, nil, ctx.Err()
	}
	r = &Route{ctx: ctx}
	if cs, err = p.take(ctx, r); err != nil {
		<-p.slots
		return nil, nil, nil, err
	}
	return cs, r, func() {
		p.mu.Lock()
		delete(p.busy, cs)
		primary, ended := cs == p.cs, p.ended[cs]
		keep := !primary && !p.closed && !ended && (p.maxSpare == 0 || len(p.spare) < p.maxSpare)
		if keep {
			p.spare = append(p.spare, cs)
		}
		delete(p.ended, cs)
		p.mu.Unlock()
		if !keep && !primary && !ended {
			_ = cs.Close() // closed peer, or more idle sessions than kept
		}
		<-p.slots
	}, nil
}

// take finds or opens the free session of Acquire and marks it r's.
func (p *Peer) take(ctx context.Context, r *Route) (*mcp.ClientSession, error) {
	if _, err := p.Session(ctx); err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.dropBroken()
	var cs *mcp.ClientSession
	switch {
	case p.closed:
		p.mu.Unlock()
		return nil, errPeerClosed
	case p.cs != nil && p.busy[p.cs] == nil:
		cs = p.cs
	case len(p.spare) > 0:
		cs, p.spare = p.spare[len(p.spare)-1], p.spare[:len(p.spare)-1]
	}
	if cs != nil {
		p.busy[cs] = r
		p.mu.Unlock()
		return cs, nil
	}
	p.mu.Unlock()
	cs, err := p.connect(ctx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = cs.Close()
		return nil, errPeerClosed
	}
	p.busy[cs] = r
	return cs, nil
}

// routeOf is the call in flight on the upstream session cs, if any.
func (p *Peer) routeOf(cs *mcp.ClientSession) *Route {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.busy[cs]
}

// setLevel passes the client's logging level to its upstream sessions.
func (p *Peer) setLevel(ctx context.Context, level mcp.LoggingLevel) error {
	p.mu.Lock()
	p.level = level
	all := p.sessions()
	p.mu.Unlock()
	for _, cs := range all {
		if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: level}); err != nil {
			return err
		}
	}
	return nil
}

// sessions are the peer's upstream sessions; p.mu is held.
func (p *Peer) sessions() []*mcp.ClientSession {
	all := slices.Clone(p.spare)
	for cs := range p.busy {
		if cs != p.cs {
			all = append(all, cs)
		}
	}
	if p.cs != nil {
		all = append(all, p.cs)
	}
	return all
}

// Close ends the peer's upstream sessions, all but the shared one.
func (p *Peer) Close() {
	p.mu.Lock()
	all := p.sessions()
	shared := p.cs
	p.cs, p.spare, p.closed = nil, nil, true
	p.mu.Unlock()
	for _, cs := range all {
		if !p.shared || cs != shared { // the shared one is the Upstream's
			_ = cs.Close()
		}
	}
}
