// Package mcpgate puts the effect ledger on the path where agents call
// tools: an MCP proxy (SPEC §11) that forwards everything between an
// agent's MCP client and the real MCP server, and decides every
// side-effecting tools/call with the ledger first, so that the same call
// runs once, a repeat gets the recorded result, and an effect whose
// outcome is unknown is never run again blindly.
//
// One decision path (call.go) runs over one Ledger port (ledgerport): a
// ledger in this process (NewLocal, the service the REST API uses) or a
// ledgerd (a *client.Client, the Go client). Downstream (package
// downstream) it serves MCP over stdio or Streamable HTTP and passes every
// request but tools/call through; upstream (package upstream) it talks to
// a server it starts over stdio or one it reaches over Streamable HTTP,
// both with the official Go SDK. A call's class comes from the tool's
// annotations and the --policy file (package policy). The extensions are
// packages beside it, each with its own state, joined to the path through
// a small interface: rounds (multi round-trip input, parked calls), tasks,
// serverreq (requests from an older upstream), approve (approvals
// through the client) and reconcile (a rule's lookup asked about an
// interrupted call, SPEC §15); wire is the JSON-RPC vocabulary they share
// with the core, template the placeholders of a rule's JSON. docs/mcp.md ("How a call flows") draws the path and where
// each extension joins it.
package mcpgate

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/approve"
	"github.com/effect-ledger/effect-ledger/mcpgate/downstream"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/policy"
	"github.com/effect-ledger/effect-ledger/mcpgate/rounds"
	"github.com/effect-ledger/effect-ledger/mcpgate/serverreq"
	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// Version20260728 is the stateless revision (SPEC §11.1): no
// initialize, every request carries its version in _meta, and a call may
// answer input_required (multi round-trip requests).
const Version20260728 = wire.Version20260728

// Defaults of Config.
const (
	DefaultLease = 5 * time.Minute
	DefaultWait  = 30 * time.Second
	// DefaultUpstreamTimeout is how long a call waits for the upstream's
	// answer: well under DefaultLease, so that a call the upstream never
	// answers is reported before its reservation runs out.
	DefaultUpstreamTimeout = 2 * time.Minute
	MaxWait                = 60 * time.Second // the ledger's largest wait_ms
)

// Ledger is the gateway's port to the effect ledger (ledgerport): a
// *client.Client for a ledgerd, NewLocal for a ledger in this process.
type Ledger = ledgerport.Ledger

// NewLocal returns the Ledger port over one namespace of a ledger in this
// process, the same service the REST API calls.
func NewLocal(ns *ledger.Namespace) Ledger { return ledgerport.NewLocal(ns) }

// InjectTraceContext sets the traceparent (and tracestate) headers of a
// request to the ledger from the trace context of the call that ctx
// belongs to: the remote ledger client's propagator
// (client.WithPropagator; ledgerport.InjectTraceContext).
func InjectTraceContext(ctx context.Context, h http.Header) { ledgerport.InjectTraceContext(ctx, h) }

// DefaultLedgerTimeout bounds each request to a remote ledger, beyond a
// reserve's wait (ledger-mcp's --ledger-timeout).
const DefaultLedgerTimeout = ledgerport.DefaultTimeout

