//lint:file-ignore SA1019 sampling, roots and logging are deprecated (SEP-2577), not gone: a client that has them is relayed them

package mcpgate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
)

// An upstream that negotiated a revision before 2026-07-28 asks its
// client with server→client requests (elicitation/create,
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

// maxPeerCalls bounds the calls one downstream session has in flight
// upstream at once (and so its upstream sessions): more wait.
const maxPeerCalls = 16

// peer is a downstream session's own upstream sessions; or, without a
// session (ss nil), a parking peer's (park.go): its client's
// capabilities and info are caps and impl.
type peer struct {
	g     *Gateway
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
	busy   map[*mcp.ClientSession]*route // the calls in flight, by session
	// ended are busy sessions whose connection ended: not kept for the
	// next call.
	ended map[*mcp.ClientSession]bool
	// broken reports, of each session, whether its connection failed
	// (Upstream.connect): such a session, still shutting down, is not
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

// route is one call in flight on a peer: where its server→client
// requests go, and what became of them.
type route struct {
	ctx context.Context // the downstream request's: over HTTP the request goes on its stream
	// answered counts the requests the client answered; missing is the
	// first request that could not be forwarded, and first whether it
	// came before any was answered (the upstream cannot have acted on an
	// answer yet).
	answered int
	missing  error
	first    bool
	park     *parkedCall // a parked call's (park.go)
	// watch is the call's upstream timeout (sendBounded), held while a
	// request of the upstream waits for the client.
	watch atomic.Pointer[watchdog]
}

// usesPeer reports whether a call of a client of revision version on ss
// goes on a session of its own.
func (g *Gateway) usesPeer(ss *mcp.ServerSession, version string) bool {
	if ss == nil || statelessRevision(version) {
		return false
	}
	s, err := g.up.Session(context.Background())
	if err != nil {
		return false
	}
	ir := s.InitializeResult()
	return ir != nil && !statelessRevision(ir.ProtocolVersion)
}

// sessionFor returns the upstream session a request of a client of
// revision version goes on: the client's own for an older revision (an
// upstream may offer tools by the client's capabilities), else the
// shared one.
func (g *Gateway) sessionFor(req mcp.Request, version string) func(context.Context) (*mcp.ClientSession, error) {
	if ss, ok := req.GetSession().(*mcp.ServerSession); ok && g.usesPeer(ss, version) {
		return g.peerOf(ss).session
	}
	return g.up.Session
}

// initialized takes, for a client whose session is now initialized, the
// shared session as its own when the shared session speaks for it
// (UpstreamOptions.Client): from now on what the upstream asks there
// goes to the client.
func (g *Gateway) initialized(_ context.Context, req *mcp.InitializedRequest) {
	if g.up.speaksFor == nil {
		return
	}
	if g.usesPeer(req.Session, "") {
		g.peerOf(req.Session)
		return
	}
	g.up.adopt(nil)
}

// peerOf returns ss's peer, made on first use and closed with ss.
func (g *Gateway) peerOf(ss *mcp.ServerSession) *peer {
	g.peersMu.Lock()
	defer g.peersMu.Unlock()
	if p, ok := g.peers[ss]; ok {
		return p
	}
	p := &peer{g: g, ss: ss, slots: make(chan struct{}, maxPeerCalls), busy: map[*mcp.ClientSession]*route{}}
	p.shared = g.up.adopt(p)
	g.peers[ss] = p
	go func() {
		_ = ss.Wait()
		g.peersMu.Lock()
		delete(g.peers, ss)
		g.peersMu.Unlock()
		p.close()
	}()
	return p
}

// session returns the peer's first upstream session, connecting when
// there is none (a stdio upstream: one more process).
func (p *peer) session(ctx context.Context) (*mcp.ClientSession, error) {
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
func (p *peer) sharedSession(ctx context.Context) (*mcp.ClientSession, error) {
	cs, broken, err := p.g.up.sessionOf(ctx)
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
func (p *peer) dropBroken() {
	gone := func(cs *mcp.ClientSession) bool { f := p.broken[cs]; return f != nil && f() }
	if p.cs != nil && p.busy[p.cs] == nil && gone(p.cs) {
		p.g.logger.Warn("upstream connection failed: connecting again", "upstream", p.g.up.name)
		p.cs = nil
	}
	p.spare = slices.DeleteFunc(p.spare, gone)
}

// connect opens one more upstream session for the client. It holds no
// lock while it does: the upstream may ask on the new session at once.
func (p *peer) connect(ctx context.Context) (*mcp.ClientSession, error) {
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
	cs, broken, err := p.g.up.connect(cctx, c)
	if err != nil {
		return nil, err
	}
	p.track(cctx, cs, broken)
	return cs, nil
}

// track notes the peer's upstream session cs, whose connection has
// failed when broken says so, sets the client's logging level on it, and
// forgets it once it ends.
func (p *peer) track(ctx context.Context, cs *mcp.ClientSession, broken func() bool) {
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
func (p *peer) newClient() *mcp.Client {
	impl, down := p.impl, p.caps
	if p.ss != nil {
		impl, down = &mcp.Implementation{Name: "ledger-mcp", Version: p.g.cfg.Version}, p.clientCaps()
		if ip := p.ss.InitializeParams(); ip != nil && ip.ClientInfo != nil {
			impl = ip.ClientInfo
		}
	}
	c := mcp.NewClient(impl, &mcp.ClientOptions{
		Capabilities: relayable(down),
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			p.g.progress.deliver(r.Params)
		},
		LoggingMessageHandler: p.log,
		MultiRoundTrip:        &mcp.MultiRoundTripOptions{Disabled: true},
	})
	c.AddReceivingMiddleware(p.answerUpstream)
	for _, m := range tasks.Methods { // a task made on a session is polled on it (tasks.go)
		_ = mcp.AddSendingCustomMethod[*tasks.Params, *tasks.Result](c, m)
	}
	return c
}

// acquire gives a call an upstream session of its own, for as long as
// it runs: the first session if it is free, else a spare one, else a
// new one. done gives it back.
func (p *peer) acquire(ctx context.Context) (cs *mcp.ClientSession, r *route, done func(), err error) {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, nil, ctx.Err()
	}
	r = &route{ctx: ctx}
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

// take finds or opens the free session of acquire and marks it r's.
func (p *peer) take(ctx context.Context, r *route) (*mcp.ClientSession, error) {
	if _, err := p.session(ctx); err != nil {
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
func (p *peer) routeOf(cs *mcp.ClientSession) *route {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.busy[cs]
}

// relayLogLevel passes a logging/setLevel of a client of an older
// revision on to its upstream session, which then logs at that level;
// the SDK answers the client.
func (g *Gateway) relayLogLevel(ctx context.Context, req mcp.Request, version string) error {
	p, ok := req.GetParams().(*mcp.SetLoggingLevelParams)
	ss, _ := req.GetSession().(*mcp.ServerSession)
	if !ok || !g.usesPeer(ss, version) {
		return nil
	}
	return g.peerOf(ss).setLevel(ctx, p.Level)
}

// setLevel passes the client's logging level to its upstream sessions.
func (p *peer) setLevel(ctx context.Context, level mcp.LoggingLevel) error {
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
func (p *peer) sessions() []*mcp.ClientSession {
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

func (p *peer) close() {
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

// answerUpstream is the receiving middleware of a peer's upstream
// client: the upstream's elicitation/create, sampling/createMessage and
// roots/list go to the downstream client, and its answer, a decline as
// much as an acceptance, goes back. The gateway answers none of them
// itself; one the client lacks the capability for is refused.
func (p *peer) answerUpstream(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "elicitation/create", "sampling/createMessage", "roots/list":
		default:
			return next(ctx, method, req)
		}
		cs, _ := req.GetSession().(*mcp.ClientSession)
		r := p.routeOf(cs)
		if p.ss == nil {
			return p.parkedAnswer(ctx, r, method, req)
		}
		dctx := ctx
		if r != nil {
			dctx = r.ctx
			w := r.watch.Load()
			w.hold()
			defer w.release()
		}
		caps := p.clientCaps()
		var (
			res     mcp.Result
			err     error
			missing string
		)
		switch params := req.GetParams().(type) {
		case *mcp.ElicitParams:
			if caps.Elicitation == nil {
				missing = "elicitation"
				break
			}
			res, err = p.ss.Elicit(dctx, params)
		case *mcp.CreateMessageWithToolsParams:
			if caps.Sampling == nil {
				missing = "sampling"
				break
			}
			res, err = p.ss.CreateMessageWithTools(dctx, params)
		case *mcp.ListRootsParams:
			if !hasRoots(caps) {
				missing = "roots"
				break
			}
			res, err = p.ss.ListRoots(dctx, params)
		default:
			missing = method
		}
		if missing != "" {
			return nil, p.refuseMissing(ctx, r, method, missing)
		}
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		if r != nil {
			r.answered++
		}
		p.mu.Unlock()
		return res, nil
	}
}

// refuseMissing refuses an upstream request for method that the client
// lacks the capability missing for: logged, marked on r, and answered
// method not found.
func (p *peer) refuseMissing(ctx context.Context, r *route, method, missing string) error {
	p.g.logger.InfoContext(ctx, "upstream request not forwarded: the client lacks the capability", "method", method)
	p.markMissing(r, fmt.Errorf("%w: %s", errCapabilityMissing, missing))
	return &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "client does not support " + missing}
}

// markMissing notes on r a request its client could not answer.
func (p *peer) markMissing(r *route, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r != nil && r.missing == nil {
		r.missing, r.first = err, r.answered == 0
	}
}

// clientCaps are the capabilities of the peer's client.
func (p *peer) clientCaps() *mcp.ClientCapabilities {
	if p.ss == nil {
		return p.caps
	}
	if ip := p.ss.InitializeParams(); ip != nil && ip.Capabilities != nil {
		return ip.Capabilities
	}
	return &mcp.ClientCapabilities{}
}

// log passes an upstream log message on to the client (a parking peer's
// clients take none: they are sent no requests of the server).
func (p *peer) log(ctx context.Context, req *mcp.LoggingMessageRequest) {
	if p.ss == nil {
		return
	}
	dctx := context.WithoutCancel(ctx)
	if r := p.routeOf(req.Session); r != nil {
		dctx = context.WithoutCancel(r.ctx)
	}
	_ = p.ss.Log(dctx, req.Params)
}

// relayable is what the gateway advertises upstream for a client with
// capabilities c: the capabilities it can relay the requests of, and no
// other (never the SDK's default roots).
func relayable(c *mcp.ClientCapabilities) *mcp.ClientCapabilities {
	out := &mcp.ClientCapabilities{}
	if c == nil {
		return out
	}
	out.Elicitation, out.Sampling = c.Elicitation, c.Sampling
	if hasRoots(c) {
		rc := &mcp.RootCapabilities{ListChanged: c.Roots.ListChanged}
		if c.RootsV2 != nil {
			rc.ListChanged = c.RootsV2.ListChanged
		}
		out.RootsV2 = rc
	}
	return out
}

// missingCapability tells the upstream's answer of a call apart when the
// client lacked a capability the upstream needed: a request that could
// not be forwarded, or (an SDK server checks elicitation before sending)
// an error that says the client does not support it. first: nothing had
// been answered before, so the upstream cannot have acted.
func missingCapability(p *peer, r *route, v verdict) (first bool, err error) {
	if r == nil || !v.known || v.outcome.Succeeded || v.inputRequired {
		return false, nil
	}
	p.mu.Lock()
	missing, first, answered := r.missing, r.first, r.answered
	p.mu.Unlock()
	if missing != nil {
		return first, missing
	}
	caps := p.clientCaps()
	msg := v.outcome.ErrorMessage
	if caps.Elicitation == nil && strings.Contains(msg, "does not support elicitation") {
		return answered == 0, fmt.Errorf("%w: elicitation", errCapabilityMissing)
	}
	return false, nil
}

// sameCapabilities reports whether a and b advertise the same
// capabilities upstream.
func sameCapabilities(a, b *mcp.ClientCapabilities) bool {
	ja, err1 := json.Marshal(wireCapabilities(a))
	jb, err2 := json.Marshal(wireCapabilities(b))
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}
