// Package upstream is the MCP gateway's connection to the real MCP
// server: the shared session, made again after it ended, and sessions on
// new connections (package serverreq's). Its connections keep each
// answer as the upstream sent it, in the request's wire.Slot (conn.go for
// stdio and other stream transports, http.go for Streamable HTTP), with
// params.task put back where the upstream reads it and capabilities.tasks
// kept where the SDK keeps it (package tasks).
package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/serverreq"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// Upstream is the connection to the real MCP server, shared by every
// downstream session (a session of an older revision also gets one of its
// own for its calls, package serverreq; over stdio the shared one is the one
// client's own, Options.Client). A connection that ends (a stdio server that died,
// a Streamable HTTP session that broke) is made again on the next use.
type Upstream struct {
	name    string // the command line or URL, for messages
	newConn func() mcp.Transport
	client  *mcp.Client
	logger  *slog.Logger

	mu      sync.Mutex
	session *mcp.ClientSession
	broken  func() bool           // whether session's connection failed
	info    *mcp.InitializeResult // of the first connection
	closed  bool
	// others close the other connections made to the upstream (park.go),
	// on Close.
	others []func()
	// changed is called with "tools", "prompts" or "resources" when that
	// list of the upstream may have changed (a list_changed notification,
	// a new connection).
	changed func(list string)
	// progress receives the upstream's progress notifications.
	progress func(*mcp.ProgressNotificationParams)
	// speaksFor are the capabilities the shared session advertises for
	// the one client it speaks for (Options.Client), nil: none.
	// The peer of that client, owner, takes the shared session as its own
	// first session (package serverreq); adopted is closed once that is
	// decided, or on Close. waitOwner: the client initializes, and what
	// the upstream asks before waits for its session.
	speaksFor *mcp.ClientCapabilities
	waitOwner bool
	owner     *serverreq.Peer
	adopted   chan struct{}
	decided   bool
}

// Options configures an Upstream.
type Options struct {
	Logger *slog.Logger
	// Stderr receives a stdio server's standard error (default: discarded).
	Stderr io.Writer
	// HTTPClient reaches a Streamable HTTP server (default http.DefaultClient).
	HTTPClient *http.Client
	// Version is the gateway's version, sent in its clientInfo.
	Version string
	// Client is the one client a stdio gateway serves (PeekInitialize):
	// the shared connection then speaks for it — the capabilities the
	// gateway can relay (SPEC §11.1), and an older revision's clientInfo
	// — and is its own upstream session (a 2026-07-28 client's: its
	// parking peer's, park.go), so that the upstream is started once for
	// it. Nil: the shared connection advertises nothing.
	Client *mcp.InitializeParams
}

// DialCommand starts argv as an MCP server over stdio and initializes it.
// The error names the command when it cannot be started or does not
// answer initialize.
func DialCommand(ctx context.Context, argv []string, o Options) (*Upstream, error) {
	if len(argv) == 0 {
		return nil, errors.New("upstream: empty command")
	}
	return DialTransport(ctx, strings.Join(argv, " "), func() mcp.Transport {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stderr = o.Stderr
		return &mcp.CommandTransport{Command: cmd}
	}, o)
}

// DialTransport connects to an MCP server over transports that
// newTransport makes, one for each connection (the first one now, another
// after one ends): a stream transport such as mcp.CommandTransport or
// mcp.InMemoryTransport. name names the server in messages.
func DialTransport(ctx context.Context, name string, newTransport func() mcp.Transport, o Options) (*Upstream, error) {
	return dial(ctx, name, func() mcp.Transport {
		return rawTransport{Transport: newTransport(), broken: new(atomic.Bool)}
	}, o)
}

// DialURL reaches the MCP server at url over Streamable HTTP.
func DialURL(ctx context.Context, url string, o Options) (*Upstream, error) {
	hc := &http.Client{}
	if o.HTTPClient != nil {
		*hc = *o.HTTPClient
	}
	next := hc.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	hc.Transport = rawRoundTripper{next: next}
	newConn := func() mcp.Transport { return &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc} }
	return dial(ctx, url, newConn, o)
}

