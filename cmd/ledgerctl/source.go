package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage"
	"github.com/effect-ledger/effect-ledger/verify"
)

// sourceFlags are the flags that name what a command reads — a ledger
// database (--db: a SQLite file or a PostgreSQL URL) or a server
// (--server, --token) — the namespace (--namespace) and --json. Each
// command registers only the ones it uses. --namespace has the short
// form -n wherever it is taken.
type sourceFlags struct {
	db, server, token string
	namespace         string
	json              bool
	hasDB, hasServer  bool
}

// dbUsage is the help text of --db for the read commands.
const dbUsage = "ledger `database`: a SQLite file or a PostgreSQL URL (postgres://user:pass@host/db), opened read-only (safe while ledgerd runs)"

// The flags every command shares are declared here alone, each with the
// command's own help text: --db, --namespace and --json.

// declareDB declares --db into p.
func declareDB(fs *flag.FlagSet, p *string, usage string) { fs.StringVar(p, "db", "", usage) }

// dbFlag declares --db.
func dbFlag(fs *flag.FlagSet, usage string) *string {
	p := new(string)
	declareDB(fs, p, usage)
	return p
}

// declareNamespace declares --namespace and its short form -n into p,
// def by default: every command that takes a namespace by flag takes it
// both ways.
func declareNamespace(fs *flag.FlagSet, p *string, def, usage string) {
	fs.StringVar(p, "namespace", def, usage)
	fs.StringVar(p, "n", def, "short for --namespace")
}

// namespaceFlag declares --namespace (and -n), def by default.
func namespaceFlag(fs *flag.FlagSet, def, usage string) *string {
	p := new(string)
	declareNamespace(fs, p, def, usage)
	return p
}

// declareJSON declares --json into p, def by default.
func declareJSON(fs *flag.FlagSet, p *bool, def bool, usage string) {
	fs.BoolVar(p, "json", def, usage)
}

// jsonFlag declares --json, off by default.
func jsonFlag(fs *flag.FlagSet, usage string) *bool {
	p := new(bool)
	declareJSON(fs, p, false, usage)
	return p
}

// registerDB adds --db.
func (s *sourceFlags) registerDB(fs *flag.FlagSet) {
	s.hasDB = true
	declareDB(fs, &s.db, dbUsage)
}

// registerNamespace adds --namespace and -n.
func (s *sourceFlags) registerNamespace(fs *flag.FlagSet) {
	declareNamespace(fs, &s.namespace, ledger.DefaultNamespace, "the `namespace` to read (each namespace is a chain of its own)")
}

// ns returns the --namespace value, default when the command has none.
func (s *sourceFlags) ns() string {
	if s.namespace == "" {
		return ledger.DefaultNamespace
	}
	return s.namespace
}

// registerServer adds --server and --token.
func (s *sourceFlags) registerServer(fs *flag.FlagSet) {
	s.hasServer = true
	// The environment is read in check, so that --help never shows a
	// token and --db wins over LEDGERCTL_SERVER.
	fs.StringVar(&s.server, "server", "", "ledgerd base `URL`, e.g. http://127.0.0.1:8080; a bare HOST:PORT means http:// (env LEDGERCTL_SERVER)")
	fs.StringVar(&s.token, "token", "", "bearer `token` for --server (env LEDGERCTL_TOKEN, else LEDGER_TOKEN)")
}

// registerSource adds --db, --server and --token.
func (s *sourceFlags) registerSource(fs *flag.FlagSet) {
	s.registerDB(fs)
	s.registerServer(fs)
}

// registerJSON adds --json.
func (s *sourceFlags) registerJSON(fs *flag.FlagSet) {
	declareJSON(fs, &s.json, false, "print JSON")
}

// readFlags returns the flag set of the read command name with the
// flags every read command takes: --db, --server, --token, --namespace
// and --json.
func readFlags(name string) (*flag.FlagSet, *sourceFlags) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	src := new(sourceFlags)
	src.registerSource(fs)
	src.registerNamespace(fs)
	src.registerJSON(fs)
	return fs, src
}

// store is what the read commands need from a file or a server.
type store interface {
	verify.Source
	// verifier returns a Verifier of the store: of a database, or of a
	// server, each with what it can answer.
	verifier(ctx context.Context, opts verify.Opts) (*verify.Verifier, error)
	ListReceipts(ctx context.Context, f ledger.ReceiptFilter) ([]chain.Receipt, *uint64, error)
	// Key returns a key's state with its expiry and the current
	// generation's receipts, or all of them with history (SPEC §12).
	Key(ctx context.Context, key string, history bool) (*ledger.KeyView, error)
	Head(ctx context.Context) (ledger.Head, error)
	Close() error
}

// checkWith runs st's verifier with opts.
func checkWith(ctx context.Context, st store, opts verify.Opts) (*verify.Report, error) {
	v, err := st.verifier(ctx, opts)
	if err != nil {
		return nil, err
	}
	return v.Check(ctx)
}

