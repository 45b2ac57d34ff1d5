package main

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// TokenCommand runs `ledgerctl token create|list|revoke`.
type TokenCommand struct{ *Env }

const tokenUsage = `Usage:
  ledgerctl token create --db FILE --role reader|writer|admin --name NAME
  ledgerctl token list   --db FILE [--json]
  ledgerctl token revoke --db FILE NAME

API bearer tokens live in the ledger file (only their SHA-256 is stored; a
token is printed once, at creation). Roles: writer (reserve, commit), reader
(every GET), admin (resolve, and everything). While any valid token exists,
ledgerd requires one on every API request and records its name as actor.
Changes take effect without a restart; this may run while ledgerd runs.`

const tokenExamples = `  ledgerctl token create --db ledger.db --role writer --name gateway-eu
  ledgerctl token list --db ledger.db
  ledgerctl token revoke --db ledger.db gateway-eu
`

// Run dispatches the token subcommands.
func (c *TokenCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	db := fs.String("db", "", "SQLite ledger `file`")
	role := fs.String("role", "", "create: `role` of the token (reader, writer or admin)")
	name := fs.String("name", "", "create: `name` recorded as actor on the receipts the token causes")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, c.Env, args, tokenUsage, tokenExamples)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageErr(fs, c.Env, "want create, list or revoke")
	}
	if *db == "" {
		return usageErr(fs, c.Env, "--db is required")
	}
	t, err := ledger.OpenTokens(ctx, *db)
	if err != nil {
		return err
	}
	defer t.Close()
	switch pos[0] {
	case "create":
		if *name == "" || *role == "" {
			return usageErr(fs, c.Env, "create needs --role and --name")
		}
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
	case "list":
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
	case "revoke":
		if len(pos) != 2 {
			return usageErr(fs, c.Env, "revoke needs exactly one NAME")
		}
		if err := t.Revoke(ctx, pos[1]); err != nil {
			return err
		}
		_, err := fmt.Fprintf(c.Stdout, "token %q revoked\n", pos[1])
		return err
	}
	return usageErr(fs, c.Env, "unknown token command %q", pos[0])
}
