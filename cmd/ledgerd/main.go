// Command ledgerd serves the effect ledger's REST API over a SQLite file
// or a PostgreSQL database.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/internal/version"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/tlog"
	"github.com/effect-ledger/effect-ledger/verify"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	m := NewMain(os.Stderr)
	if err := m.ParseFlags(ctx, os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) || errors.Is(err, errVersionShown) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "ledgerd:", err)
		os.Exit(2)
	}
	if err := m.Run(ctx); err != nil {
		m.Logger.Error("ledgerd failed", "err", err)
		fmt.Fprintln(os.Stderr, "ledgerd:", err)
		os.Exit(1)
	}
}

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
)

// DefaultMaxNamespaces is the default of --max-namespaces.
const DefaultMaxNamespaces = 10000

// Main is the ledgerd program, so that tests can drive it in-process.
type Main struct {
	DBPath               string
	Listen               string
	LogLevel             string
	LogFormat            string
	ShutdownTimeout      time.Duration
	VerifyEvery          time.Duration
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
	CacheMiB             int
	MaxNamespaces        int
	MaxOpenNamespaces    int
	// DefaultKeyTTL is the key lifetime of the default namespace when
	// this start creates the ledger (SPEC §12); 0: keys never expire.
	DefaultKeyTTL time.Duration
	OTLPEndpoint  string // otel.go

	// Verifiable log (SPEC §9).
	SigningKey         string
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
}

// NewMain returns a Main writing logs to stderr.
func NewMain(stderr io.Writer) *Main {
	return &Main{Stdout: os.Stdout, stderr: stderr, Logger: slog.New(slog.NewTextHandler(stderr, nil)), Addr: make(chan net.Addr, 1)}
}

// errVersionShown means --version printed the version: exit 0, run nothing.
var errVersionShown = errors.New("version shown")

