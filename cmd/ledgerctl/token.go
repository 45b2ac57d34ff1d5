package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage"
)

// TokenCommand runs `ledgerctl token create|list|revoke`.
type TokenCommand struct{ *Env }

const tokenUsage = `Usage:
  ledgerctl token create --db FILE|URL --role reader|writer|approver|admin --name NAME [--namespace NS,…] [--json]
  ledgerctl token list   --db FILE|URL [--json]
  ledgerctl token revoke --db FILE|URL NAME

API bearer tokens live in the ledger database (the SQLite ledger file, or the
PostgreSQL database; only their SHA-256 is stored; a token is printed once, at
creation). Roles: writer (reserve, commit), reader (every GET), approver
(every GET, and answering the asks of approvals: ledgerctl approvals, the
web page), admin (resolve, policy, and everything). --namespace (-n) limits
a token to some namespaces: on any other it gets 403 forbidden. While any
valid token exists, ledgerd requires one on every API request and records
its name as actor. Changes take effect without a restart; this may run while
ledgerd runs.
"ledgerctl token <create|list|revoke> --help" shows each one's flags.
`

// Run dispatches the token subcommands, each with its own flags.
func (c *TokenCommand) Run(ctx context.Context, args []string) error {
	return dispatch(ctx, c.Env, "token", tokenUsage, args, []subcommand{
		{"create", c.create}, {"list", c.list}, {"revoke", c.revoke}})
}

// subcommand is one subcommand of a command group.
type subcommand struct {
	name string
	run  func(ctx context.Context, args []string) error
}

// dispatch runs the subcommand args[0] of group, or explains the group's
// usage.
func dispatch(ctx context.Context, env *Env, group, usage string, args []string, subs []subcommand) error {
	names := make([]string, len(subs))
	for i, sc := range subs {
		names[i] = sc.name
	}
	want := names[0]
	if len(names) > 1 {
		want = strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
	}
	if len(args) == 0 {
		fmt.Fprintf(env.Stderr, "ledgerctl %s: want %s\n\n%s", group, want, usage)
		return errUsage
	}
	for _, sc := range subs {
		if args[0] == sc.name {
			return sc.run(ctx, args[1:])
		}
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(env.Stderr, usage)
		return flag.ErrHelp
	}
	fmt.Fprintf(env.Stderr, "ledgerctl %s: unknown %s command %q (want %s)\n\n%s", group, group, args[0], want, usage)
	return errUsage
}

// tokenDBUsage is the help text of the token commands' --db.
const tokenDBUsage = "ledger `database`: a SQLite file (may be served by a running ledgerd) or a PostgreSQL URL (postgres://user:pass@host/db)"

// openTokens opens the tokens of the --db database, which must exist
// (storage.OpenTokens). close releases what it opened.
func openTokens(ctx context.Context, fs *flag.FlagSet, env *Env, db string) (t *ledger.Tokens, close func() error, err error) {
	if db == "" {
		return nil, nil, usageErr(fs, env, "give --db FILE|URL")
	}
	if err := checkDB(db); err != nil {
		return nil, nil, err
	}
	t, err = storage.OpenTokens(ctx, db, storage.Options{Logger: warnLogger(env)})
	if err != nil {
		return nil, nil, err
	}
	return t, t.Close, nil
}

