package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/internal/version"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate"
	"github.com/effect-ledger/effect-ledger/mcpgate/rounds"
	"github.com/effect-ledger/effect-ledger/storage"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// Run connects to the upstream server and the ledger, then serves MCP
// until the client disconnects (stdio) or ctx ends.
func (m *Main) Run(ctx context.Context) error {
	var client *mcp.InitializeParams
	if m.Listen == "" {
		// The one client's initialize first: the upstream is started
		// once for it, speaking for it (SPEC §11.1).
		var ok bool
		if client, m.Stdin, ok = peekInitialize(ctx, m.Stdin); !ok {
			return nil // stopped before the client spoke
		}
	}
	up, err := m.dialUpstream(ctx, client)
	if err != nil {
		return err
	}
	m.closers = append(m.closers, up.Close)
	name := m.ServerName
	if name == "" && up.Info().ServerInfo != nil {
		name = up.Info().ServerInfo.Name
	}
	if err := mcpgate.CheckLookups(ctx, up, m.Policy, name); err != nil {
		return fmt.Errorf("--policy %s: %w", m.PolicyFile, err)
	}
	led, desc, err := m.openLedger(ctx, mcpgate.ToolNamePart(name))
	if err != nil {
		return err
	}
	if err := m.setGate(ctx, name); err != nil {
		return err
	}
	run := m.endDeadLeases(ctx, mcpgate.NewRunID())
	adminURL := m.LedgerURL
	if m.AdminListen != "" {
		if adminURL, err = m.serveAdmin(ctx); err != nil {
			return err
		}
	}
	stateKey := m.loadStateKey
	if m.remote != nil && m.StateKeyFile == "" {
		// Fetched now, so that a refusal shows at start; a ledger out of
		// reach is asked again when a round needs the key.
		key, err := m.loadStateKey()
		if err != nil {
			m.Logger.Warn("cannot fetch the state key from the ledger; will try again when a call needs it", "err", err)
		} else {
			stateKey = func() ([]byte, error) { return key, nil }
		}
	}
	approvalURL := m.ApprovalURL
	if approvalURL == "" && adminURL != "" {
		approvalURL = strings.TrimSuffix(adminURL, "/") + "/ui/#approvals/{seq}"
	}
	var ledgerTimeout time.Duration // an embedded ledger answers or fails on its own
	if m.remote != nil {
		ledgerTimeout = m.LedgerTimeout
	}
	g, err := mcpgate.New(up, mcpgate.Config{Ledger: led, LedgerTimeout: ledgerTimeout, ServerName: name, Scope: m.Scope, Lease: m.Lease,
		UpstreamTimeout: m.UpstreamTimeout, RunID: run, Wait: m.Wait, Policy: m.Policy, Logger: m.Logger, Version: version.Read("ledger-mcp").Short(),
		ExactReplays: m.ExactReplays, AdminURL: adminURL, ApprovalURL: approvalURL, StateKey: stateKey})
	if err != nil {
		return err
	}
	// Closed before the ledger (closers run last first): a parked call's
	// final answer is committed on the way out.
	m.closers = append(m.closers, g.Close)
	if m.MetricsAddr != "" {
		if err := m.serveMetrics(); err != nil {
			return err
		}
	}
	m.Logger.Info("ledger-mcp connected", "upstream", up.Name(), "server_name", g.ServerName(), "ledger", desc,
		"namespace", m.Namespace, "scope", m.Scope)
	if m.Listen == "" {
		return g.ServeStdio(ctx, m.Stdin, m.Stdout)
	}
	return m.serveHTTP(ctx, g)
}

// dialUpstream starts or reaches the upstream server; its error names the
// command or URL.
// On stdio the shared connection speaks for the client (client, its
// initialize), which it serves as its own.
func (m *Main) dialUpstream(ctx context.Context, client *mcp.InitializeParams) (*mcpgate.Upstream, error) {
	o := mcpgate.UpstreamOptions{Logger: m.Logger, Stderr: m.stderr, Version: version.Read("ledger-mcp").Short(), Client: client}
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if m.UpstreamURL != "" {
		up, err := mcpgate.DialURL(dctx, m.UpstreamURL, o)
		if err != nil {
			return nil, fmt.Errorf("cannot reach the upstream MCP server at %s: %w", m.UpstreamURL, err)
		}
		return up, nil
	}
	up, err := mcpgate.DialCommand(dctx, m.Command, o)
	if err != nil {
		return nil, fmt.Errorf("cannot start the upstream MCP server %q: %w", strings.Join(m.Command, " "), err)
	}
	return up, nil
}

