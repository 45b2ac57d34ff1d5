// Package daemon is the ledgerd program: Main parses its flags and runs
// the server (the store, the ledger, the per-namespace services and the
// REST API) until its context ends. cmd/ledgerd only wires it to the
// process's arguments, signals and exit code; tests drive the same Main
// in-process, setting its seams (Now, AfterCommit, IndexWriteFault, the
// background periods) as fields, never through the environment.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/cmd/ledgerd/daemon/nsservices"
	"github.com/effect-ledger/effect-ledger/internal/logging"
	"github.com/effect-ledger/effect-ledger/internal/tick"
	"github.com/effect-ledger/effect-ledger/internal/version"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// buildInfo is 1 with the running build's version as labels, the usual
// way to show versions on dashboards and to alert on mixed rollouts.
var buildInfo = promauto.NewGaugeVec(prometheus.GaugeOpts{
	Name: "ledger_build_info",
	Help: "Always 1; labels name the running ledgerd build and the contract version it implements.",
}, []string{"version", "revision", "contract", "goversion"})

// Defaults of the flags.
const (
	DefaultDB              = "./ledger.db"
	DefaultListen          = "127.0.0.1:8080"
	DefaultShutdownTimeout = 15 * time.Second
	DefaultReadTimeout     = 30 * time.Second
	DefaultWriteTimeout    = 30 * time.Second
	DefaultPruneInterval   = 24 * time.Hour
)

// DefaultMaxNamespaces is the default of --max-namespaces.
const DefaultMaxNamespaces = 10000

// DefaultReplicaCountEvery is how often ledgerd re-counts the live
// replicas that share the rate limit.
const DefaultReplicaCountEvery = 2 * time.Second

// Main is the ledgerd program. ParseFlags sets the fields of the flags;
// the seams after them are for tests and stay zero in the binary.
type Main struct {
	DBPath          string
	Listen          string
	Log             logging.Flags // --log-level, --log-format
	ShutdownTimeout time.Duration
	VerifyEvery     time.Duration
	// RetentionEvery is how often each committed namespace's retention
	// policy is swept (SPEC §14); 0: never.
	RetentionEvery       time.Duration
	PprofAddr            string
	MaxInFlight          int
	MaxInFlightPerClient int
	Insecure             bool
	TLSCert              string
	TLSKey               string
	MetricsAuth          bool
	ReadHeaderTimeout    time.Duration
	BatchLinger          time.Duration
	RateLimit            float64
	RateBurst            int
	ReadTimeout          time.Duration
	WriteTimeout         time.Duration
	MaxWaiters           int
	// ApprovalInputRetention keeps an ask's input this long after its
	// answer or expiry (SPEC §13).
	ApprovalInputRetention time.Duration
	CacheMiB               int
	MaxNamespaces          int
	MaxOpenNamespaces      int
	// DefaultKeyTTL is the key lifetime of the default namespace when
	// this start creates the ledger (SPEC §12); 0: keys never expire.
	DefaultKeyTTL time.Duration
	// DefaultPayloads is the payload mode of the default namespace when
	// this start creates the ledger (SPEC §14).
	DefaultPayloads string
	OTLPEndpoint    string // otel.go
	// ArchiveDir is where prunes write their segments (SPEC §16); empty:
	// nothing is pruned. PruneInterval is how often namespaces with an
	// archive policy are pruned (0: only when asked).
	ArchiveDir    string
	PruneInterval time.Duration

	// Verifiable log (SPEC §9).
	SigningKey         string
	HandoverKey        string // keys.go
	AllowReadableKey   bool
	LogOrigin          string
	CheckpointInterval time.Duration
	PublicLog          bool
	Witnesses          witnessFlag
	WitnessQuorum      int

	Logger *slog.Logger
	// Stdout receives what --version prints.
	Stdout io.Writer
	stderr io.Writer

	// Addr is the address actually listened on, set by Run (for ":0").
	Addr chan net.Addr

	// Now is the clock of the ledger, its store and the API's re-reads
	// (nil: time.Now), so that tests cross lease ends and key lifetimes
	// without waiting.
	Now func() time.Time
	// AfterCommit, when set, is called after each durable COMMIT of the
	// SQLite driver, before that batch reaches the key index (the crash
	// tests kill the process there).
	AfterCommit func()
	// IndexWriteFault, when set, is asked before each write of the SQLite
	// key index's files; an error fails that write (a full disk).
	IndexWriteFault func() error
	// PruneStep, when set, is called at each step of a prune
	// (ledger.Config.PruneStep; the crash tests kill the process there).
	PruneStep func(step string)
	// ReplicaCountEvery is how often the replicas sharing the rate limit
	// are counted (0: DefaultReplicaCountEvery).
	ReplicaCountEvery time.Duration
	// NamespaceScanEvery is how often new namespaces are looked for, to
	// start their services (0: nsservices.DefaultScanEvery).
	NamespaceScanEvery time.Duration
	// PruneEvery, when set, replaces --prune-interval (which is at least a
	// minute), so that a test sees scheduled prunes without waiting.
	PruneEvery time.Duration
}

