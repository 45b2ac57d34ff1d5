// Command ledger-mcp is an MCP proxy that puts the effect ledger on an
// agent's tool path (docs/spec.md §11): the agent's MCP client talks to
// ledger-mcp, ledger-mcp talks to the real MCP server, and every
// side-effecting tools/call is reserved in the ledger before it runs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/internal/logging"
	"github.com/effect-ledger/effect-ledger/internal/version"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate"
	"github.com/effect-ledger/effect-ledger/storage"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	m := NewMain(os.Stderr)
	if err := m.ParseFlags(ctx, os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) || errors.Is(err, errVersionShown) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "ledger-mcp:", err)
		os.Exit(2)
	}
	err := m.Run(ctx)
	if cerr := m.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		m.Logger.Error("ledger-mcp failed", "err", err)
		fmt.Fprintln(os.Stderr, "ledger-mcp:", err)
		os.Exit(1)
	}
}

// Defaults of the flags.
const (
	DefaultNamespace       = "default"
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultKeyTTL is how long an embedded ledger this start creates
	// remembers a finished call's key: the window in which a derived key
	// deduplicates. A derived key names what a call does (its tool and
	// arguments), which a user may legitimately want done again later, not
	// one business operation a client named (Stripe keeps those 24 h); an
	// hour covers runtime retries, restarts of the agent and the gateway,
	// and a model repeating itself within a task (AWS Powertools' default
	// too). An interrupted call never expires: it waits for a person.
	DefaultKeyTTL = time.Hour
)

// Main is the ledger-mcp program, so that tests can drive it in-process.
type Main struct {
	Command     []string // the upstream server's command line, after --
	UpstreamURL string
	DB          string
	LedgerURL   string
	Token       string // LEDGER_TOKEN
	Namespace   string
	Scope       string
	Lease       time.Duration
	Wait        time.Duration
	// UpstreamTimeout bounds the wait for the upstream's answer to a call.
	UpstreamTimeout time.Duration
	KeyTTL          time.Duration // of a ledger or namespace this start creates (SPEC §12)
	ServerName      string
	PolicyFile      string
	// ApprovalURL is the page where a person answers an ask ({seq}
	// replaced), named to the model (default: the ledger's /ui/).
	ApprovalURL string
	Listen      string
	// AdminListen serves the embedded ledger's REST API and web page, so
	// that a person can resolve its keys, with the admin token kept in
	// AdminTokenFile (default <db>.admin-token beside a SQLite --db).
	AdminListen    string
	AdminTokenFile string
	ExactReplays   bool
	// LedgerTimeout bounds each request to a --ledger, beyond a reserve's wait.
	LedgerTimeout time.Duration
	// SessionTimeout closes --listen sessions idle that long; MaxSessions
	// bounds how many are open at once.
	SessionTimeout time.Duration
	MaxSessions    int
	MetricsAddr    string
	// StateKeyFile holds the key of the requestState envelopes of multi
	// round-trip calls (default: the key kept in the ledger; see
	// loadStateKey).
	StateKeyFile string
	Log          logging.Flags // --log-level, --log-format

	Policy mcpgate.Policy
	Logger *slog.Logger
	// Stdin and Stdout carry MCP when no --listen is given.
	Stdin  io.ReadCloser
	Stdout io.WriteCloser
	stderr io.Writer

	closers   []func() error
	keyTTLSet bool
	ledger    *ledger.Ledger // the embedded ledger, for --admin-listen
	remote    *client.Client // the --ledger's client
	ns        *ledger.Namespace
	shared    storage.Shared // what the embedded ledger's database offers the gateways sharing it; nil on SQLite
	dbFile    string         // the embedded ledger's SQLite file
}

// NewMain returns a Main logging to stderr and serving MCP on the
// process's stdin and stdout.
func NewMain(stderr io.Writer) *Main {
	return &Main{Stdin: os.Stdin, Stdout: os.Stdout, stderr: stderr, Logger: slog.New(slog.NewTextHandler(stderr, nil))}
}

// errVersionShown means --version printed the version: exit 0, run nothing.
var errVersionShown = errors.New("version shown")

const usage = `Usage:
  ledger-mcp [flags] -- COMMAND [ARG...]    an MCP server started over stdio
  ledger-mcp [flags] --upstream URL         an MCP server over Streamable HTTP

ledger-mcp is an MCP proxy that records every side-effecting tool call in
the effect ledger before it runs (docs/spec.md §11): the same call runs once,
a repeat gets the recorded result back, and a call whose outcome is unknown
is never run again blindly. Read-only tools pass through unrecorded.

Put it where the agent had the MCP server: the server's command goes after
--. MCP goes over stdin and stdout (or HTTP at http://ADDR/mcp with
--listen); logs go to stderr.

The ledger is a SQLite file (by default one per server under
$XDG_STATE_HOME/effect-ledger/, ~/.local/state without it), a PostgreSQL
URL (--db), or a running ledgerd (--ledger URL, token from LEDGER_TOKEN).

Examples:
  ledger-mcp -- npx -y @modelcontextprotocol/server-memory
  ledger-mcp --ledger http://127.0.0.1:8080 --scope "$RUN_ID" -- python3 tools.py
  ledger-mcp --listen 127.0.0.1:8931 --upstream http://127.0.0.1:9000/mcp

Flags:
`