func dial(ctx context.Context, name string, newConn func() mcp.Transport, o Options) (*Upstream, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	u := &Upstream{name: name, newConn: newConn, logger: o.Logger, changed: func(string) {},
		progress: func(*mcp.ProgressNotificationParams) {}, adopted: make(chan struct{})}
	impl, caps := &mcp.Implementation{Name: "ledger-mcp", Version: o.Version}, &mcp.ClientCapabilities{}
	if o.Client != nil {
		caps = serverreq.Relayable(o.Client.Capabilities)
		u.speaksFor, u.waitOwner = caps, !wire.Stateless(o.Client.ProtocolVersion)
		if o.Client.ClientInfo != nil && u.waitOwner {
			impl = o.Client.ClientInfo
		}
	}
	u.client = mcp.NewClient(impl, &mcp.ClientOptions{
		ToolListChangedHandler:     func(context.Context, *mcp.ToolListChangedRequest) { u.notifyChanged("tools") },
		PromptListChangedHandler:   func(context.Context, *mcp.PromptListChangedRequest) { u.notifyChanged("prompts") },
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) { u.notifyChanged("resources") },
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			u.mu.Lock()
			f := u.progress
			u.mu.Unlock()
			f(r.Params)
		},
		//lint:ignore SA1019 logging is deprecated (SEP-2577), not gone: the client is relayed it
		LoggingMessageHandler: func(ctx context.Context, r *mcp.LoggingMessageRequest) {
			if p := u.ownerPeer(); p != nil {
				p.Log(ctx, r)
			}
		},
		// A round that asks for input goes back to the client that made
		// the call (SPEC §11.1), never answered here.
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
		// Unless it speaks for the one client, the shared session speaks
		// for none: it advertises nothing (not the SDK's default roots)
		// and answers no roots/list.
		Capabilities: caps,
	})
	u.client.AddReceivingMiddleware(u.toOwner)
	if _, err := u.Session(ctx); err != nil {
		return nil, err
	}
	return u, nil
}

// Adopt makes p, the peer of the client the shared session speaks for,
// its owner: true when the capabilities the shared session advertises
// are p's client's. A client session's peer is the only one asked; of
// parking peers (a 2026-07-28 client's), the first with those
// capabilities. nil: the client gets no peer (a 2026-07-28 upstream).
func (u *Upstream) Adopt(p *serverreq.Peer) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.speaksFor == nil || u.decided {
		return false
	}
	ok := p != nil && serverreq.SameCapabilities(u.speaksFor, serverreq.Relayable(p.Caps()))
	if !ok && p != nil && p.Parking() {
		return false
	}
	u.decided = true
	close(u.adopted)
	if ok {
		u.owner = p
	}
	return ok
}

// ownerPeer is the peer that took the shared session as its own, if any.
func (u *Upstream) ownerPeer() *serverreq.Peer {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.owner
}

// toOwner is the receiving middleware of the shared session: what the
// upstream asks the client (elicitation/create, sampling/createMessage,
// roots/list) goes to the owner — an older revision's client is waited
// for until its session is initialized; without one, no client is asked
// and roots/list is refused (the SDK would answer it with an empty
// list).
func (u *Upstream) toOwner(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if !wire.AsksClient(method) {
			return next(ctx, method, req)
		}
		if u.waitOwner {
			select {
			case <-u.adopted:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if p := u.ownerPeer(); p != nil {
			return p.AnswerUpstream(next)(ctx, method, req)
		}
		if method == "roots/list" {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "client does not support roots"}
		}
		return next(ctx, method, req)
	}
}

// Name is the command line or URL of the upstream server.
func (u *Upstream) Name() string { return u.name }

// Info is the upstream's answer to initialize on the first connection:
// its serverInfo, capabilities and instructions.
func (u *Upstream) Info() *mcp.InitializeResult {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.info
}