// NewMain returns a Main writing logs to stderr.
func NewMain(stderr io.Writer) *Main {
	return &Main{Stdout: os.Stdout, stderr: stderr, Logger: slog.New(slog.NewTextHandler(stderr, nil)), Addr: make(chan net.Addr, 1)}
}

// Execute parses args and runs until ctx is done, and returns the exit
// code of the command: 0, 2 when the flags are wrong, 1 when Run fails.
// It prints the error to stderr.
func (m *Main) Execute(ctx context.Context, args []string) int {
	if err := m.ParseFlags(ctx, args); err != nil {
		if errors.Is(err, flag.ErrHelp) || errors.Is(err, errVersionShown) {
			return 0
		}
		fmt.Fprintln(m.stderr, "ledgerd:", err)
		return 2
	}
	if err := m.Run(ctx); err != nil {
		m.Logger.Error("ledgerd failed", "err", err)
		fmt.Fprintln(m.stderr, "ledgerd:", err)
		return 1
	}
	return 0
}

// Run opens the ledger, serves until ctx is done, then shuts down: it stops
// accepting, lets in-flight requests finish (up to ShutdownTimeout), and
// closes the database.
func (m *Main) Run(ctx context.Context) error {
	// Bind first: a database is created only once the address is ours.
	ln, err := net.Listen("tcp", m.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer func() { _ = ln.Close() }()
	// Load the signing key before the database is opened or created: a
	// key that cannot sign stops ledgerd before anything is written.
	var key *signingKey
	if m.SigningKey != "" {
		if key, err = m.loadKeys(); err != nil {
			return err
		}
		defer key.close()
	}
	o, err := m.open(ctx, key)
	if err != nil {
		return err
	}
	defer o.close()
	// Always: every namespace's ledger_payload_bytes gauge is refreshed
	// (SPEC §14).
	svc, err := m.startNsServices(ctx, o, key)
	if err != nil {
		return err
	}
	defer svc.Stop()
	if m.PprofAddr != "" {
		stopPprof, err := servePprof(m.PprofAddr, m.Logger)
		if err != nil {
			return err
		}
		defer stopPprof()
	}
	m.Addr <- ln.Addr()
	cfg, closeCfg, err := m.apiConfig(ctx, o, svc, key)
	if err != nil {
		return err
	}
	defer closeCfg()
	cfg.Now = m.Now // the token-existence re-reads too
	handler := api.NewServer(o.l, cfg)
	if err := m.checkAuth(ctx, handler, o.store); err != nil {
		return err
	}
	return m.serve(ctx, ln, handler, o)
}

// opened is what Run serves from.
type opened struct {
	store  ledger.Store   // the read-write store
	shared storage.Shared // what its database offers replicas; nil on SQLite
	l      *ledger.Ledger // the domain service over store
	rstore ledger.Store   // a read-only store for the verifier and GET /v1/audit
	head   ledger.Head    // the default namespace's head at start
	logger *slog.Logger
}

// open opens the database (creating it on first start) twice: read-write
// under the ledger, and read-only, so that the verifier and GET /v1/audit
// never take connections from the API or the writers.
func (m *Main) open(ctx context.Context, key *signingKey) (_ *opened, err error) {
	keyTTL, err := keyTTLMS(m.DefaultKeyTTL)
	if err != nil {
		return nil, fmt.Errorf("--default-key-ttl: %w", err)
	}
	payloads, err := ledger.ParsePayloadMode(m.DefaultPayloads, ledger.DefaultPayloads)
	if err != nil {
		return nil, fmt.Errorf("--default-payloads: want inline or committed, got %q", m.DefaultPayloads)
	}
	if m.ArchiveDir != "" {
		if err := checkArchiveDir(m.ArchiveDir); err != nil {
			return nil, err
		}
	}
	now := m.Now
	store, shared, err := storage.Open(ctx, m.DBPath, storage.Options{Logger: m.Logger, KeyTTL: keyTTL, Payloads: payloads, Now: now,
		CacheMiB: m.CacheMiB, MaxOpenNamespaces: m.MaxOpenNamespaces, AfterCommit: m.AfterCommit,
		IndexWriteFault: m.IndexWriteFault})
	if err != nil {
		return nil, err
	}
	o := &opened{store: store, shared: shared, logger: m.Logger}
	o.l = ledger.New(store, ledger.Config{Logger: m.Logger, MaxWaiters: m.MaxWaiters, Linger: m.BatchLinger, Now: now,
		MaxNamespaces: m.MaxNamespaces, ApprovalInputRetention: m.ApprovalInputRetention, CanPurge: !storage.IsPostgres(m.DBPath),
		LogKeyPrefix: m.LogOrigin, LogKeyBase: key.baseID(), ArchiveDir: m.ArchiveDir, PruneStep: m.PruneStep})
	defer func() {
		if err != nil {
			o.close()
		}
	}()
	def, err := o.l.Default(ctx)
	if err != nil {
		return nil, err
	}
	if o.head, err = def.Head(ctx); err != nil {
		return nil, err
	}
	// storage.Open has checked every namespace's storage (SQLite: each
	// file against the registry and its derived state, a few at a time, so
	// a damaged one stops the start naming the repair); the files open on
	// first use.
	if o.rstore, _, err = storage.Open(ctx, m.DBPath, storage.Options{Logger: m.Logger, ReadOnly: true, Now: now}); err != nil {
		return nil, err
	}
	return o, nil
}

// keyTTLMS converts a key lifetime flag to key_ttl_ms: whole milliseconds
// from 0 to ledger.MaxKeyTTL.
func keyTTLMS(d time.Duration) (uint64, error) {
	if d < 0 || d%time.Millisecond != 0 || uint64(d.Milliseconds()) > ledger.MaxKeyTTL {
		return 0, fmt.Errorf("%s is not a whole number of milliseconds from 0 up", d)
	}
	return uint64(d.Milliseconds()), nil
}

// close closes the read-only store, then the ledger and its store.
func (o *opened) close() {
	if o.rstore != nil {
		_ = o.rstore.Close()
	}
	if err := o.l.Close(); err != nil {
		o.logger.Error("close ledger", "err", err)
	}
}

// checkAuth logs whether requests need a token, refuses to serve a
// non-loopback address without auth unless --insecure, and there keeps
// auth on for the life of the process.
func (m *Main) checkAuth(ctx context.Context, handler *api.Server, store ledger.Store) error {
	authOn, err := handler.AuthEnabled(ctx)
	if err != nil {
		return err
	}
	switch {
	case authOn:
		m.Logger.Info("auth enabled: API requests need a bearer token")
	case !isLoopback(m.Listen) && !m.Insecure:
		return fmt.Errorf("refusing to serve %s without auth: create a token (ledgerctl token create --db %s --role admin --name NAME) or pass --insecure", m.Listen, store.Describe())
	case !isLoopback(m.Listen):
		m.Logger.Warn("auth disabled and --insecure: anyone who can reach this address can write receipts", "addr", m.Listen)
	default:
		m.Logger.Info("auth disabled: no API tokens exist, serving open on loopback (ledgerctl token create enables auth)")
	}
	if !isLoopback(m.Listen) && !m.Insecure {
		// On a non-loopback address auth stays on for the life of the
		// process, whatever happens to the tokens.
		handler.RequireAuth()
	}
	return nil
}

// serve serves handler on ln (with TLS when configured) until ctx is
// done, then shuts down within ShutdownTimeout.
func (m *Main) serve(ctx context.Context, ln net.Listener, handler http.Handler, o *opened) error {
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: m.ReadHeaderTimeout,
		ReadTimeout:       m.ReadTimeout,
		WriteTimeout:      m.WriteTimeout,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(m.Logger.Handler(), slog.LevelWarn),
	}
	// Reserves parked on a key (wait_ms) answer at once when shutdown
	// begins instead of holding it up.
	srv.RegisterOnShutdown(o.l.EndWaits)
	serveErr := make(chan error, 1)
	scheme := "http"
	if m.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(m.TLSCert, m.TLSKey)
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		ln = tls.NewListener(ln, srv.TLSConfig)
		scheme = "https"
	}
	go func() { serveErr <- srv.Serve(api.WrapListener(ln)) }()
	v := version.Read("ledgerd")
	buildInfo.WithLabelValues(v.Short(), v.Revision, v.Contract, v.Go).Set(1)
	m.Logger.Info("ledgerd ready", "addr", ln.Addr().String(), "scheme", scheme, "db", o.store.Describe(), "head_seq", o.head.Seq,
		"audit_page", scheme+"://"+ln.Addr().String()+"/ui/", "version", v.Short(), "contract", v.Contract)

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	m.Logger.Info("shutting down", "timeout", m.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), m.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	m.Logger.Info("stopped")
	return nil
}

