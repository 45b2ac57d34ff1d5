//lint:file-ignore SA1019 logging is deprecated (SEP-2577), not gone: a client that has it is relayed its level

package serverreq

import (
	"context"
	"log/slog"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// Upstream is the gateway's connection to its upstream server as the
// extension uses it.
type Upstream interface {
	// Session is the shared upstream session, connecting when there is
	// none.
	Session(ctx context.Context) (*mcp.ClientSession, error)
	// Shared is Session with the function that reports whether the
	// session's connection has failed.
	Shared(ctx context.Context) (*mcp.ClientSession, func() bool, error)
	// Connect opens a session of c on a new connection to the upstream,
	// with the function that reports whether its connection has failed.
	Connect(ctx context.Context, c *mcp.Client) (*mcp.ClientSession, func() bool, error)
	// Adopt offers the shared session to p, the peer of a client, as its
	// first session: true when the shared session speaks for p's client
	// (nil: the client gets no peer).
	Adopt(p *Peer) bool
}

// Config is what the extension knows of the gateway.
type Config struct {
	Name      string // the upstream's command line or URL, for messages
	Version   string // the gateway's version, in a parking peer's clientInfo
	SpeaksFor bool   // the shared session speaks for the one client
	Logger    *slog.Logger
	// Progress receives the upstream's progress notifications.
	Progress func(*mcp.ProgressNotificationParams)
}

// Peers is the extension's state: the downstream sessions' peers.
type Peers struct {
	up     Upstream
	cfg    Config
	logger *slog.Logger
	mu     sync.Mutex
	peers  map[*mcp.ServerSession]*Peer
}

// New returns the extension over up.
func New(up Upstream, cfg Config) *Peers {
	return &Peers{up: up, cfg: cfg, logger: cfg.Logger, peers: map[*mcp.ServerSession]*Peer{}}
}

// NewParking returns a parking peer: a client with capabilities caps (as
// Relayable made them), no session, at most calls calls in flight and
// spare idle upstream sessions kept; what its upstream asks goes to the
// call's Route.Park.
func (ps *Peers) NewParking(caps *mcp.ClientCapabilities, calls, spare int) *Peer {
	p := &Peer{ps: ps, caps: caps, impl: &mcp.Implementation{Name: "ledger-mcp", Version: ps.cfg.Version},
		slots: make(chan struct{}, calls), busy: map[*mcp.ClientSession]*Route{}, maxSpare: spare}
	p.shared = ps.up.Adopt(p)
	return p
}

// UsesPeer reports whether a call of a client of revision version on ss
// goes on a session of its own.
func (ps *Peers) UsesPeer(ss *mcp.ServerSession, version string) bool {
	if ss == nil || wire.Stateless(version) {
		return false
	}
	s, err := ps.up.Session(context.Background())
	if err != nil {
		return false
	}
	ir := s.InitializeResult()
	return ir != nil && !wire.Stateless(ir.ProtocolVersion)
}

// SessionFor returns the upstream session a request of a client of
// revision version goes on: the client's own for an older revision (an
// upstream may offer tools by the client's capabilities), else the
// shared one.
func (ps *Peers) SessionFor(req mcp.Request, version string) func(context.Context) (*mcp.ClientSession, error) {
	if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ps.UsesPeer(ss, version) {
		return ps.Of(ss).Session
	}
	return ps.up.Session
}

// Initialized takes, for a client whose session is now initialized, the
// shared session as its own when the shared session speaks for it
// (UpstreamOptions.Client): from now on what the upstream asks there
// goes to the client.
func (ps *Peers) Initialized(_ context.Context, req *mcp.InitializedRequest) {
	if !ps.cfg.SpeaksFor {
		return
	}
	if ps.UsesPeer(req.Session, "") {
		ps.Of(req.Session)
		return
	}
	ps.up.Adopt(nil)
}

// Of returns ss's peer, made on first use and closed with ss.
func (ps *Peers) Of(ss *mcp.ServerSession) *Peer {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p, ok := ps.peers[ss]; ok {
		return p
	}
	p := &Peer{ps: ps, ss: ss, slots: make(chan struct{}, maxPeerCalls), busy: map[*mcp.ClientSession]*Route{}}
	p.shared = ps.up.Adopt(p)
	ps.peers[ss] = p
	go func() {
		_ = ss.Wait()
		ps.mu.Lock()
		delete(ps.peers, ss)
		ps.mu.Unlock()
		p.Close()
	}()
	return p
}

// RelayLogLevel passes a logging/setLevel of a client of an older
// revision on to its upstream session, which then logs at that level;
// the SDK answers the client.
func (ps *Peers) RelayLogLevel(ctx context.Context, req mcp.Request, version string) error {
	p, ok := req.GetParams().(*mcp.SetLoggingLevelParams)
	ss, _ := req.GetSession().(*mcp.ServerSession)
	if !ok || !ps.UsesPeer(ss, version) {
		return nil
	}
	return ps.Of(ss).setLevel(ctx, p.Level)
}
