package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// RebuildKeysCommand runs `ledgerctl rebuild-keys`: it recomputes the
// derived state (the keys table and the recorded head) from the receipts.
type RebuildKeysCommand struct{ *Env }

const rebuildUsage = `Usage:
  ledgerctl rebuild-keys --db FILE [--namespace NS] [--json]

Recomputes the derived state of a ledger file (or, with --namespace, of
that namespace's file, FILE.ns/ns-NS.db) from its receipts: the keys
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
  ledgerctl rebuild-keys --db ledger.db --namespace payments
`

// Run rebuilds the derived state.
func (c *RebuildKeysCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("rebuild-keys", flag.ContinueOnError)
	db := fs.String("db", "", "SQLite ledger `file` (opened for writing; ledgerd must be stopped)")
	ns := fs.String("namespace", ledger.DefaultNamespace, "the namespace whose file to repair")
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
	if errors.Is(storage.CheckFile(*db), storage.ErrNoFiles) {
		return usageErr(fs, c.Env, "rebuild-keys repairs SQLite ledger files only, not a PostgreSQL database")
	}
	if err := ledger.CheckNamespace(*ns); err != nil {
		return usageErr(fs, c.Env, "--namespace: %s", ledger.ErrorMessage(err))
	}
	if err := checkDB(*db); err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if *ns != ledger.DefaultNamespace {
		// The namespace must be registered in the ledger file.
		s, err := sqlite.OpenStore(ctx, *db, sqlite.Options{Logger: quiet}, true)
		if err != nil {
			return err
		}
		_, err = s.Chain(ctx, *ns)
		_ = s.Close()
		if errors.Is(err, ledger.ErrUnknownNamespace) {
			return fmt.Errorf("no namespace %q in %s (ledgerctl namespace list --db %s)", *ns, *db, *db)
		}
		if err != nil && !errors.Is(err, ledger.ErrDerivedState) {
			return err
		}
	}
	// Repairs, then proves the repair with a normal open, which checks the
	// derived state again.
	n, head, err := sqlite.RebuildNamespace(ctx, *db, *ns, sqlite.Options{Logger: quiet})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(c.Stdout, map[string]any{"keys": n, "head": map[string]any{"seq": head.Seq, "hash": head.Hash.String()}})
	}
	_, err = fmt.Fprintf(c.Stdout, "rebuilt the derived state: %s; head %d %s\n", plural(n, "key", "keys"), head.Seq, head.Hash)
	return err
}