// Config configures a Gateway.
type Config struct {
	Ledger Ledger
	// LedgerTimeout bounds each request to the ledger, a reserve's beyond
	// its wait; 0: none (an embedded ledger). ledger-mcp gives a remote
	// one --ledger-timeout (DefaultLedgerTimeout).
	LedgerTimeout time.Duration
	// ServerName prefixes the ledger's tool names, <server-name>.<tool>.
	ServerName string
	// Scope goes into every derived key: the same call in another scope
	// is another effect. ScopeSession derives it from the MCP session.
	Scope string
	// ExactReplays keeps replayed answers as they were recorded, for hosts
	// that read _meta; by default a replay starts with a text block that
	// tells the model it is one.
	ExactReplays bool
	// AdminURL is where a person resolves keys (ledger-mcp --admin-listen,
	// or the ledgerd of --ledger): the answers that ask for a person name it.
	AdminURL string
	Lease    time.Duration // default DefaultLease
	// RunID names this process in its execution ids (run.go), so that a
	// later process can tell its dead work; "" names no run (a gateway
	// that cannot prove its run live: with --ledger, or without its
	// PostgreSQL run lock).
	RunID string
	// UpstreamTimeout bounds the wait for the upstream's answer to one
	// forwarded call (one round of it); then its outcome is unknown.
	// Default DefaultUpstreamTimeout, capped at Lease.
	UpstreamTimeout time.Duration
	// Wait is how long a duplicate waits for the same call in flight, at
	// most MaxWait; 0 is no wait (ledger-mcp's --wait defaults to
	// DefaultWait).
	Wait   time.Duration
	Policy Policy
	// ApprovalURL is the web page where a person answers an ask (SPEC
	// §13), named in the answer to a call that awaits approval: {seq} is
	// replaced with the ask's seq, and a URL without {seq} gets
	// #approvals/<seq> appended. Empty: no page is named.
	ApprovalURL string
	Logger      *slog.Logger
	// Version is the gateway's version, for its serverInfo when the
	// upstream sends none.
	Version string
	// StateKey returns the key that authenticates the requestState
	// envelopes of multi round-trip calls (SPEC §11.1), at least 32 bytes:
	// every gateway on one ledger needs the same key, kept across
	// restarts — the one kept in the ledger (ledger.MCPStateKey), or a
	// file's (rounds.LoadStateKey). It is called when the first envelope is made
	// or opened, and again after a failure until it succeeds. Without it
	// a random key of this process is used, and a call's next round must
	// come back to this process.
	StateKey func() ([]byte, error)
}

// Gateway is the MCP proxy.
type Gateway struct {
	cfg  Config
	port ledgerport.Port // the calls to cfg.Ledger
	// process is the scope of a stdio session under ScopeSession: one
	// process, one session.
	process  string
	up       *Upstream
	tools    *downstream.Tools    // the upstream's tools, for their annotations
	progress *downstream.Progress // progress routed back to the calling session
	down     *downstream.Server   // the MCP server the client talks to
	logger   *slog.Logger
	stateKey func() ([]byte, error)
	tasks    *tasks.Tasks // tasks (tasks.go)
	// peers are the downstream sessions' own upstream sessions
	// (package serverreq).
	peers     *serverreq.Peers
	parked    *rounds.Parking    // the parked calls of 2026-07-28 clients (park.go)
	approvals *approve.Approvals // approvals through the client (approvals.go)
}

