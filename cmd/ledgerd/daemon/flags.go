package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/internal/version"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// errVersionShown means --version printed the version: exit 0, run nothing.
var errVersionShown = errors.New("version shown")

// ParseFlags reads flags, with LEDGERD_<NAME> environment variables as
// defaults (flags win). With --version it prints the version to Stdout
// and returns errVersionShown.
func (m *Main) ParseFlags(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("ledgerd", flag.ContinueOnError)
	fs.SetOutput(m.stderr)
	showVersion := fs.Bool("version", false, "print the build version and the contract versions implemented, then exit")
	m.serveFlags(fs)
	m.limitFlags(fs)
	m.logFlags(fs)
	fs.Usage = func() { m.usage(fs) }
	if err := envDefaults(fs); err != nil {
		return err
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
	l, err := m.Log.Logger(m.stderr)
	if err != nil {
		return err
	}
	m.Logger = l
	for _, check := range []func() error{m.checkServe, m.checkLimits, m.checkLog} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// serveFlags are the flags of the database, the listener, logging and
// the background jobs.
func (m *Main) serveFlags(fs *flag.FlagSet) {
	fs.StringVar(&m.DBPath, "db", DefaultDB, "the ledger `database`: a SQLite file path, or a PostgreSQL URL (postgres://user:pass@host:port/db, also postgresql://); the schema is created on first start")
	fs.StringVar(&m.Listen, "listen", DefaultListen, "`address` to serve HTTP on")
	m.Log.Register(fs)
	fs.DurationVar(&m.ShutdownTimeout, "shutdown-timeout", DefaultShutdownTimeout, "how long to let in-flight requests finish on SIGINT/SIGTERM")
	fs.StringVar(&m.TLSCert, "tls-cert", "", "serve HTTPS with this certificate `file` (PEM; with --tls-key)")
	fs.StringVar(&m.TLSKey, "tls-key", "", "private key `file` for --tls-cert (PEM)")
	fs.BoolVar(&m.Insecure, "insecure", false, "allow serving a non-loopback address without API tokens")
	fs.IntVar(&m.CacheMiB, "cache-mib", sqlite.DefaultCacheMiB, "SQLite only: memory for the ledger's caches, every namespace together: three quarters for the key index (its block cache and memtables, allocated by Pebble outside the Go heap), a quarter for SQLite's page caches (a soft limit). More is faster once a ledger outgrows it; the operating system's file cache serves the rest")
	fs.IntVar(&m.MaxNamespaces, "max-namespaces", DefaultMaxNamespaces, "how many namespaces may exist, default included; creating one more is 507 namespace_limit (0: no limit)")
	fs.IntVar(&m.MaxOpenNamespaces, "max-open-namespaces", 0, "SQLite only: namespaces kept open at once (their key and tree caches in memory), the least recently used closed first (0: 32 per MiB of --cache-mib, 64 to 1,024; each open namespace holds at most about 40 KiB)")
	fs.BoolVar(&m.MetricsAuth, "metrics-auth", true, "require a reader token for /metrics when tokens exist (a token limited to namespaces sees only theirs); false serves every namespace's metrics to anyone who reaches the port")
	fs.StringVar(&m.OTLPEndpoint, "otlp-endpoint", "", "export OpenTelemetry traces over OTLP/HTTP to this `URL` (e.g. http://127.0.0.1:4318/v1/traces); the OTEL_EXPORTER_OTLP_* variables work too; off by default")
	fs.StringVar(&m.PprofAddr, "pprof", "", "serve net/http/pprof on this loopback `address` (e.g. 127.0.0.1:6060); off by default")
	fs.DurationVar(&m.VerifyEvery, "verify-every", 0, "verify the chain every `DURATION` (full at start, then incremental); 0 disables")
	fs.DurationVar(&m.RetentionEvery, "retention-interval", time.Minute, "sweep each committed namespace's payload retention (its policy's retention.payloads_ms) every `DURATION`, and read the ledger_payload_bytes gauge as often (every minute when 0); 0 disables the sweeps (docs/privacy.md)")
	fs.DurationVar(&m.DefaultKeyTTL, "default-key-ttl", 0, "when this start creates the ledger, forget a finalized key of the default namespace this long after its outcome, e.g. 24h; 0: never. Fixed once the ledger exists (namespaces set their own: ledgerctl namespace create --key-ttl)")
	fs.StringVar(&m.ArchiveDir, "archive-dir", "", "archive receipt bodies into this `DIR` before pruning them (docs/spec.md §16, docs/operations.md): it must exist and be writable, on a file system that honours fsync (shared by every replica on PostgreSQL); it holds the only copy of the pruned bodies. Without it nothing is pruned")
	fs.DurationVar(&m.PruneInterval, "prune-interval", DefaultPruneInterval, "with --archive-dir, archive and prune every `DURATION` each namespace whose policy has an archive member, as far as it allows (at least 1m); 0: only when asked (POST /v1/ns/NS/prune, ledgerctl prune)")
	fs.StringVar(&m.DefaultPayloads, "default-payloads", string(ledger.DefaultPayloads), "when this start creates the ledger, how the default namespace keeps its payload fields: inline, or committed (salted commitments on the chain, the values beside it, where they can be erased: docs/privacy.md). Fixed once the ledger exists (namespaces set their own: ledgerctl namespace create --payloads)")
}

// limitFlags are the flags that bound clients: in-flight requests,
// timeouts, batching, waiting reserves and the rate limit.
func (m *Main) limitFlags(fs *flag.FlagSet) {
	fs.IntVar(&m.MaxInFlight, "max-inflight", api.DefaultMaxInFlight, "concurrent API requests beyond which requests get 503 + Retry-After (0: no bound); a request takes its place once its body has arrived")
	fs.IntVar(&m.MaxInFlightPerClient, "max-inflight-per-client", 0, "concurrent API requests of any one token (or, without a token, one client address) beyond which that client gets 503 + Retry-After; 0: three quarters of --max-inflight, -1: no bound")
	fs.DurationVar(&m.ReadHeaderTimeout, "read-header-timeout", 5*time.Second, "drop clients that take longer to send their request headers")
	fs.DurationVar(&m.BatchLinger, "batch-linger", 5*time.Millisecond, "under load only, how long a namespace's writer may wait to gather as many requests as its previous batch before the next transaction (bigger batches, fewer commits); an idle ledger never waits; 0 disables")
	fs.DurationVar(&m.ReadTimeout, "read-timeout", DefaultReadTimeout, "drop clients that take longer to send a whole request")
	fs.DurationVar(&m.WriteTimeout, "write-timeout", DefaultWriteTimeout, "cut responses not written within this time of the request (a reserve with wait_ms gets its wait on top)")
	fs.DurationVar(&m.ApprovalInputRetention, "approval-input-retention", ledger.DefaultApprovalInputRetention, "how long the input of an ask (kept off the chain for the approvers, docs/approvals.md) is kept after its answer or expiry")
	fs.IntVar(&m.MaxWaiters, "max-waiters", ledger.DefaultMaxWaiters, "reserves that may wait at once for another reservation of their key (wait_ms); beyond it they are answered at once. Waiting reserves do not count against --max-inflight")
	fs.Float64Var(&m.RateLimit, "rate-limit", 0, "requests per second allowed per API token (0: no limit); beyond it 429 + Retry-After")
	fs.IntVar(&m.RateBurst, "rate-burst", 100, "burst size of --rate-limit")
}

// logFlags are the flags of the verifiable log (SPEC §9): signing,
// checkpoints and witnesses.
func (m *Main) logFlags(fs *flag.FlagSet) {
	fs.StringVar(&m.SigningKey, "signing-key", "", "sign checkpoints of the Merkle tree with this key: a `FILE` from ledgerctl keygen, an OpenSSH Ed25519 private key file, or ssh-agent:<fingerprint>")
	fs.StringVar(&m.HandoverKey, "handover-key", "", "while the log hands over from an old signing key to --signing-key (docs/operations.md), the old key's `FILE` (same forms as --signing-key): checkpoints carry both signatures until ledgerd restarts with the new key alone")
	fs.BoolVar(&m.AllowReadableKey, "allow-readable-signing-key", false, "use a --signing-key file that group or others may read, with a warning, instead of refusing it")
	fs.StringVar(&m.LogOrigin, "log-origin", tlog.DefaultOriginPrefix, "checkpoint origin `prefix`: namespace NS has origin PREFIX/NS; the key's name")
	fs.DurationVar(&m.CheckpointInterval, "checkpoint-interval", time.Second, "sign a new checkpoint at most this often when the tree has grown")
	fs.BoolVar(&m.PublicLog, "public-log", false, "serve the verifiable log of every namespace, /log/NS/ (checkpoint and tiles), without a token even when tokens exist")
	fs.Var(&m.Witnesses, "witness", "send each new checkpoint to this C2SP tlog-witness, `VKEY=URL` (its cosignature verifier key and URL prefix; repeatable; LEDGERD_WITNESS takes several separated by spaces), and serve its cosignatures")
	fs.IntVar(&m.WitnessQuorum, "witness-quorum", 0, "serve a new checkpoint only once this many --witness witnesses have cosigned it; until then the previous one stays served")
}

// usage prints --help.
func (m *Main) usage(fs *flag.FlagSet) {
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

// envDefaults sets every flag but --version from its LEDGERD_<NAME>
// environment variable, if set.
func envDefaults(fs *flag.FlagSet) error {
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
	return envErr
}

// checkServe validates serveFlags.
func (m *Main) checkServe() error {
	if m.ShutdownTimeout <= 0 {
		return errors.New("--shutdown-timeout must be positive")
	}
	if (m.TLSCert == "") != (m.TLSKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if m.VerifyEvery < 0 {
		return errors.New("--verify-every must not be negative")
	}
	if m.MaxNamespaces < 0 {
		return fmt.Errorf("--max-namespaces must be 0 (no limit) or positive, not %d", m.MaxNamespaces)
	}
	if m.MaxOpenNamespaces < 0 {
		return fmt.Errorf("--max-open-namespaces must be 0 (automatic) or positive, not %d", m.MaxOpenNamespaces)
	}
	if m.PruneInterval < 0 || m.PruneInterval > 0 && m.PruneInterval < time.Minute {
		return fmt.Errorf("--prune-interval must be 0 (only when asked) or at least 1m, not %s", m.PruneInterval)
	}
	if m.CacheMiB < 4 || m.CacheMiB > 1<<20 {
		return fmt.Errorf("--cache-mib must be between 4 and 1048576, not %d", m.CacheMiB)
	}
	return nil
}

// checkLimits validates limitFlags.
func (m *Main) checkLimits() error {
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
	if m.RateBurst < 1 {
		return fmt.Errorf("--rate-burst must be at least 1, not %d", m.RateBurst)
	}
	if m.ReadTimeout <= 0 {
		return fmt.Errorf("--read-timeout must be positive, not %s", m.ReadTimeout)
	}
	if m.WriteTimeout <= 0 {
		return fmt.Errorf("--write-timeout must be positive, not %s", m.WriteTimeout)
	}
	if m.ApprovalInputRetention <= 0 {
		return fmt.Errorf("--approval-input-retention must be positive, not %s", m.ApprovalInputRetention)
	}
	if m.MaxWaiters <= 0 {
		return fmt.Errorf("--max-waiters must be positive, not %d", m.MaxWaiters)
	}
	return nil
}

// checkLog validates logFlags.
func (m *Main) checkLog() error {
	if m.CheckpointInterval < 10*time.Millisecond {
		return fmt.Errorf("--checkpoint-interval must be at least 10ms, not %s", m.CheckpointInterval)
	}
	if m.LogOrigin == "" || strings.ContainsAny(m.LogOrigin, "+ \t\n") {
		return fmt.Errorf("--log-origin must be a non-empty name without spaces or '+', not %q", m.LogOrigin)
	}
	if err := m.Witnesses.parse(); err != nil {
		return err
	}
	if m.HandoverKey != "" && m.SigningKey == "" {
		return errors.New("--handover-key needs --signing-key: the key the log hands over to")
	}
	if len(m.Witnesses.specs) > 0 && m.SigningKey == "" {
		return errors.New("--witness needs --signing-key: witnesses cosign signed checkpoints")
	}
	if m.WitnessQuorum < 0 || m.WitnessQuorum > len(m.Witnesses.specs) {
		return fmt.Errorf("--witness-quorum must be between 0 and the number of --witness (%d), not %d", len(m.Witnesses.specs), m.WitnessQuorum)
	}
	return nil
}