// fileStore adapts one namespace of a database opened read-only.
type fileStore struct {
	ledger.Chain
	db ledger.Store // closed by Close; nil when someone else closes it
}

// kept is the namespace as its readers see it once pruned (SPEC §16):
// 410 for a pruned receipt or key, hashes over deleted bodies from the
// kept ones. The verifier reads the chain itself.
func (f fileStore) kept() ledger.Chain { return ledger.KeptChain(f.Chain) }

// verifier tells the verifier which actors are admin tokens of the
// database (revoked ones too: what they did stays theirs), who may
// reconcile another actor's reserve (SPEC §15).
func (f fileStore) verifier(ctx context.Context, opts verify.Opts) (*verify.Verifier, error) {
	if f.db != nil {
		rows, err := f.db.Tokens().ListTokens(ctx)
		if err != nil {
			return nil, fmt.Errorf("read the tokens: %w", err)
		}
		admins := map[string]bool{}
		for _, t := range rows {
			if t.Role == ledger.RoleAdmin {
				admins[t.Name] = true
			}
		}
		opts.Admin = func(actor string) bool { return admins[actor] }
	}
	return verify.New(f.Chain, opts), nil
}

// Close closes the database.
func (f fileStore) Close() error {
	if f.db == nil {
		return nil
	}
	return f.db.Close()
}

// Key reads a key as the API serves it (ledger.ReadKey), with the
// key_ttl_ms stored with the namespace.
func (f fileStore) Key(ctx context.Context, key string, history bool) (*ledger.KeyView, error) {
	ttl, err := f.KeyTTL(ctx)
	if err != nil {
		return nil, err
	}
	v, err := ledger.ReadKey(ctx, f.kept(), key, ttl, uint64(time.Now().UnixMilli()), history)
	if err != nil {
		return nil, err
	}
	v.Receipts = slices.Clone(v.Receipts)
	return v, ledger.ShowPayloads(ctx, f.Chain, v.Receipts)
}

// The read commands show a committed namespace's receipts with their
// values, as the API does (SPEC §14); the verifier reads f.Chain, in its
// chain form.

// ListReceipts lists receipts by filter, with their values.
func (f fileStore) ListReceipts(ctx context.Context, flt ledger.ReceiptFilter) ([]chain.Receipt, *uint64, error) {
	rs, next, err := f.kept().ListReceipts(ctx, flt)
	if err != nil {
		return nil, nil, err
	}
	return rs, next, ledger.ShowPayloads(ctx, f.Chain, rs)
}

// exportBatch is how many receipts Receipts reads the values of at once.
const exportBatch = 512

// Receipts yields the receipts after seq with their values.
func (f fileStore) Receipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	batch := make([]chain.Receipt, 0, exportBatch)
	flush := func() error {
		if err := ledger.ShowPayloads(ctx, f.Chain, batch); err != nil {
			return err
		}
		for i := range batch {
			if err := fn(&batch[i]); err != nil {
				return err
			}
		}
		batch = batch[:0]
		return nil
	}
	if err := f.Chain.Receipts(ctx, after, func(r *chain.Receipt) error {
		batch = append(batch, *r)
		if len(batch) == exportBatch {
			return flush()
		}
		return nil
	}); err != nil {
		return err
	}
	return flush()
}

var (
	_ store = fileStore{}
	_ store = (*server)(nil)
)

// serverToken is the bearer token for --server: the --token flag, else
// LEDGERCTL_TOKEN, else LEDGER_TOKEN (the name the clients, the examples
// and ledger-mcp read), so one exported token serves every tool.
func serverToken(flag string) string {
	for _, v := range []string{flag, os.Getenv("LEDGERCTL_TOKEN"), os.Getenv("LEDGER_TOKEN")} {
		if v != "" {
			return v
		}
	}
	return ""
}

// check reports a usage problem with the source flags: exactly one of
// the registered --db and --server is needed, and a valid --namespace.
func (s *sourceFlags) check() error {
	if !ledger.ValidNamespace(s.ns()) {
		return fmt.Errorf("--namespace %q: names are 1–64 bytes of a-z 0-9 . _ -", s.ns())
	}
	if s.hasServer {
		if s.server == "" && s.db == "" {
			s.server = os.Getenv("LEDGERCTL_SERVER")
		}
		s.token = serverToken(s.token)
	}
	switch {
	case s.db != "" && s.server != "":
		return errors.New("give --db or --server, not both")
	case s.db == "" && s.server == "" && s.hasDB && s.hasServer:
		return errors.New("give --db FILE|URL or --server URL")
	case s.db == "" && s.hasDB && !s.hasServer:
		return errors.New("give --db FILE|URL")
	case s.server == "" && s.hasServer && !s.hasDB:
		return errors.New("give --server URL")
	}
	return nil
}

// parseAndOpen parses args (parse) and opens the store the flags name
// (openNoArgs), for the commands that check nothing in between.
func (s *sourceFlags) parseAndOpen(ctx context.Context, fs *flag.FlagSet, env *Env, args []string, summary, examples string) (store, error) {
	pos, err := parse(fs, env, args, summary, examples)
	if err != nil {
		return nil, err
	}
	return s.openNoArgs(ctx, fs, env, pos)
}