func (u *Upstream) notifyChanged(list string) {
	u.mu.Lock()
	f := u.changed
	u.mu.Unlock()
	f(list)
}

// OnProgress sets the function that receives progress notifications.
func (u *Upstream) OnProgress(f func(*mcp.ProgressNotificationParams)) {
	u.mu.Lock()
	u.progress = f
	u.mu.Unlock()
}

// OnClose adds a function Close calls.
func (u *Upstream) OnClose(f func()) {
	u.mu.Lock()
	u.others = append(u.others, f)
	u.mu.Unlock()
}

// OnChanged sets the function told that a list may have changed.
func (u *Upstream) OnChanged(f func(list string)) {
	u.mu.Lock()
	u.changed = f
	u.mu.Unlock()
}

// Session returns the live session, connecting (starting the server
// again) when there is none.
func (u *Upstream) Session(ctx context.Context) (*mcp.ClientSession, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, errors.New("upstream: closed")
	}
	if u.session != nil && !u.broken() {
		return u.session, nil
	}
	if u.session != nil {
		// Failed, still shutting down: it would refuse every request.
		u.logger.Warn("upstream connection failed: connecting again", "upstream", u.name)
		u.session = nil
	}
	s, broken, err := u.Connect(ctx, u.client)
	if err != nil {
		return nil, err
	}
	restarted := u.info != nil
	if u.info == nil {
		u.info = s.InitializeResult()
	}
	u.session, u.broken = s, broken
	go u.watch(s)
	if restarted {
		u.logger.Warn("upstream connected again", "upstream", u.name)
		f := u.changed
		go func() {
			for _, list := range []string{"tools", "prompts", "resources"} {
				f(list)
			}
		}()
	}
	return s, nil
}

// Shared is Session with the function that reports whether the
// session's connection has failed.
func (u *Upstream) Shared(ctx context.Context) (*mcp.ClientSession, func() bool, error) {
	s, err := u.Session(ctx)
	if err != nil {
		return nil, nil, err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.session != s {
		return s, func() bool { return true }, nil // already gone
	}
	return s, u.broken, nil
}

// Connect opens a session of c on a new connection to the upstream (a
// stdio server: a new process). broken reports whether its connection
// has failed since (a stdio connection's read or write; never over HTTP,
// whose requests are each their own).
func (u *Upstream) Connect(ctx context.Context, c *mcp.Client) (s *mcp.ClientSession, broken func() bool, err error) {
	t := u.newConn()
	broken = func() bool { return false }
	if rt, ok := t.(rawTransport); ok {
		broken = rt.broken.Load
	}
	if s, err = c.Connect(ctx, t, nil); err != nil {
		return nil, nil, fmt.Errorf("upstream %q: %w", u.name, err)
	}
	return s, broken, nil
}

// watch forgets a session once it ends, so the next use connects again.
func (u *Upstream) watch(s *mcp.ClientSession) {
	err := s.Wait()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.session == s {
		u.session = nil
		if !u.closed {
			u.logger.Warn("upstream connection ended", "upstream", u.name, "err", err)
		}
	}
}

// Close ends the connection (a stdio server's stdin is closed, then it is
// terminated if it does not exit).
func (u *Upstream) Close() error {
	u.mu.Lock()
	s, broken, others := u.session, u.broken, u.others
	u.session, u.closed, u.others = nil, true, nil
	if !u.decided {
		u.decided = true
		close(u.adopted)
	}
	u.mu.Unlock()
	for _, f := range others {
		f()
	}
	if s == nil {
		return nil
	}
	// The close of a connection that had failed (a server that exited:
	// its exit status) is no failure of the gateway's.
	if err := s.Close(); err != nil && !broken() {
		return err
	}
	return nil
}

// Client is the client of the shared session, to which the gateway adds
// sending methods (tasks/*).
func (u *Upstream) Client() *mcp.Client { return u.client }

// SpeaksFor reports whether the shared session speaks for one client
// (Options.Client).
func (u *Upstream) SpeaksFor() bool { return u.speaksFor != nil }
