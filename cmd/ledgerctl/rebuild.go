package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/effect-ledger/effect-ledger/storage"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// RebuildKeysCommand runs `ledgerctl rebuild-keys`: it recomputes the
// derived state (the keys table and the recorded head) from the receipts.
type RebuildKeysCommand struct{ *Env }

const rebuildUsage = `Usage:
  ledgerctl rebuild-keys --db FILE [--json]

Recomputes the derived state of a ledger file from its receipts: the keys
table (the state of every idempotency key) and the recorded head. ledgerd
refuses to start when that state does not match the chain (receipts removed
by a bad restore or by hand), because serving from it could replay another
key's result; this command repairs it. The receipts are never changed.
Reservations that were open lose their tokens (their commits get
stale_reservation; the keys become interrupted when the leases end).

Stop ledgerd first (the command takes the same lock), and check the chain
with "ledgerctl verify --db FILE" before and after.`

const rebuildExamples = `  ledgerctl verify --db ledger.db
  ledgerctl rebuild-keys --db ledger.db
`

// Run rebuilds the derived state.
func (c *RebuildKeysCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("rebuild-keys", flag.ContinueOnError)
	db := fs.String("db", "", "SQLite ledger `file` (opened for writing; ledgerd must be stopped)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, c.Env, args, rebuildUsage, rebuildExamples)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr(fs, c.Env, "unexpected arguments %q", pos)
	}
	if *db == "" {
		return usageErr(fs, c.Env, "give --db FILE")
	}
	if storage.IsPostgres(*db) {
		return usageErr(fs, c.Env, "rebuild-keys repairs SQLite ledger files only, not a PostgreSQL database")
	}
	if err := checkDBFile(*db); err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	l, err := sqlite.Open(ctx, *db, sqlite.Options{Logger: quiet, Repair: true})
	if err != nil {
		return err
	}
	n, err := l.RebuildKeys(ctx)
	head := l.Head()
	if cerr := l.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// Prove the repair: a normal open checks the derived state again.
	check, err := sqlite.Open(ctx, *db, sqlite.Options{Logger: quiet})
	if err != nil {
		return fmt.Errorf("after rebuilding: %w", err)
	}
	if err := check.Close(); err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(c.Stdout, map[string]any{"keys": n, "head": map[string]any{"seq": head.Seq, "hash": head.Hash.String()}})
	}
	_, err = fmt.Fprintf(c.Stdout, "rebuilt the derived state: %s; head %d %s\n", plural(n, "key", "keys"), head.Seq, head.Hash)
	return err
}