// parseNamespaces checks a --namespace list: names separated by commas.
func parseNamespaces(list string) ([]string, error) {
	if list == "" {
		return nil, nil
	}
	var out []string
	for _, ns := range strings.Split(list, ",") {
		ns = strings.TrimSpace(ns)
		if !ledger.ValidNamespace(ns) {
			return nil, fmt.Errorf("--namespace: %q is not a namespace name (1–64 bytes of a-z 0-9 . _ -, separated by commas)", ns)
		}
		if !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	return out, nil
}

// warnMissingNamespaces says on stderr which of names the database does
// not have (yet): a token may be made before its namespace, but a typo
// would make a token that can do nothing.
func warnMissingNamespaces(ctx context.Context, env *Env, db string, names []string) {
	if len(names) == 0 {
		return
	}
	st, err := openDB(ctx, db, env, true)
	if err != nil {
		return
	}
	defer func() { _ = st.Close() }()
	have, err := st.Namespaces(ctx)
	if err != nil {
		return
	}
	for _, ns := range names {
		if !slices.Contains(have, ns) {
			fmt.Fprintf(env.Stderr, "ledgerctl token create: warning: namespace %q does not exist yet (ledgerctl namespace create)\n", ns)
		}
	}
}

func (c *TokenCommand) create(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("token create", flag.ContinueOnError)
	db := dbFlag(fs, tokenDBUsage)
	role := fs.String("role", "", "`role` of the token: reader, writer, approver or admin (required)")
	name := fs.String("name", "", "`name` recorded as actor on the receipts the token causes (required)")
	nsList := namespaceFlag(fs, "", "limit the token to these `namespaces` (comma-separated, e.g. payments,mail); default every namespace")
	asJSON := jsonFlag(fs, "print JSON: name, role, namespaces and token")
	if err := parseNoArgs(fs, c.Env, args, "Usage: ledgerctl token create --db FILE|URL --role reader|writer|approver|admin --name NAME [--namespace NS,…] [--json]\n\nCreates an API bearer token and prints it once (on stdout; only its SHA-256\nis stored). Roles: writer (reserve, commit), reader (every GET), approver\n(every GET, and answering approvals), admin (resolve, policy, and\neverything). With --namespace (-n) the token may use only those namespaces\n(any other, \"default\" included unless listed, is 403 forbidden). The first\nvalid token turns authentication on.",
		"  ledgerctl token create --db ledger.db --role writer --name gateway-eu\n  LEDGER_TOKEN=$(ledgerctl token create --db ledger.db --role admin --name ops-alice)\n  ledgerctl token create --db ledger.db --role writer --name payments-gw --namespace payments,refunds\n"); err != nil {
		return err
	}
	if *name == "" || *role == "" {
		return usageErr(fs, c.Env, "give --role and --name")
	}
	if *role != ledger.RoleReader && *role != ledger.RoleWriter && *role != ledger.RoleAdmin && *role != ledger.RoleApprover {
		return usageErr(fs, c.Env, "--role must be %s, %s, %s or %s, got %q", ledger.RoleReader, ledger.RoleWriter, ledger.RoleApprover, ledger.RoleAdmin, *role)
	}
	if len(*name) > 128 || strings.IndexFunc(*name, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
		return usageErr(fs, c.Env, "--name must be 1–128 bytes of visible ASCII (no spaces), got %q", *name)
	}
	namespaces, err := parseNamespaces(*nsList)
	if err != nil {
		return usageErr(fs, c.Env, "%v", err)
	}
	t, closeTokens, err := openTokens(ctx, fs, c.Env, *db)
	if err != nil {
		return err
	}
	defer func() { _ = closeTokens() }()
	tok, err := t.Create(ctx, *name, *role, namespaces...)
	if err != nil {
		return storage.RedactError(*db, err)
	}
	warnMissingNamespaces(ctx, c.Env, *db, namespaces)
	if namespaces == nil {
		namespaces = []string{}
	}
	if *asJSON {
		return writeJSON(c.Stdout, map[string]any{"name": *name, "role": *role, "namespaces": namespaces, "token": tok})
	}
	scope := "every namespace"
	if len(namespaces) > 0 {
		scope = "namespaces " + strings.Join(namespaces, ", ")
	}
	fmt.Fprintf(c.Stderr, "token %q (%s, %s) created; it is shown only now:\n", *name, *role, scope)
	_, err = fmt.Fprintln(c.Stdout, tok)
	return err
}

func (c *TokenCommand) list(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("token list", flag.ContinueOnError)
	db := dbFlag(fs, tokenDBUsage)
	asJSON := jsonFlag(fs, "print JSON")
	if err := parseNoArgs(fs, c.Env, args, "Usage: ledgerctl token list --db FILE|URL [--json]\n\nLists the API tokens: name, role, the namespaces it is limited to (* for\nevery namespace), creation time and whether revoked (never the tokens\nthemselves).",
		"  ledgerctl token list --db ledger.db\n"); err != nil {
		return err
	}
	t, closeTokens, err := openTokens(ctx, fs, c.Env, *db)
	if err != nil {
		return err
	}
	defer func() { _ = closeTokens() }()
	list, err := t.List(ctx)
	if err != nil {
		return storage.RedactError(*db, err)
	}
	if *asJSON {
		if list == nil {
			list = []ledger.TokenInfo{}
		}
		return writeJSON(c.Stdout, list)
	}
	tw := tabwriter.NewWriter(c.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tROLE\tNAMESPACES\tCREATED\tSTATUS")
	for _, ti := range list {
		status := "valid"
		if ti.RevokedAt != 0 {
			status = "revoked " + time.UnixMilli(ti.RevokedAt).UTC().Format(time.RFC3339)
		}
		scope := "*"
		if len(ti.Namespaces) > 0 {
			scope = strings.Join(ti.Namespaces, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", cell(ti.Name), ti.Role, scope, time.UnixMilli(ti.CreatedAt).UTC().Format(time.RFC3339), status)
	}
	return tw.Flush()
}

func (c *TokenCommand) revoke(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("token revoke", flag.ContinueOnError)
	db := dbFlag(fs, tokenDBUsage)
	pos, err := parse(fs, c.Env, args, "Usage: ledgerctl token revoke --db FILE|URL NAME\n\nRevokes the token named NAME; a running ledgerd refuses it on the next request.",
		"  ledgerctl token revoke --db ledger.db gateway-eu\n")
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr(fs, c.Env, "want exactly one NAME")
	}
	t, closeTokens, err := openTokens(ctx, fs, c.Env, *db)
	if err != nil {
		return err
	}
	defer func() { _ = closeTokens() }()
	if err := t.Revoke(ctx, pos[0]); err != nil {
		return storage.RedactError(*db, err)
	}
	_, err = fmt.Fprintf(c.Stdout, "token %q revoked\n", pos[0])
	return err
}
