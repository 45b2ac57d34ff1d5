// Package downstream is ledger-mcp's side toward the agent's MCP client:
// the MCP server it serves over stdio (ServeStdio) or Streamable HTTP
// (Handler), which passes every request but tools/call to the upstream
// as it is (answered with the upstream's text as it came, adapted to the
// client's revision) and hands each tools/call to the core's decision
// (Config.CallTool). Around it: the transports' lift of
// params.idempotencyKey and params.task into _meta (lift.go), the
// responses dropped to requests the client cancelled (cancel.go), the
// upstream's progress routed back to the session that called (progress.go)
// and its list_changed relayed (listchanged.go), and the upstream's tools
// kept for their annotations (tools.go). It imports the extensions whose
// requests it routes (serverreq, tasks), never the core.
package downstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/effect-ledger/effect-ledger/mcpgate/serverreq"
	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
	"github.com/effect-ledger/effect-ledger/mcpgate/upstream"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Config configures a Server.
type Config struct {
	// Info is the upstream's initialize result: its serverInfo,
	// capabilities and instructions are the server's.
	Info    *mcp.InitializeResult
	Version string // the gateway's, for a serverInfo when the upstream sends none
	Up      *upstream.Upstream
	Peers   *serverreq.Peers
	Tasks   *tasks.Tasks
	// Tools is the upstream's tools, merged from each tools/list answer.
	Tools  *Tools
	Logger *slog.Logger
	// CallTool decides one tools/call (the core); version is the client's
	// protocol revision.
	CallTool func(ctx context.Context, req mcp.Request, p *mcp.CallToolParamsRaw, version string) (mcp.Result, error)
}

// Server is the downstream MCP server.
type Server struct {
	cfg    Config
	up     *upstream.Upstream
	peers  *serverreq.Peers
	tasks  *tasks.Tasks
	tools  *Tools
	logger *slog.Logger
	server *mcp.Server
}

// New returns the downstream server of cfg.
func New(cfg Config) *Server {
	g := &Server{cfg: cfg, up: cfg.Up, peers: cfg.Peers, tasks: cfg.Tasks, tools: cfg.Tools, logger: cfg.Logger}
	g.server = g.newServer(cfg.Info)
	return g
}

// newServer builds the downstream server: the upstream's serverInfo,
// capabilities and instructions, and a middleware that forwards every
// request it can and decides tools/call.
func (g *Server) newServer(info *mcp.InitializeResult) *mcp.Server {
	impl := &mcp.Implementation{Name: "ledger-mcp", Version: g.cfg.Version}
	if info.ServerInfo != nil {
		impl = info.ServerInfo
	}
	caps := &mcp.ServerCapabilities{}
	if info.Capabilities != nil {
		c := *info.Capabilities
		caps = &c
		g.tasks.Take(caps)
	}
	s := mcp.NewServer(impl, &mcp.ServerOptions{Instructions: info.Instructions, Capabilities: caps,
		InitializedHandler: g.peers.Initialized, Logger: slog.New(quietHandler{g.logger.Handler(), slog.LevelWarn})})
	s.AddReceivingMiddleware(g.forward)
	g.tasks.AddMethods(s, g.up.Client())
	return s
}

// forward is the receiving middleware: tools/call is decided (Config.CallTool), the other
// requests the SDK lets a server answer generically go to the upstream
// as they are; the rest (initialize, notifications, logging level) is
// the SDK's.
func (g *Server) forward(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		version := requestVersion(req) // before DescribeClient rewrites _meta
		ctx = tasks.WithOwner(ctx, req)
		var res mcp.Result
		var err error
		if p, ok := req.GetParams().(*mcp.CallToolParamsRaw); ok {
			res, err = g.cfg.CallTool(ctx, req, p, version)
		} else {
			res, err = g.route(ctx, method, req, next, version)
		}
		if err != nil || res == nil {
			return res, err
		}
		return present(version, res)
	}
}

// route sends each request but tools/call where forward says; version is
// the client's protocol revision.
func (g *Server) route(ctx context.Context, method string, req mcp.Request, next mcp.MethodHandler, version string) (mcp.Result, error) {
	if forwarded(req.GetParams()) {
		if err := g.peers.DescribeClient(ctx, req); err != nil {
			return nil, err
		}
	}
	if method == "initialize" {
		res, err := next(ctx, method, req)
		if err != nil {
			return nil, err
		}
		return g.tasks.WithCapability(res), nil
	}
	if err := g.peers.RelayLogLevel(ctx, req, version); err != nil {
		return nil, err
	}
	up := g.peers.SessionFor(req, version)
	switch p := req.GetParams().(type) {
	case *mcp.ListToolsParams:
		return forwardRaw(ctx, up, func(ctx context.Context, s *mcp.ClientSession) (*mcp.ListToolsResult, error) {
			res, err := s.ListTools(ctx, p)
			if err == nil {
				g.tools.Merge(res.Tools)
			}
			return res, err
		})
	case *mcp.ListPromptsParams:
		return forwardRaw(ctx, up, func(ctx context.Context, s *mcp.ClientSession) (*mcp.ListPromptsResult, error) {
			return s.ListPrompts(ctx, p)
		})
	case *mcp.GetPromptParams:
		return forwardRaw(ctx, up, func(ctx context.Context, s *mcp.ClientSession) (*mcp.GetPromptResult, error) {
			return s.GetPrompt(ctx, p)
		})
	case *mcp.ListResourcesParams:
		return forwardRaw(ctx, up, func(ctx context.Context, s *mcp.ClientSession) (*mcp.ListResourcesResult, error) {
			return s.ListResources(ctx, p)
		})
	case *mcp.ListResourceTemplatesParams:
		return forwardRaw(ctx, up, func(ctx context.Context, s *mcp.ClientSession) (*mcp.ListResourceTemplatesResult, error) {
			return s.ListResourceTemplates(ctx, p)
		})
	case *mcp.ReadResourceParams:
		return forwardRaw(ctx, up, func(ctx context.Context, s *mcp.ClientSession) (*mcp.ReadResourceResult, error) {
			return s.ReadResource(ctx, p)
		})
	case *mcp.CompleteParams:
		return forwardRaw(ctx, up, func(ctx context.Context, s *mcp.ClientSession) (*mcp.CompleteResult, error) {
			return s.Complete(ctx, p)
		})
	case *mcp.PingParams:
		// A ping checks the whole path: the SDK answers it once the
		// upstream has.
		s, err := g.up.Session(ctx)
		if err != nil {
			return nil, err
		}
		if err := s.Ping(ctx, p); err != nil {
			return nil, err
		}
	}
	return next(ctx, method, req)
}