// New returns a gateway in front of up.
func New(up *Upstream, cfg Config) (*Gateway, error) {
	if cfg.Ledger == nil {
		return nil, errors.New("mcpgate: no ledger")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Lease == 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Wait < 0 || cfg.Wait > MaxWait {
		return nil, fmt.Errorf("mcpgate: wait %s is not within 0 … %s", cfg.Wait, MaxWait)
	}
	if cfg.Lease < 10*time.Millisecond || cfg.Lease > 24*time.Hour {
		return nil, fmt.Errorf("mcpgate: lease %s is not within 10ms … 24h", cfg.Lease)
	}
	if cfg.UpstreamTimeout < 0 {
		return nil, fmt.Errorf("mcpgate: upstream timeout %s is negative", cfg.UpstreamTimeout)
	}
	if cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = DefaultUpstreamTimeout
	}
	cfg.UpstreamTimeout = min(cfg.UpstreamTimeout, cfg.Lease)
	info := up.Info()
	if cfg.ServerName == "" && info.ServerInfo != nil {
		cfg.ServerName = info.ServerInfo.Name
	}
	cfg.ServerName = ToolNamePart(cfg.ServerName)
	if cfg.StateKey == nil {
		key := make([]byte, rounds.StateKeyLen)
		_, _ = rand.Read(key)
		cfg.StateKey = func() ([]byte, error) { return key, nil }
	}
	port := ledgerport.Port{Ledger: cfg.Ledger, Timeout: cfg.LedgerTimeout, Logger: cfg.Logger}
	g := &Gateway{cfg: cfg, port: port, approvals: approve.New(port, cfg.ApprovalURL, cfg.Wait, cfg.Logger), up: up, tools: downstream.NewTools(),
		progress: downstream.NewProgress(), logger: cfg.Logger, process: "process:" + rand.Text(), stateKey: rounds.OnceKey(cfg.StateKey)}
	g.peers = serverreq.New(up, serverreq.Config{Name: up.Name(), Version: cfg.Version, SpeaksFor: up.SpeaksFor(),
		Logger: g.logger, Progress: g.progress.Deliver})
	g.parked = rounds.NewParking(g.peers, cfg.UpstreamTimeout, g.logger)
	g.tasks = tasks.New(taskCore{g}, g.stateKey, func(tool string) string { return LedgerToolName(g.cfg.ServerName, tool) }, g.logger)
	g.down = downstream.New(downstream.Config{Info: info, Version: cfg.Version, Up: up, Peers: g.peers, Tasks: g.tasks,
		Tools: g.tools, Logger: g.logger, CallTool: g.callTool})
	up.OnChanged(g.down.ListChanged)
	up.OnClose(g.parked.Close)
	up.OnProgress(g.progress.Deliver)
	return g, nil
}

// ScopeSession as Config.Scope scopes derived keys to the MCP session:
// on stdio the gateway's process (one client, one session), over
// Streamable HTTP the session's Mcp-Session-Id. The same call in a later
// session is new work; within one session it runs once.
const ScopeSession = "session"

// scopeOf is the scope that goes into a call's derived key.
func (g *Gateway) scopeOf(ss *mcp.ServerSession) string {
	if g.cfg.Scope != ScopeSession {
		return g.cfg.Scope
	}
	if ss != nil && ss.ID() != "" {
		return "session:" + ss.ID()
	}
	return g.process
}

// ServerName is the name that prefixes the ledger's tool names.
func (g *Gateway) ServerName() string { return g.cfg.ServerName }

// ToolNamePart makes a server name usable in the ledger's tool names and
// in a file name (policy.ToolNamePart).
func ToolNamePart(name string) string { return policy.ToolNamePart(name) }

// LedgerToolName is the ledger's tool name for an upstream's tool,
// <server-name>.<tool> when the ledger can hold it (policy.LedgerToolName).
func LedgerToolName(serverName, tool string) string { return policy.LedgerToolName(serverName, tool) }

// The downstream side (package downstream): the server the agent's
// client talks to, over the transport of the caller's choice.

// Server is the downstream MCP server, for transports of the caller's
// choice.
func (g *Gateway) Server() *mcp.Server { return g.down.MCP() }

// ServeStdio serves one MCP client on newline-delimited JSON streams
// (the process's stdin and stdout) until it disconnects or ctx ends.
func (g *Gateway) ServeStdio(ctx context.Context, in io.ReadCloser, out io.WriteCloser) error {
	return g.down.ServeStdio(ctx, in, out)
}

// HTTPOptions bounds the sessions of Handler (downstream.HTTPOptions).
type HTTPOptions = downstream.HTTPOptions

// Defaults of HTTPOptions.
const (
	DefaultSessionTimeout = downstream.DefaultSessionTimeout
	DefaultMaxSessions    = downstream.DefaultMaxSessions
)

// Handler serves Streamable HTTP (mount it at /mcp); every session shares
// the one upstream connection (downstream.Server.Handler).
func (g *Gateway) Handler(o HTTPOptions) http.Handler { return g.down.Handler(o) }

// PeekInitialize reads the first message a stdio client sends and
// returns who the client is, and the stream to serve
// (downstream.PeekInitialize).
func PeekInitialize(in io.ReadCloser) (*mcp.InitializeParams, io.ReadCloser) {
	return downstream.PeekInitialize(in)
}