// peekInitialize is mcpgate.PeekInitialize until ctx ends (ok false).
func peekInitialize(ctx context.Context, in io.ReadCloser) (_ *mcp.InitializeParams, _ io.ReadCloser, ok bool) {
	type peeked struct {
		p  *mcp.InitializeParams
		in io.ReadCloser
	}
	done := make(chan peeked, 1)
	go func() {
		p, rest := mcpgate.PeekInitialize(in)
		done <- peeked{p, rest}
	}()
	select {
	case r := <-done:
		return r.p, r.in, true
	case <-ctx.Done():
		return nil, nil, false
	}
}

// openLedger opens the embedded ledger or the client of a remote one,
// and describes it for the log.
func (m *Main) openLedger(ctx context.Context, serverName string) (mcpgate.Ledger, string, error) {
	if m.LedgerURL != "" {
		c, err := client.New(m.LedgerURL, client.WithToken(m.Token), client.WithNamespace(m.Namespace),
			client.WithWait(m.Wait), client.WithRetry(2, 100*time.Millisecond, time.Second),
			client.WithPropagator(mcpgate.InjectTraceContext))
		if err != nil {
			return nil, "", fmt.Errorf("--ledger: %w", err)
		}
		m.remote = c
		return c, c.BaseURL(), nil
	}
	db := m.DB
	if db == "" {
		var err error
		if db, err = defaultDB(serverName); err != nil {
			return nil, "", err
		}
	}
	if !storage.IsPostgres(db) {
		m.dbFile = db
		if err := os.MkdirAll(filepath.Dir(db), 0o700); err != nil {
			return nil, "", fmt.Errorf("ledger directory: %w", err)
		}
	}
	ttl := uint64(m.KeyTTL.Milliseconds())
	store, shared, err := storage.Open(ctx, db, storage.Options{Logger: m.Logger, KeyTTL: ttl})
	m.shared = shared
	if errors.Is(err, sqlite.ErrLocked) {
		return nil, "", fmt.Errorf("%w: for several gateways on one ledger, run ledgerd on it and give each --ledger URL", err)
	}
	if err != nil {
		return nil, "", err
	}
	l := ledger.New(store, ledger.Config{Logger: m.Logger})
	m.closers = append(m.closers, l.Close)
	m.ledger = l
	ns, err := l.NS(ctx, m.Namespace)
	if ledger.ErrorCode(err) == ledger.ECodeUnknownNamespace {
		if err = l.CreateNamespace(ctx, m.Namespace, ledger.NamespaceSettings{KeyTTL: ttl}); err == nil {
			ns, err = l.NS(ctx, m.Namespace)
		}
	}
	if err != nil {
		return nil, "", err
	}
	m.ns = ns
	return mcpgate.NewLocal(ns), store.Describe(), nil
}

// endDeadLeases ends, as interrupted, the reservations an earlier process
// of this embedded ledger left running (killed mid-call), so that an
// identical call is told at once that a person must resolve its key,
// instead of "still running" until the lease ends. A SQLite file is held
// by one process at a time, so every earlier run is gone; PostgreSQL may
// be shared by gateways that run now, so each run holds a lock while it
// runs (TryRunLock) and only a run whose lock is free is gone. Not with
// --ledger: other gateways share that ledger. It returns the run id this
// process names in its executions: run, or "" (none, so no later process
// takes them for dead work) where it could not prove its own run live —
// with --ledger, or without its PostgreSQL run lock.
func (m *Main) endDeadLeases(ctx context.Context, run string) string {
	if m.ns == nil {
		return ""
	}
	dead := mcpgate.EarlierRun(run)
	if m.dbFile == "" {
		rl := m.shared
		if rl == nil {
			return ""
		}
		release, held, err := rl.TryRunLock(ctx, run)
		if err != nil || !held {
			m.Logger.Warn("cannot hold this run's lock: the calls of gateways that died, and this one's, end with their lease", "run", run, "err", err)
			return ""
		}
		m.closers = append(m.closers, func() error { release(); return nil })
		dead = liveRunsExcluded(ctx, rl, dead)
	}
	keys, err := m.ns.EndLeases(ctx, dead)
	if err != nil {
		m.Logger.Warn("cannot end the calls an earlier ledger-mcp left running; they end with their lease", "err", err)
	}
	if len(keys) > 0 {
		m.Logger.Warn("calls an earlier ledger-mcp left running are interrupted: a person resolves them (ledgerctl resolve)",
			"keys", keys, "run", run)
	}
	return run
}

// liveRunsExcluded narrows earlier to the runs whose lock no live
// process holds.
func liveRunsExcluded(ctx context.Context, rl storage.Shared, earlier func(*chain.Receipt) bool) func(*chain.Receipt) bool {
	gone := map[string]bool{}
	return func(r *chain.Receipt) bool {
		if !earlier(r) {
			return false
		}
		other := mcpgate.RunOf(r.ExecutionID)
		if g, ok := gone[other]; ok {
			return g
		}
		release, free, err := rl.TryRunLock(ctx, other)
		if free {
			release()
		}
		gone[other] = err == nil && free
		return gone[other]
	}
}