// ParseFlags reads the flags. With --version it prints the version and
// returns errVersionShown.
func (m *Main) ParseFlags(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("ledger-mcp", flag.ContinueOnError)
	fs.SetOutput(m.stderr)
	showVersion := fs.Bool("version", false, "print the build version and the contract versions implemented, then exit")
	fs.StringVar(&m.UpstreamURL, "upstream", "", "reach the MCP server at this Streamable HTTP `URL` instead of starting COMMAND")
	fs.StringVar(&m.DB, "db", "", "the embedded ledger: a SQLite `file` or a PostgreSQL URL (default $XDG_STATE_HOME/effect-ledger/mcp-<server-name>.db)")
	fs.StringVar(&m.LedgerURL, "ledger", "", "use the ledgerd at this `URL` instead of an embedded ledger (token from LEDGER_TOKEN)")
	fs.StringVar(&m.Namespace, "namespace", DefaultNamespace, "the ledger `namespace` (an embedded ledger creates it)")
	fs.StringVar(&m.Scope, "scope", "", "goes into every derived key: the same call in another `scope` is new work; \"session\": the MCP session's (stdio: this process; --listen: the Mcp-Session-Id)")
	fs.BoolVar(&m.ExactReplays, "exact-replays", false, "answer a replay exactly as it was recorded (for hosts that show _meta to the model); by default it starts with a text block saying it is a replay")
	fs.StringVar(&m.AdminListen, "admin-listen", "", "embedded ledger: serve its REST API and web page at http://`ADDR`, so a person can resolve keys and answer approvals with ledgerctl --server or /ui/; every request needs a token (the admin token of --admin-token-file)")
	fs.StringVar(&m.AdminTokenFile, "admin-token-file", "", "--admin-listen: the `file` that keeps its admin token, made (mode 0600) and printed once on first start (default <db>.admin-token beside a SQLite --db; required with a PostgreSQL --db)")
	fs.DurationVar(&m.Lease, "lease", mcpgate.DefaultLease, "how long a call holds its key; a call with no answer by then has an unknown outcome")
	fs.DurationVar(&m.UpstreamTimeout, "upstream-timeout", mcpgate.DefaultUpstreamTimeout, "how long a call waits for the upstream's answer; a call with none by then (or by the end of its --lease, if sooner) has an unknown outcome")
	fs.DurationVar(&m.KeyTTL, "key-ttl", DefaultKeyTTL, "embedded ledger: how long a finished call's key is remembered, for a ledger or --namespace this start creates (0: forever); an existing one keeps its own")
	fs.DurationVar(&m.Wait, "wait", mcpgate.DefaultWait, "how long a duplicate call waits for the same call in flight (at most 60s)")
	fs.StringVar(&m.ServerName, "server-name", "", "`name` that prefixes the ledger's tool names, <name>.<tool> (default: the upstream's serverInfo.name)")
	fs.StringVar(&m.PolicyFile, "policy", "", "JSON `file`: [{\"tool\": NAME_OR_GLOB, \"effect\": CLASS, \"idempotent\": BOOL}], first match overrides the tool's annotations; rules may carry the gate's approval, approvers, expires_in_ms, deny, repeat_failure, repeat_window_ms, reconcile ({\"rules\": [...], \"self_approval\": ...}), which an embedded ledger records as its policy, and a lookup {\"tool\": READ_ONLY_TOOL, \"arguments\": {...}} asked about an interrupted call")
	fs.StringVar(&m.ApprovalURL, "approval-url", "", "the web page where a person answers a call's approval, named to the model: `URL` with {seq} replaced by the ask's seq, or #approvals/SEQ appended (default: the --ledger's or --admin-listen's /ui/)")
	fs.StringVar(&m.Listen, "listen", "", "serve MCP over Streamable HTTP at http://`ADDR`/mcp instead of stdio")
	fs.DurationVar(&m.SessionTimeout, "session-timeout", mcpgate.DefaultSessionTimeout, "--listen: close a session that sent no request for this long (0: never)")
	fs.IntVar(&m.MaxSessions, "max-sessions", mcpgate.DefaultMaxSessions, "--listen: at most this many sessions open at once; a new one beyond is refused with 503 (0: no bound)")
	fs.DurationVar(&m.LedgerTimeout, "ledger-timeout", mcpgate.DefaultLedgerTimeout, "--ledger: how long a request to the ledgerd may take (a reserve: beyond its --wait) before the call is refused as ledger_unavailable")
	fs.StringVar(&m.StateKeyFile, "state-key-file", "", "`file` of the key that authenticates the requestState of calls that ask the user, created on first use; every gateway on one ledger needs the same (default: the key kept in the ledger, for --ledger the one of this gateway's token; an existing <db>.mcp-key beside a SQLite --db is still read)")
	fs.StringVar(&m.MetricsAddr, "metrics", "", "serve Prometheus metrics at http://`ADDR`/metrics")
	m.Log.Register(fs)
	fs.Usage = func() {
		fmt.Fprint(m.stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Fprint(m.Stdout, version.Read("ledger-mcp").String())
		return errVersionShown
	}
	m.Command = fs.Args()
	m.Token = os.Getenv("LEDGER_TOKEN")
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "key-ttl" {
			m.keyTTLSet = true
		}
	})
	if m.LedgerURL != "" && !m.keyTTLSet {
		m.KeyTTL = 0 // the default is an embedded ledger's
	}
	l, err := m.Log.Logger(m.stderr)
	if err != nil {
		return err
	}
	m.Logger = l
	return m.check()
}