// forwarded reports whether a request with params p goes upstream.
func forwarded(p mcp.Params) bool {
	switch p.(type) {
	case *mcp.CallToolParamsRaw, *mcp.ListToolsParams, *mcp.ListPromptsParams, *mcp.GetPromptParams,
		*mcp.ListResourcesParams, *mcp.ListResourceTemplatesParams, *mcp.ReadResourceParams, *mcp.CompleteParams:
		return true
	}
	return false
}

// forwardRaw runs f on the upstream session up returns and answers with the
// upstream's result as it was sent, where the connection keeps it.
func forwardRaw[R mcp.Result](ctx context.Context, up func(context.Context) (*mcp.ClientSession, error),
	f func(context.Context, *mcp.ClientSession) (R, error)) (mcp.Result, error) {
	s, err := up(ctx)
	if err != nil {
		return nil, err
	}
	rctx, slot := wire.WithSlot(ctx)
	res, err := f(rctx, s)
	if err != nil {
		return nil, err
	}
	return wire.AsRaw(res, slot.Get()), nil
}

// MCP is the downstream MCP server, for transports of the caller's
// choice.
func (g *Server) MCP() *mcp.Server { return g.server }

// ServeStdio serves one MCP client on newline-delimited JSON streams
// (the process's stdin and stdout) until it disconnects or ctx ends.
func (g *Server) ServeStdio(ctx context.Context, in io.ReadCloser, out io.WriteCloser) error {
	err := g.server.Run(ctx, cancelTransport{&mcp.IOTransport{Reader: newLiftReader(in), Writer: out}})
	if err != nil && errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Defaults of HTTPOptions.
const (
	DefaultSessionTimeout = 30 * time.Minute
	DefaultMaxSessions    = 1000
)

// HTTPOptions bounds the sessions of Handler: an idle session is closed
// after SessionTimeout (0: never), and a new session beyond MaxSessions
// open at once is refused with 503 (0: no bound).
type HTTPOptions struct {
	SessionTimeout time.Duration
	MaxSessions    int
}

// Handler serves Streamable HTTP (mount it at /mcp); every session shares
// the one upstream connection. Revisions before 2026-07-28 get sessions
// (Mcp-Session-Id); a 2026-07-28 request is served statelessly, as that
// revision requires: the SDK's stateful handler would refuse it, and its
// client would silently fall back to 2025-11-25.
func (g *Server) Handler(o HTTPOptions) http.Handler {
	server := func(*http.Request) *mcp.Server { return g.server }
	stateful := mcp.NewStreamableHTTPHandler(server, &mcp.StreamableHTTPOptions{SessionTimeout: o.SessionTimeout})
	stateless := mcp.NewStreamableHTTPHandler(server, &mcp.StreamableHTTPOptions{Stateless: true})
	byRevision := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if statelessRequest(r) {
			stateless.ServeHTTP(w, r)
			return
		}
		stateful.ServeHTTP(w, r)
	})
	return liftHTTP(g.boundSessions(byRevision, o.MaxSessions))
}

// statelessRequest reports whether r is a POST of revision 2026-07-28 or
// later, which belongs to no session.
func statelessRequest(r *http.Request) bool {
	return r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" &&
		wire.Stateless(r.Header.Get("Mcp-Protocol-Version"))
}

// boundSessions refuses a request that would open a session (one without
// Mcp-Session-Id) while max sessions are open. A stateless request opens
// none.
func (g *Server) boundSessions(next http.Handler, max int) http.Handler {
	if max <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == "" && !statelessRequest(r) && g.sessions() >= max {
			g.logger.WarnContext(r.Context(), "session refused: too many open", "max_sessions", max)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, `{"jsonrpc":"2.0","id":null,"error":{"code":%d,"message":"too many open sessions (at most %d): try again later"}}`,
				jsonrpc.CodeInternalError, max)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sessions counts the downstream sessions open now; a stateless
// request's session (no id, gone with its answer) is none.
func (g *Server) sessions() int {
	n := 0
	for ss := range g.server.Sessions() {
		if ss.ID() != "" {
			n++
		}
	}
	return n
}

// quietHandler passes on records of at least min: the SDK logs every
// session's start and end at info, which would drown the gateway's own
// lines.
type quietHandler struct {
	slog.Handler
	min slog.Level
}

func (h quietHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h quietHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return quietHandler{h.Handler.WithAttrs(attrs), h.min}
}

func (h quietHandler) WithGroup(name string) slog.Handler {
	return quietHandler{h.Handler.WithGroup(name), h.min}
}
