package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// TokenCommand runs `ledgerctl token create|list|revoke`.
type TokenCommand struct{ *Env }

const tokenUsage = `Usage:
  ledgerctl token create --db FILE --role reader|writer|admin --name NAME [--json]
  ledgerctl token list   --db FILE [--json]
  ledgerctl token revoke --db FILE NAME

API bearer tokens live in the ledger file (only their SHA-256 is stored; a
token is printed once, at creation). Roles: writer (reserve, commit), reader
(every GET), admin (resolve, and everything). While any valid token exists,
ledgerd requires one on every API request and records its name as actor.
Changes take effect without a restart; this may run while ledgerd runs.
"ledgerctl token <create|list|revoke> --help" shows each one's flags.
`

// Run dispatches the token subcommands, each with its own flags.
func (c *TokenCommand) Run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprintf(c.Stderr, "ledgerctl token: want create, list or revoke\n\n%s", tokenUsage)
		return errUsage
	}
	switch args[0] {
	case "create":
		return c.create(ctx, args[1:])
	case "list":
		return c.list(ctx, args[1:])
	case "revoke":
		return c.revoke(ctx, args[1:])
	case "-h", "-help", "--help", "help":
		fmt.Fprint(c.Stderr, tokenUsage)
		return flag.ErrHelp
	}
	fmt.Fprintf(c.Stderr, "ledgerctl token: unknown token command %q (want create, list or revoke)\n\n%s", args[0], tokenUsage)
	return errUsage
}

// openTokens opens the tokens of the --db file, which must exist.
func openTokens(ctx context.Context, fs *flag.FlagSet, env *Env, db string) (*ledger.Tokens, error) {
	if db == "" {
		return nil, usageErr(fs, env, "give --db FILE")
	}
	if err := checkDBFile(db); err != nil {
		return nil, err
	}
	return ledger.OpenTokens(ctx, db)
}

func (c *TokenCommand) create(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("token create", flag.ContinueOnError)
	db := fs.String("db", "", "SQLite ledger `file`")
	role := fs.String("role", "", "`role` of the token: reader, writer or admin (required)")
	name := fs.String("name", "", "`name` recorded as actor on the receipts the token causes (required)")
	asJSON := fs.Bool("json", false, "print JSON: name, role and token")
	pos, err := parse(fs, c.Env, args, "Usage: ledgerctl token create --db FILE --role reader|writer|admin --name NAME [--json]\n\nCreates an API bearer token and prints it once (on stdout; only its SHA-256\nis stored). Roles: writer (reserve, commit), reader (every GET), admin\n(resolve, and everything). The first valid token turns authentication on.",
		"  ledgerctl token create --db ledger.db --role writer --name gateway-eu\n  LEDGER_TOKEN=$(ledgerctl token create --db ledger.db --role admin --name ops-alice)\n")
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr(fs, c.Env, "unexpected arguments %q", pos)
	}
	if *name == "" || *role == "" {
		return usageErr(fs, c.Env, "give --role and --name")
	}
	if *role != ledger.RoleReader && *role != ledger.RoleWriter && *role != ledger.RoleAdmin {
		return usageErr(fs, c.Env, "--role must be %s, %s or %s, got %q", ledger.RoleReader, ledger.RoleWriter, ledger.RoleAdmin, *role)
	}
	if len(*name) > 128 || strings.IndexFunc(*name, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
		return usageErr(fs, c.Env, "--name must be 1–128 bytes of visible ASCII (no spaces), got %q", *name)
	}
	t, err := openTokens(ctx, fs, c.Env, *db)
	if err != nil {
		return err
	}
	defer t.Close()
	tok, err := t.Create(ctx, *name, *role)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(c.Stdout, map[string]string{"name": *name, "role": *role, "token": tok})
	}
	fmt.Fprintf(c.Stderr, "token %q (%s) created; it is shown only now:\n", *name, *role)
	_, err = fmt.Fprintln(c.Stdout, tok)
	return err
}

func (c *TokenCommand) list(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("token list", flag.ContinueOnError)
	db := fs.String("db", "", "SQLite ledger `file`")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, c.Env, args, "Usage: ledgerctl token list --db FILE [--json]\n\nLists the API tokens: name, role, creation time and whether revoked (never\nthe tokens themselves).",
		"  ledgerctl token list --db ledger.db\n")
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr(fs, c.Env, "unexpected arguments %q", pos)
	}
	t, err := openTokens(ctx, fs, c.Env, *db)
	if err != nil {
		return err
	}
	defer t.Close()
	list, err := t.List(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		if list == nil {
			list = []ledger.TokenInfo{}
		}
		return writeJSON(c.Stdout, list)
	}
	tw := tabwriter.NewWriter(c.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tROLE\tCREATED\tSTATUS")
	for _, ti := range list {
		status := "valid"
		if ti.RevokedAt != 0 {
			status = "revoked " + time.UnixMilli(ti.RevokedAt).UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", cell(ti.Name), ti.Role, time.UnixMilli(ti.CreatedAt).UTC().Format(time.RFC3339), status)
	}
	return tw.Flush()
}

func (c *TokenCommand) revoke(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("token revoke", flag.ContinueOnError)
	db := fs.String("db", "", "SQLite ledger `file`")
	pos, err := parse(fs, c.Env, args, "Usage: ledgerctl token revoke --db FILE NAME\n\nRevokes the token named NAME; a running ledgerd refuses it on the next request.",
		"  ledgerctl token revoke --db ledger.db gateway-eu\n")
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr(fs, c.Env, "want exactly one NAME")
	}
	t, err := openTokens(ctx, fs, c.Env, *db)
	if err != nil {
		return err
	}
	defer t.Close()
	if err := t.Revoke(ctx, pos[0]); err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.Stdout, "token %q revoked\n", pos[0])
	return err
}
