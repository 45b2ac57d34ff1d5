package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/verify"
)

// EraseCommand runs `ledgerctl erase` (SPEC §14).
type EraseCommand struct{ *Env }

// Run erases payloads by keys or by subject.
func (c *EraseCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("erase", flag.ContinueOnError)
	var src sourceFlags
	src.registerServer(fs)
	src.registerNamespace(fs)
	src.registerJSON(fs)
	var keys, fields listFlag
	fs.Var(&keys, "key", "an idempotency `KEY` whose payloads to erase, every generation (repeat for more)")
	subject := fs.String("subject", "", "erase what this `SUBJECT` concerns (the key generations reserved with it)")
	fs.Var(&fields, "field", "only this payload `FIELD`: external_ref, result, error_message or note (repeat; default all four)")
	reason := fs.String("reason", "", "why, as `TEXT` (at most 256 characters; keep personal data out)")
	replay := fs.String("replay", "", "erase again in a restored ledger (--db) what an erasures `FILE` lists (ledgerctl erasures export)")
	db := dbFlag(fs, "with --replay: the restored ledger's `database`, a SQLite file (ledgerd stopped) or a PostgreSQL URL")
	by := fs.String("by", "ledgerctl", "with --replay: the actor of the erase receipts appended, as `WHO`")
	setUsage(fs, c.Env, "Usage: ledgerctl erase --server URL (--key KEY… | --subject SUBJECT) [--field FIELD…] --reason TEXT [--namespace NS] [--json]\n"+
		"       ledgerctl erase --replay FILE --db FILE|URL [--namespace NS] [--by WHO] [--reason TEXT] [--json]\n\n"+
		"Erases the payload values (external_ref, result, error_message, note) of a\ncommitted namespace's receipts: every generation of the keys given, or the\nkey generations reserved with a subject. The chain, its Merkle tree and every\nproof stay valid; one erase receipt records the erasure. Keys still in\nflight are listed as pending: the receipt that finalizes each is erased as\nit is appended. Server only (an admin token when tokens exist).\n\n"+
		"With --replay, erases again, in a ledger restored from a backup taken\nbefore them, the erasures an erasures file lists (ledgerctl erasures export\non the ledger that erased): a listed receipt whose chain hash here is the\nsame loses the listed values, and each erasure that finds values appends an\nerase receipt; a receipt with another hash, or none, is skipped and reported.\nA second replay of the same file changes nothing. On SQLite it returns once\nthe file and its WAL are rid of the values.\nSee docs/privacy.md.",
		"  ledgerctl erase --server http://127.0.0.1:8080 --namespace customers --key refund-order-1234 --reason \"GDPR request 118\"\n  ledgerctl erase --server http://127.0.0.1:8080 --namespace customers --subject customer-42 --reason \"GDPR request 119\"\n  ledgerctl erase --replay erasures.json --db restored.db\n")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageErr(fs, c.Env, "unexpected arguments %q: give keys with --key", pos)
	}
	if *replay != "" {
		if len(keys) > 0 || *subject != "" || len(fields) > 0 || src.server != "" {
			return usageErr(fs, c.Env, "--replay takes the erasures from its file: give --db, not --server, --key, --subject or --field")
		}
		if *db == "" {
			return usageErr(fs, c.Env, "--replay needs --db FILE|URL: the restored ledger")
		}
		return replayErasures(ctx, c.Env, replayOpts{file: *replay, db: *db, ns: src.namespace, actor: *by,
			reason: *reason, json: src.json, nsGiven: flagSet(fs, "namespace")})
	}
	if *db != "" {
		return usageErr(fs, c.Env, "erase appends a receipt, which only ledgerd does: give --server URL, not --db (--db is for --replay)")
	}
	if err := src.check(); err != nil {
		return usageErr(fs, c.Env, "%v", err)
	}
	if (len(keys) == 0) == (*subject == "") {
		return usageErr(fs, c.Env, "give exactly one of --key (repeatable) and --subject")
	}
	srv, err := src.client(fs, c.Env)
	if err != nil {
		return err
	}
	res, err := srv.Client.Erase(ctx, client.Erasure{Keys: keys, Subject: *subject, Fields: fields, Reason: *reason})
	if err != nil {
		return verify.ServerErr(err)
	}
	if src.json {
		return writeJSON(c.Stdout, res)
	}
	switch {
	case res.Receipt != nil:
		_, err = fmt.Fprintf(c.Stdout, "erased the payloads of %d receipts of %d keys (erase receipt %d:%s)\n", res.Count, res.Keys,
			res.Receipt.Seq, res.Receipt.Hash)
	default:
		_, err = fmt.Fprintln(c.Stdout, "nothing to erase")
	}
	if err == nil && len(res.Pending) > 0 {
		_, err = fmt.Fprintf(c.Stdout, "pending (in flight; erased when they finish): %s\n", strings.Join(res.Pending, ", "))
	}
	if err == nil && res.Inline > 0 {
		_, err = fmt.Fprintf(c.Stdout, "%d selected receipts keep their payloads inline and cannot be erased\n", res.Inline)
	}
	return err
}