// ParseFlags reads flags, with LEDGERD_<NAME> environment variables as
// defaults (flags win). With --version it prints the version to Stdout
// and returns errVersionShown.
func (m *Main) ParseFlags(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("ledgerd", flag.ContinueOnError)
	fs.SetOutput(m.stderr)
	showVersion := fs.Bool("version", false, "print the build version and the contract versions implemented, then exit")
	fs.StringVar(&m.DBPath, "db", DefaultDB, "the ledger `database`: a SQLite file path, or a PostgreSQL URL (postgres://user:pass@host:port/db, also postgresql://); the schema is created on first start")
	fs.StringVar(&m.Listen, "listen", DefaultListen, "`address` to serve HTTP on")
	fs.StringVar(&m.LogLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&m.LogFormat, "log-format", "text", "log `format`: text or json")
	fs.DurationVar(&m.ShutdownTimeout, "shutdown-timeout", DefaultShutdownTimeout, "how long to let in-flight requests finish on SIGINT/SIGTERM")
	fs.IntVar(&m.MaxInFlight, "max-inflight", api.DefaultMaxInFlight, "concurrent API requests beyond which requests get 503 + Retry-After (0: no bound); a request takes its place once its body has arrived")
	fs.IntVar(&m.MaxInFlightPerClient, "max-inflight-per-client", 0, "concurrent API requests of any one token (or, without a token, one client address) beyond which that client gets 503 + Retry-After; 0: three quarters of --max-inflight, -1: no bound")
	fs.StringVar(&m.TLSCert, "tls-cert", "", "serve HTTPS with this certificate `file` (PEM; with --tls-key)")
	fs.StringVar(&m.TLSKey, "tls-key", "", "private key `file` for --tls-cert (PEM)")
	fs.BoolVar(&m.Insecure, "insecure", false, "allow serving a non-loopback address without API tokens")
	fs.DurationVar(&m.ReadHeaderTimeout, "read-header-timeout", 5*time.Second, "drop clients that take longer to send their request headers")
	fs.DurationVar(&m.BatchLinger, "batch-linger", 5*time.Millisecond, "under load only, how long a namespace's writer may wait to gather as many requests as its previous batch before the next transaction (bigger batches, fewer commits); an idle ledger never waits; 0 disables")
	fs.DurationVar(&m.ReadTimeout, "read-timeout", DefaultReadTimeout, "drop clients that take longer to send a whole request")
	fs.DurationVar(&m.WriteTimeout, "write-timeout", DefaultWriteTimeout, "cut responses not written within this time of the request (a reserve with wait_ms gets its wait on top)")
	fs.IntVar(&m.CacheMiB, "cache-mib", sqlite.DefaultCacheMiB, "SQLite only: memory for page caches, every namespace together (a soft limit). More is faster once a ledger's indexes outgrow it; the operating system's file cache serves the rest")
	fs.IntVar(&m.MaxNamespaces, "max-namespaces", DefaultMaxNamespaces, "how many namespaces may exist, default included; creating one more is 507 namespace_limit (0: no limit)")
	fs.IntVar(&m.MaxOpenNamespaces, "max-open-namespaces", 0, "SQLite only: namespace files kept open at once, the least recently used closed first (0: one per 2 MiB of --cache-mib, 4 to 64, fewer under a low descriptor limit; each open file holds about 1–2 MiB)")
	fs.IntVar(&m.MaxWaiters, "max-waiters", ledger.DefaultMaxWaiters, "reserves that may wait at once for another reservation of their key (wait_ms); beyond it they are answered at once. Waiting reserves do not count against --max-inflight")
	fs.Float64Var(&m.RateLimit, "rate-limit", 0, "requests per second allowed per API token (0: no limit); beyond it 429 + Retry-After")
	fs.IntVar(&m.RateBurst, "rate-burst", 100, "burst size of --rate-limit")
	fs.BoolVar(&m.MetricsAuth, "metrics-auth", true, "require a reader token for /metrics when tokens exist (a token limited to namespaces sees only theirs); false serves every namespace's metrics to anyone who reaches the port")
	fs.StringVar(&m.OTLPEndpoint, "otlp-endpoint", "", "export OpenTelemetry traces over OTLP/HTTP to this `URL` (e.g. http://127.0.0.1:4318/v1/traces); the OTEL_EXPORTER_OTLP_* variables work too; off by default")
	fs.StringVar(&m.PprofAddr, "pprof", "", "serve net/http/pprof on this loopback `address` (e.g. 127.0.0.1:6060); off by default")
	fs.StringVar(&m.SigningKey, "signing-key", "", "sign checkpoints of the Merkle tree with this key: a `FILE` from ledgerctl keygen, an OpenSSH Ed25519 private key file, or ssh-agent:<fingerprint>")
	fs.BoolVar(&m.AllowReadableKey, "allow-readable-signing-key", false, "use a --signing-key file that group or others may read, with a warning, instead of refusing it")
	fs.StringVar(&m.LogOrigin, "log-origin", tlog.DefaultOriginPrefix, "checkpoint origin `prefix`: namespace NS has origin PREFIX/NS; the key's name")
	fs.DurationVar(&m.CheckpointInterval, "checkpoint-interval", time.Second, "sign a new checkpoint at most this often when the tree has grown")
	fs.BoolVar(&m.PublicLog, "public-log", false, "serve the verifiable log of every namespace, /log/NS/ (checkpoint and tiles), without a token even when tokens exist")
	fs.Var(&m.Witnesses, "witness", "send each new checkpoint to this C2SP tlog-witness, `VKEY=URL` (its cosignature verifier key and URL prefix; repeatable; LEDGERD_WITNESS takes several separated by spaces), and serve its cosignatures")
	fs.IntVar(&m.WitnessQuorum, "witness-quorum", 0, "serve a new checkpoint only once this many --witness witnesses have cosigned it; until then the previous one stays served")
	fs.DurationVar(&m.VerifyEvery, "verify-every", 0, "verify the chain every `DURATION` (full at start, then incremental); 0 disables")
	fs.DurationVar(&m.DefaultKeyTTL, "default-key-ttl", 0, "when this start creates the ledger, forget a finalized key of the default namespace this long after its outcome, e.g. 24h; 0: never. Fixed once the ledger exists (namespaces set their own: ledgerctl namespace create --key-ttl)")
	fs.Usage = func() {
		fmt.Fprintf(m.stderr, `Usage: ledgerd [flags]

ledgerd records the side effects of AI-agent tool calls in a tamper-evident,
append-only ledger (a SQLite file or a PostgreSQL database) and serves the REST API described in docs/spec.md §4
(contract `+version.Contract+`; GET /v1/openapi.json describes it in OpenAPI 3.1).

Every flag can also be set as LEDGERD_<NAME> (for example LEDGERD_DB,
LEDGERD_LISTEN, LEDGERD_LOG_LEVEL); a flag on the command line wins.

The read-only web audit page is served at /ui/ (it asks for a reader token
when tokens exist).

Example:
  ledgerd --db /var/lib/ledger/ledger.db --listen 127.0.0.1:8080

Flags:
`)
		fs.PrintDefaults()
	}
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "version" {
			return // an environment variable must not turn the server into a version printer
		}
		name := "LEDGERD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if err := f.Value.Set(v); err != nil && envErr == nil {
				envErr = fmt.Errorf("%s=%q: %w", name, v, err)
			}
		}
	})
	if envErr != nil {
		return envErr
	}
	m.Witnesses.fromEnv = len(m.Witnesses.specs) > 0 // --witness on the command line replaces them
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Fprint(m.Stdout, version.Read("ledgerd").String())
		return errVersionShown
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(m.LogLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch m.LogFormat {
	case "text":
		m.Logger = slog.New(slog.NewTextHandler(m.stderr, opts))
	case "json":
		m.Logger = slog.New(slog.NewJSONHandler(m.stderr, opts))
	default:
		return fmt.Errorf("--log-format must be text or json, not %q", m.LogFormat)
	}
	if m.ShutdownTimeout <= 0 {
		return errors.New("--shutdown-timeout must be positive")
	}
	if (m.TLSCert == "") != (m.TLSKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if m.VerifyEvery < 0 {
		return errors.New("--verify-every must not be negative")
	}
	if m.MaxInFlight < 0 {
		return fmt.Errorf("--max-inflight must be 0 (no bound) or positive, not %d", m.MaxInFlight)
	}
	if m.MaxInFlightPerClient < -1 {
		return fmt.Errorf("--max-inflight-per-client must be -1 (no bound), 0 (three quarters of --max-inflight) or positive, not %d", m.MaxInFlightPerClient)
	}
	if m.BatchLinger < 0 {
		return fmt.Errorf("--batch-linger must be 0 or positive, not %s", m.BatchLinger)
	}
	if m.ReadHeaderTimeout <= 0 {
		return fmt.Errorf("--read-header-timeout must be positive, not %s", m.ReadHeaderTimeout)
	}
	if math.IsNaN(m.RateLimit) || math.IsInf(m.RateLimit, 0) || m.RateLimit < 0 {
		return fmt.Errorf("--rate-limit must be a finite number of requests per second ≥ 0 (0: no limit), not %v", m.RateLimit)
	}
	if m.CheckpointInterval < 10*time.Millisecond {
		return fmt.Errorf("--checkpoint-interval must be at least 10ms, not %s", m.CheckpointInterval)
	}
	if m.LogOrigin == "" || strings.ContainsAny(m.LogOrigin, "+ \t\n") {
		return fmt.Errorf("--log-origin must be a non-empty name without spaces or '+', not %q", m.LogOrigin)
	}
	if err := m.Witnesses.parse(); err != nil {
		return err
	}
	if len(m.Witnesses.specs) > 0 && m.SigningKey == "" {
		return errors.New("--witness needs --signing-key: witnesses cosign signed checkpoints")
	}
	if m.WitnessQuorum < 0 || m.WitnessQuorum > len(m.Witnesses.specs) {
		return fmt.Errorf("--witness-quorum must be between 0 and the number of --witness (%d), not %d", len(m.Witnesses.specs), m.WitnessQuorum)
	}
	if m.RateBurst < 1 {
		return fmt.Errorf("--rate-burst must be at least 1, not %d", m.RateBurst)
	}
	if m.ReadTimeout <= 0 {
		return fmt.Errorf("--read-timeout must be positive, not %s", m.ReadTimeout)
	}
	if m.WriteTimeout <= 0 {
		return fmt.Errorf("--write-timeout must be positive, not %s", m.WriteTimeout)
	}
	if m.MaxWaiters <= 0 {
		return fmt.Errorf("--max-waiters must be positive, not %d", m.MaxWaiters)
	}
	if m.MaxNamespaces < 0 {
		return fmt.Errorf("--max-namespaces must be 0 (no limit) or positive, not %d", m.MaxNamespaces)
	}
	if m.MaxOpenNamespaces < 0 {
		return fmt.Errorf("--max-open-namespaces must be 0 (automatic) or positive, not %d", m.MaxOpenNamespaces)
	}
	if m.CacheMiB < 4 || m.CacheMiB > 1<<20 {
		return fmt.Errorf("--cache-mib must be between 4 and 1048576, not %d", m.CacheMiB)
	}
	return nil
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
		if key, err = m.loadKey(); err != nil {
			return err
		}
		defer key.close()
	}
	keyTTL, err := keyTTLMS(m.DefaultKeyTTL)
	if err != nil {
		return fmt.Errorf("--default-key-ttl: %w", err)
	}
	now, err := testClock()
	if err != nil {
		return err
	}
	store, err := storage.Open(ctx, m.DBPath, storage.Options{Logger: m.Logger, KeyTTL: keyTTL, Now: now,
		SQLite: sqlite.Options{CacheMiB: m.CacheMiB, MaxOpenFiles: m.MaxOpenNamespaces}})
	if err != nil {
		return err
	}
	l := ledger.New(store, ledger.Config{Logger: m.Logger, MaxWaiters: m.MaxWaiters, Linger: m.BatchLinger, Now: now,
		MaxNamespaces: m.MaxNamespaces})
	defer func() {
		if err := l.Close(); err != nil {
			m.Logger.Error("close ledger", "err", err)
		}
	}()
	def, err := l.Default(ctx)
	if err != nil {
		return err
	}
	head, err := def.Head(ctx)
	if err != nil {
		return err
	}
	// storage.Open has checked every namespace's storage (SQLite: each
	// file against the registry and its derived state, a few at a time, so
	// a damaged one stops the start naming the repair); the files open on
	// first use.
	// The verifier and GET /v1/audit read through their own read-only
	// store, so they never take connections from the API or the writers.
	rstore, err := storage.Open(ctx, m.DBPath, storage.Options{Logger: m.Logger, ReadOnly: true, Now: now})
	if err != nil {
		return err
	}
	defer func() { _ = rstore.Close() }()
	rd, err := rstore.Chain(ctx, ledger.DefaultNamespace)
	if err != nil {
		return err
	}
	var svc *nsServices
	if key != nil || m.VerifyEvery > 0 {
		var verifyStore ledger.Store
		if m.VerifyEvery > 0 {
			verifyStore = rstore
		}
		if svc, err = m.startNsServices(ctx, l, key, verifyStore); err != nil {
			return err
		}
		defer svc.stop()
	}
	if m.PprofAddr != "" {
		stopPprof, err := servePprof(m.PprofAddr, m.Logger)
		if err != nil {
			return err
		}
		defer stopPprof()
	}
	m.Addr <- ln.Addr()
	cfg, closeCfg, err := m.apiConfig(ctx, store, rd, svc, key)
	cfg.Now = now // LEDGERD_TEST_CLOCK_FILE dates the token-existence re-reads too
	if err != nil {
		return err
	}
	defer closeCfg()
	handler := api.NewServer(l, cfg)
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
	srv.RegisterOnShutdown(l.EndWaits)
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
	m.Logger.Info("ledgerd ready", "addr", ln.Addr().String(), "scheme", scheme, "db", store.Describe(), "head_seq", head.Seq,
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

// signingKey is a loaded checkpoint signing key.
type signingKey struct {
	signer note.Signer
	vkey   string
	close  func()
}

// loadKey loads --signing-key with --log-origin as its name.
func (m *Main) loadKey() (*signingKey, error) {
	signer, vkey, closeKey, err := tlog.LoadSigner(m.SigningKey, m.LogOrigin,
		tlog.KeyOptions{AllowReadable: m.AllowReadableKey, Logger: m.Logger})
	if err != nil {
		return nil, err
	}
	return &signingKey{signer: signer, vkey: vkey, close: func() {
		if err := closeKey(); err != nil {
			m.Logger.Warn("close signing key", "err", err)
		}
	}}, nil
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
func (m *Main) apiConfig(ctx context.Context, store ledger.Store, rd verify.DB, svc *nsServices,
	key *signingKey) (cfg api.Config, close func(), err error) {
	cfg = api.Config{Logger: m.Logger, MaxInFlight: m.MaxInFlight, MaxInFlightPerClient: m.MaxInFlightPerClient,
		OpenMetrics: !m.MetricsAuth, RateLimit: m.RateLimit, RateBurst: m.RateBurst,
		AuditSource: rd, PublicLog: m.PublicLog}
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
	if lr, ok := store.(liveReplicas); ok && m.RateLimit > 0 {
		every, err := testPeriod(testReplicaCountEnv, replicaCountEvery)
		if err != nil {
			flush()
			return cfg, nil, err
		}
		// Replicas on one database share the limit: each enforces its part.
		cfg.RateLimitShare, stopShare = shareRateLimit(ctx, lr, every, m.Logger)
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

// liveReplicas is a store shared by replicas that can count them.
type liveReplicas interface {
	LiveReplicas(ctx context.Context) (int, error)
}

// shareRateLimit returns the rate limit's share (api.Config.RateLimitShare):
// the number of live replicas, read every period until stop is called.
func shareRateLimit(ctx context.Context, lr liveReplicas, every time.Duration, logger *slog.Logger) (share func() int, stop func()) {
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
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				read(sctx)
			}
		}
	}()
	return func() int { return int(n.Load()) }, func() { cancel(); <-done }
}
