package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"net/url"
	"os"
	"strings"
	"syscall"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/verify"
)

// sourceFlags are the flags that name what a command reads — a ledger
// file (--db) or a server (--server, --token) — and --json. Each command
// registers only the ones it uses.
type sourceFlags struct {
	db, server, token string
	json              bool
	hasDB, hasServer  bool
}

// registerDB adds --db.
func (s *sourceFlags) registerDB(fs *flag.FlagSet) {
	s.hasDB = true
	fs.StringVar(&s.db, "db", "", "SQLite ledger `file`, opened read-only (safe while ledgerd runs)")
}

// registerServer adds --server and --token.
func (s *sourceFlags) registerServer(fs *flag.FlagSet) {
	s.hasServer = true
	// The environment is read in check, so that --help never shows a
	// token and --db wins over LEDGERCTL_SERVER.
	fs.StringVar(&s.server, "server", "", "ledgerd base `URL`, e.g. http://127.0.0.1:8080; a bare HOST:PORT means http:// (env LEDGERCTL_SERVER)")
	fs.StringVar(&s.token, "token", "", "bearer `token` for --server (env LEDGERCTL_TOKEN)")
}

// registerSource adds --db, --server and --token.
func (s *sourceFlags) registerSource(fs *flag.FlagSet) {
	s.registerDB(fs)
	s.registerServer(fs)
}

// registerJSON adds --json.
func (s *sourceFlags) registerJSON(fs *flag.FlagSet) {
	fs.BoolVar(&s.json, "json", false, "print JSON")
}

// store is what the read commands need from a file or a server.
type store interface {
	verify.Source
	ListReceipts(ctx context.Context, f ledger.ReceiptFilter) ([]chain.Receipt, *uint64, error)
	GetKey(ctx context.Context, key string) (*ledger.KeyView, error)
	Head(ctx context.Context) (ledger.Head, error)
	Close() error
}

// fileStore adapts a read-only ledger file.
type fileStore struct{ *ledger.Reader }

func (f fileStore) Head(ctx context.Context) (ledger.Head, error) { return f.ReadHead(ctx) }

// serverStore adapts a server.
type serverStore struct{ *api.Client }

func (serverStore) Close() error { return nil }

var (
	_ store = fileStore{}
	_ store = serverStore{}
)

// check reports a usage problem with the source flags: exactly one of
// the registered --db and --server is needed.
func (s *sourceFlags) check() error {
	if s.hasServer {
		if s.server == "" && s.db == "" {
			s.server = os.Getenv("LEDGERCTL_SERVER")
		}
		if s.token == "" {
			s.token = os.Getenv("LEDGERCTL_TOKEN")
		}
	}
	switch {
	case s.db != "" && s.server != "":
		return errors.New("give --db or --server, not both")
	case s.db == "" && s.server == "" && s.hasDB && s.hasServer:
		return errors.New("give --db FILE or --server URL")
	case s.db == "" && s.hasDB && !s.hasServer:
		return errors.New("give --db FILE")
	case s.server == "" && s.hasServer && !s.hasDB:
		return errors.New("give --server URL")
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
	rd, c, err := s.openEither(ctx, fs, env)
	switch {
	case err != nil:
		return nil, err
	case rd != nil:
		return fileStore{rd}, nil
	}
	return serverStore{c}, nil
}

// openEither opens the file of --db read-only, or a client of --server.
func (s *sourceFlags) openEither(ctx context.Context, fs *flag.FlagSet, env *Env) (*ledger.Reader, *api.Client, error) {
	if err := s.check(); err != nil {
		return nil, nil, usageErr(fs, env, "%v", err)
	}
	if s.db != "" {
		if err := checkDBFile(s.db); err != nil {
			return nil, nil, err
		}
		rd, err := ledger.OpenReader(ctx, s.db, ledger.Options{})
		return rd, nil, err
	}
	c, err := s.client(fs, env)
	return nil, c, err
}

func (s *sourceFlags) client(fs *flag.FlagSet, env *Env) (*api.Client, error) {
	base, err := serverURL(s.server)
	if err != nil {
		return nil, usageErr(fs, env, "--server: %v", err)
	}
	c := api.NewClient(base)
	c.Token = s.token
	return c, nil
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

// checkDBFile says clearly when --db names no ledger file. It never
// creates anything.
func checkDBFile(path string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, iofs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("no ledger database at %s (start ledgerd --db %s to create one)", path, path)
	case err != nil:
		return fmt.Errorf("--db %s: %w", path, err)
	case fi.IsDir():
		return fmt.Errorf("--db %s is a directory, not a ledger database file", path)
	}
	return nil
}

// parse parses args with fs, printing usage text with examples on error.
// Flags may come before or after positional arguments, which it returns.
func parse(fs *flag.FlagSet, env *Env, args []string, summary, examples string) ([]string, error) {
	setUsage(fs, env, summary, examples)
	return parseArgs(fs, args)
}

// setUsage makes fs print its usage text, flags and examples on env.Stderr.
func setUsage(fs *flag.FlagSet, env *Env, summary, examples string) {
	fs.SetOutput(env.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(env.Stderr, "%s\n\nFlags:\n", summary)
		printFlags(env.Stderr, fs)
		fmt.Fprintf(env.Stderr, "\nExamples:\n%s", examples)
	}
}

// printFlags lists fs's flags as flag.PrintDefaults does, but spelled
// with two dashes, the way the messages and the documentation name them.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		switch f.DefValue {
		case "", "false", "0":
		default:
			line += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintln(w, line)
	})
}

// parseArgs parses args with fs; flags may come before or after the
// positional arguments, which it returns.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, errUsage
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// usageErr prints msg and the command's usage and returns errUsage.
func usageErr(fs *flag.FlagSet, env *Env, format string, args ...any) error {
	fmt.Fprintf(env.Stderr, "ledgerctl %s: %s\n\n", fs.Name(), fmt.Sprintf(format, args...))
	fs.Usage()
	return errUsage
}

// writeJSON prints v as compact JSON without HTML escaping, so that
// embedded results keep their stored bytes.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// plural returns "1 receipt" or "2 receipts": n and the noun in the
// right number.
func plural[N ~int | ~int64 | ~uint64](n N, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// short abbreviates a hash for tables.
func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// cell makes a string safe for one table cell.
func cell(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '·'
		}
		return r
	}, s)
	if s == "" {
		return "-"
	}
	if len(s) > 60 {
		return s[:57] + "…"
	}
	return s
}