// isLoopback reports whether a listen address binds only loopback.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// witnessFlag is the repeatable --witness VKEY=URL.
type witnessFlag struct {
	specs   []string
	list    []*tlog.Witness
	fromEnv bool
}

func (f *witnessFlag) String() string { return strings.Join(f.specs, " ") }

// Set adds witnesses; LEDGERD_WITNESS may hold several separated by
// spaces, and a --witness on the command line replaces those.
func (f *witnessFlag) Set(v string) error {
	if f.fromEnv {
		f.specs, f.fromEnv = nil, false
	}
	fields := strings.Fields(v)
	if len(fields) == 0 {
		return errors.New("want VKEY=URL")
	}
	f.specs = append(f.specs, fields...)
	return nil
}

// parse parses every spec; two witnesses may not share a key name.
func (f *witnessFlag) parse() error {
	f.list = nil
	seen := map[string]bool{}
	for _, s := range f.specs {
		w, err := tlog.ParseWitness(s)
		if err != nil {
			return fmt.Errorf("--witness: %w", err)
		}
		if seen[w.Name()] {
			return fmt.Errorf("--witness: two witnesses are named %q", w.Name())
		}
		seen[w.Name()] = true
		f.list = append(f.list, w)
	}
	return nil
}

// apiConfig configures the API server from the flags. close, after the
// server has shut down, stops sharing the rate limit and flushes the
// spans of the last requests.
func (m *Main) apiConfig(ctx context.Context, o *opened, svc *nsservices.Services,
	key *signingKey) (cfg api.Config, close func(), err error) {
	cfg = api.Config{Logger: m.Logger, MaxInFlight: m.MaxInFlight, MaxInFlightPerClient: m.MaxInFlightPerClient,
		OpenMetrics: !m.MetricsAuth, RateLimit: m.RateLimit, RateBurst: m.RateBurst,
		AuditStore: o.rstore, PublicLog: m.PublicLog}
	if m.MaxInFlight == 0 {
		cfg.MaxInFlight = -1 // --max-inflight 0: no bound
	}
	tp, err := m.openTracing(ctx)
	if err != nil {
		return cfg, nil, err
	}
	flush := func() {}
	if tp != nil {
		cfg.TracerProvider = tp
		flush = func() {
			fctx, cancel := context.WithTimeout(context.Background(), m.ShutdownTimeout)
			defer cancel()
			if err := tp.Shutdown(fctx); err != nil {
				m.Logger.Warn("flushing traces", "err", err)
			}
		}
		m.Logger.Info("tracing on: exporting OpenTelemetry spans over OTLP/HTTP")
	}
	stopShare := func() {}
	if o.shared != nil && m.RateLimit > 0 {
		every := m.ReplicaCountEvery
		if every <= 0 {
			every = DefaultReplicaCountEvery
		}
		// Replicas on one database share the limit: each enforces its part.
		cfg.RateLimitShare, stopShare = shareRateLimit(ctx, o.shared, every, m.Logger)
	}
	if svc != nil && key != nil && len(m.Witnesses.list) > 0 {
		cfg.Witnessing = svc
	}
	if svc != nil && m.VerifyEvery > 0 {
		// GET /v1/verification reports the default namespace's runs; every
		// namespace's are in the metrics, labelled by namespace.
		cfg.Verification = svc.Verification(ledger.DefaultNamespace)
	}
	return cfg, func() { stopShare(); flush() }, nil
}

// shareRateLimit returns the rate limit's share (api.Config.RateLimitShare):
// the number of live replicas, read every period until stop is called.
func shareRateLimit(ctx context.Context, lr storage.Shared, every time.Duration, logger *slog.Logger) (share func() int, stop func()) {
	var n atomic.Int64
	n.Store(1)
	read := func(ctx context.Context) {
		c, err := lr.LiveReplicas(ctx)
		if err != nil {
			logger.Debug("rate limit: counting replicas", "err", err)
			return // keep the last count
		}
		if old := n.Swap(int64(c)); old != int64(c) {
			logger.Info("rate limit shared by replicas", "replicas", c)
		}
	}
	read(ctx)
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick.Every(sctx, every, read)
	}()
	return func() int { return int(n.Load()) }, func() { cancel(); <-done }
}
