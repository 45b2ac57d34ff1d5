package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/verify"
)

// sourceFlags are --db, --server and --token, shared by the commands.
type sourceFlags struct {
	db, server, token string
	json              bool
}

func (s *sourceFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.db, "db", "", "SQLite ledger `file`, opened read-only (safe while ledgerd runs)")
	fs.StringVar(&s.server, "server", os.Getenv("LEDGERCTL_SERVER"), "ledgerd base `URL` (env LEDGERCTL_SERVER)")
	fs.StringVar(&s.token, "token", os.Getenv("LEDGERCTL_TOKEN"), "bearer `token` for --server (env LEDGERCTL_TOKEN)")
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
// --db and --server is needed.
func (s *sourceFlags) check() error {
	switch {
	case s.db != "" && s.server != "":
		return errors.New("give --db or --server, not both")
	case s.db == "" && s.server == "":
		return errors.New("give --db FILE or --server URL")
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
	if err := s.check(); err != nil {
		return nil, usageErr(fs, env, "%v", err)
	}
	if s.db != "" {
		if _, err := os.Stat(s.db); err != nil {
			return nil, fmt.Errorf("--db: %w", err)
		}
		rd, err := ledger.OpenReader(ctx, s.db, ledger.Options{})
		if err != nil {
			return nil, err
		}
		return fileStore{rd}, nil
	}
	c := api.NewClient(s.server)
	c.Token = s.token
	return serverStore{c}, nil
}

// parse parses args with fs, printing usage text with examples on error.
// Flags may come before or after positional arguments, which it returns.
func parse(fs *flag.FlagSet, env *Env, args []string, summary, examples string) ([]string, error) {
	fs.SetOutput(env.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(env.Stderr, "%s\n\nFlags:\n", summary)
		fs.PrintDefaults()
		fmt.Fprintf(env.Stderr, "\nExamples:\n%s", examples)
	}
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