// check validates the flags together.
func (m *Main) check() error {
	switch {
	case len(m.Command) == 0 && m.UpstreamURL == "":
		return errors.New("no upstream MCP server: give its command after -- (ledger-mcp [flags] -- COMMAND [ARG...]) or --upstream URL")
	case len(m.Command) > 0 && m.UpstreamURL != "":
		return fmt.Errorf("both --upstream and a command (%q): give one upstream server", strings.Join(m.Command, " "))
	case m.DB != "" && m.LedgerURL != "":
		return errors.New("--db and --ledger exclude each other: an embedded ledger or a remote one")
	case m.Lease < 10*time.Millisecond || m.Lease > 24*time.Hour:
		return fmt.Errorf("--lease must be between 10ms and 24h, not %s", m.Lease)
	case m.KeyTTL < 0 || m.KeyTTL%time.Millisecond != 0 || uint64(m.KeyTTL.Milliseconds()) > ledger.MaxKeyTTL:
		return fmt.Errorf("--key-ttl must be a whole number of milliseconds from 0 up, not %s", m.KeyTTL)
	case m.KeyTTL != 0 && m.LedgerURL != "":
		return errors.New("--key-ttl is for an embedded ledger: a remote ledger's namespaces have theirs (ledgerctl namespace create --key-ttl)")
	case m.AdminListen != "" && m.LedgerURL != "":
		return errors.New("--admin-listen serves an embedded ledger: with --ledger, a person resolves keys at that ledgerd")
	case m.AdminTokenFile != "" && m.AdminListen == "":
		return errors.New("--admin-token-file is the token of --admin-listen: give both")
	case m.UpstreamTimeout <= 0:
		return fmt.Errorf("--upstream-timeout must be positive, not %s", m.UpstreamTimeout)
	case m.LedgerTimeout <= 0:
		return fmt.Errorf("--ledger-timeout must be positive, not %s", m.LedgerTimeout)
	case m.SessionTimeout < 0:
		return fmt.Errorf("--session-timeout must not be negative, not %s", m.SessionTimeout)
	case m.MaxSessions < 0:
		return fmt.Errorf("--max-sessions must not be negative, not %d", m.MaxSessions)
	case m.Wait < 0 || m.Wait > mcpgate.MaxWait:
		return fmt.Errorf("--wait must be between 0 and 60s, not %s", m.Wait)
	case m.UpstreamURL != "" && !strings.HasPrefix(m.UpstreamURL, "http://") && !strings.HasPrefix(m.UpstreamURL, "https://"):
		return fmt.Errorf("--upstream %q must be an http:// or https:// URL", m.UpstreamURL)
	}
	for name, addr := range map[string]string{"--listen": m.Listen, "--admin-listen": m.AdminListen} {
		if addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("%s %q: %w", name, addr, err)
		}
	}
	if m.PolicyFile != "" {
		p, err := mcpgate.LoadPolicy(m.PolicyFile)
		if err != nil {
			return fmt.Errorf("--policy: %w", err)
		}
		m.Policy = p
		if m.LedgerURL != "" && p.HasGate() {
			return fmt.Errorf("--policy %s sets members of the ledger's gate (approval, approvers, expires_in_ms, deny, "+
				"repeat_failure, repeat_window_ms, reconcile, self_approval): with --ledger the gate is the ledgerd's policy, "+
				"set there with ledgerctl policy set %s FILE; keep only tool, effect, idempotent, on_error and lookup here", m.PolicyFile, m.Namespace)
		}
	}
	return nil
}

// stateDir is the user's state directory, $XDG_STATE_HOME or
// ~/.local/state.
func stateDir() (string, error) {
	if dir := os.Getenv("XDG_STATE_HOME"); dir != "" {
		return dir, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, ".local", "state"), nil
}

// defaultDB is the embedded ledger's file for a server: one per upstream
// server under the user's state directory, because an agent often starts
// MCP servers in a directory it cannot write.
func defaultDB(serverName string) (string, error) {
	dir, err := stateDir()
	if err != nil {
		return "", fmt.Errorf("default --db: %w (set XDG_STATE_HOME or --db)", err)
	}
	return filepath.Join(dir, "effect-ledger", "mcp-"+mcpgate.ToolNamePart(serverName)+".db"), nil
}

// Close releases what Run opened, last opened first.
func (m *Main) Close() error {
	var errs []error
	for i := len(m.closers) - 1; i >= 0; i-- {
		errs = append(errs, m.closers[i]())
	}
	m.closers = nil
	return errors.Join(errs...)
}