// setGate records the gate's members of the --policy file, and the
// reconcile its lookups need (SPEC §15), as the embedded ledger's
// namespace policy (SPEC §13), with the tools' ledger names
// <server-name>.<tool>: a policy receipt, unless the same policy is in
// force. A file with lookups but no gate member keeps the policy in force
// (one set at --admin-listen, say) and puts their reconcile rules first;
// a file with neither leaves it as it is. With --ledger, check refused
// gate members.
func (m *Main) setGate(ctx context.Context, serverName string) error {
	if m.ns == nil {
		return nil
	}
	inForce, _, err := m.ns.Policy(ctx)
	if err != nil {
		return fmt.Errorf("--policy %s: read the policy in force: %w", m.PolicyFile, err)
	}
	raw, err := m.Policy.LedgerPolicyOver(serverName, inForce)
	if err != nil {
		return fmt.Errorf("--policy %s: %w", m.PolicyFile, err)
	}
	if raw == nil {
		return nil
	}
	res, err := m.ns.SetPolicy(ctx, raw, "")
	if err != nil {
		return fmt.Errorf("--policy %s: record the gate's policy: %w", m.PolicyFile, err)
	}
	m.Logger.Info("gate policy in force", "namespace", m.Namespace, "seq", res.Seq, "changed", res.Changed,
		"policy", string(res.Policy))
	return nil
}

// loadStateKey returns the key of the requestState envelopes (SPEC
// §11.1): --state-key-file when given; else the key kept in the ledger,
// derived from the namespace's secret — with --ledger the one ledgerd
// derives for this gateway's token (GET /v1/mcp/state-key), so replicas
// sharing a token share it; embedded, derived here with the name "". An
// embedded SQLite ledger's <db>.mcp-key, made by an earlier gateway, is
// still read when it exists, so that its envelopes keep opening. A
// ledgerd older than the route (404 not_found) falls back to the file
// --state-key-file defaults to, and says so in the log.
func (m *Main) loadStateKey() ([]byte, error) {
	if m.StateKeyFile != "" {
		return m.stateKeyFile(m.StateKeyFile)
	}
	if m.remote != nil {
		ctx, cancel := context.WithTimeout(context.Background(), m.LedgerTimeout)
		defer cancel()
		key, err := m.remote.StateKey(ctx)
		if err == nil {
			return key, nil
		}
		if !errors.Is(err, client.ErrNotFound) {
			return nil, fmt.Errorf("state key from the ledger: %w", err)
		}
		path, perr := defaultStateKeyFile()
		if perr != nil {
			return nil, perr
		}
		m.Logger.Warn("the ledger keeps no state key (a ledgerd older than GET /v1/mcp/state-key): using a key file, "+
			"which every gateway on this ledger must share", "state_key_file", path)
		return m.stateKeyFile(path)
	}
	if m.dbFile != "" {
		// A key file of an earlier gateway keeps its envelopes opening.
		if path := m.dbFile + ".mcp-key"; fileExists(path) {
			return m.stateKeyFile(path)
		}
	}
	if m.ns == nil {
		return nil, errors.New("state key: no ledger open")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	secret, err := m.ns.StateKey(ctx)
	if err != nil {
		return nil, err
	}
	return ledger.MCPStateKey(secret, "")
}

// stateKeyFile reads (or creates) the key file path.
func (m *Main) stateKeyFile(path string) ([]byte, error) {
	key, err := rounds.LoadStateKey(path)
	if err != nil {
		return nil, fmt.Errorf("--state-key-file: %w", err)
	}
	return key, nil
}

// defaultStateKeyFile is the key file of a gateway whose ledger keeps no
// key: one per user.
func defaultStateKeyFile() (string, error) {
	dir, err := stateDir()
	if err != nil {
		return "", fmt.Errorf("default --state-key-file: %w (set XDG_STATE_HOME or --state-key-file)", err)
	}
	return filepath.Join(dir, "effect-ledger", "mcp-state.key"), nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// serveMetrics serves /metrics on MetricsAddr until Close.
func (m *Main) serveMetrics() error {
	ln, err := net.Listen("tcp", m.MetricsAddr)
	if err != nil {
		return fmt.Errorf("--metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	m.closers = append(m.closers, srv.Close)
	m.Logger.Info("metrics ready", "addr", ln.Addr().String())
	return nil
}

// serveHTTP serves Streamable HTTP at /mcp until ctx ends.
func (m *Main) serveHTTP(ctx context.Context, g *mcpgate.Gateway) error {
	ln, err := net.Listen("tcp", m.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", g.Handler(mcpgate.HTTPOptions{SessionTimeout: m.SessionTimeout, MaxSessions: m.MaxSessions}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	m.Logger.Info("ledger-mcp ready", "addr", ln.Addr().String(), "url", "http://"+ln.Addr().String()+"/mcp")
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), DefaultShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