// checkNoArgs is check for the commands that take no positional
// arguments; either fault is a usage error of fs.
func (s *sourceFlags) checkNoArgs(fs *flag.FlagSet, env *Env, pos []string) error {
	if len(pos) > 0 {
		return usageErr(fs, env, "unexpected arguments %q", pos)
	}
	if err := s.check(); err != nil {
		return usageErr(fs, env, "%v", err)
	}
	return nil
}

// openNoArgs is open for commands that take no positional arguments.
func (s *sourceFlags) openNoArgs(ctx context.Context, fs *flag.FlagSet, env *Env, pos []string) (store, error) {
	if len(pos) > 0 {
		return nil, usageErr(fs, env, "unexpected arguments %q", pos)
	}
	return s.open(ctx, fs, env)
}

// open returns the store named by the flags; a bad combination of flags
// is a usage error of the command fs.
func (s *sourceFlags) open(ctx context.Context, fs *flag.FlagSet, env *Env) (store, error) {
	fsrc, c, err := s.openEither(ctx, fs, env)
	switch {
	case err != nil:
		return nil, err
	case c == nil:
		return fsrc, nil
	}
	return c, nil
}

// openEither opens the --namespace of the --db database read-only, or a
// client of --server for it.
func (s *sourceFlags) openEither(ctx context.Context, fs *flag.FlagSet, env *Env) (fileStore, *server, error) {
	if err := s.check(); err != nil {
		return fileStore{}, nil, usageErr(fs, env, "%v", err)
	}
	if s.db != "" {
		st, err := openDB(ctx, s.db, env, true)
		if err != nil {
			return fileStore{}, nil, err
		}
		c, err := chainOf(ctx, st, s.db, s.ns())
		if err != nil {
			_ = st.Close()
			return fileStore{}, nil, err
		}
		return fileStore{Chain: c, db: st}, nil, nil
	}
	c, err := s.client(fs, env)
	return fileStore{}, c, err
}

// openDB opens the database named by --db: a PostgreSQL URL, or a SQLite
// file that must exist. readOnly opens it for reading only (SQLite: no
// lock is taken, so it may run beside ledgerd). Errors never show a
// password of the URL.
func openDB(ctx context.Context, dsn string, env *Env, readOnly bool) (ledger.Store, error) {
	if err := checkDB(dsn); err != nil {
		return nil, err
	}
	st, _, err := storage.Open(ctx, dsn, storage.Options{ReadOnly: readOnly, Logger: warnLogger(env)})
	if err != nil {
		return nil, storage.RedactError(dsn, fmt.Errorf("open %s: %w", storage.Describe(dsn), err))
	}
	return st, nil
}

// chainOf returns namespace ns of st, saying clearly when it does not exist.
func chainOf(ctx context.Context, st ledger.Store, dsn, ns string) (ledger.Chain, error) {
	c, err := st.Chain(ctx, ns)
	if errors.Is(err, ledger.ErrUnknownNamespace) {
		return nil, fmt.Errorf("no namespace %q in %s (ledgerctl namespace list shows the namespaces)", ns, storage.Describe(dsn))
	}
	if err != nil {
		return nil, storage.RedactError(dsn, fmt.Errorf("namespace %s: %w", ns, err))
	}
	return c, nil
}

// client returns the server of --server in --namespace.
func (s *sourceFlags) client(fs *flag.FlagSet, env *Env) (*server, error) {
	base, err := serverURL(s.server)
	if err != nil {
		return nil, usageErr(fs, env, "--server: %v", err)
	}
	return newServer(base, s.token, s.ns())
}

// serverURL checks a --server value and returns the base URL. A bare
// HOST:PORT means http://HOST:PORT.
func serverURL(s string) (string, error) {
	if s == "" {
		return "", errors.New("empty URL")
	}
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("%q is not a URL; give http://HOST:PORT (or https://…)", s)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("scheme %q: give http://HOST:PORT or https://HOST:PORT", u.Scheme)
	case u.Host == "":
		return "", fmt.Errorf("%q has no host; give http://HOST:PORT", s)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return "", fmt.Errorf("%q: give http://HOST:PORT (or https://), with an optional path prefix and nothing else", s)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// checkDB says clearly when --db names no SQLite ledger file, and how
// to create one; a PostgreSQL URL passes (its server answers for it).
func checkDB(dsn string) error {
	err := storage.CheckFile(dsn)
	switch {
	case errors.Is(err, storage.ErrNoFiles):
		return nil
	case errors.Is(err, storage.ErrNoDatabase):
		return fmt.Errorf("%w (start ledgerd --db %s to create one)", err, dsn)
	}
	return err
}

// warnLogger logs a driver's warnings on env.Stderr.
func warnLogger(env *Env) *slog.Logger {
	return slog.New(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
