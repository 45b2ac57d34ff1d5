package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/effect-ledger/effect-ledger/storage"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// CompactCommand runs `ledgerctl compact`: it gives the bytes a prune
// freed (docs/spec.md §16) back to the file system, on a SQLite ledger
// ledgerd is not running on.
type CompactCommand struct{ *Env }

const compactSummary = `Usage: ledgerctl compact --db FILE [--json]

Rewrites a SQLite ledger file without its free pages (a VACUUM, after its WAL
is checkpointed) and compacts its key index, then prints the bytes of the file,
its WAL and its key index before and after. A prune deletes the bodies of the
receipts it archived, but SQLite keeps the freed pages for later writes: this
command returns them to the file system. No receipt, hash or checkpoint
changes; "ledgerctl verify --db FILE" answers as before.

Stop ledgerd first: the command opens the file for writing and is refused
while ledgerd holds it. The rewrite needs free disk space about the size of
the file. A PostgreSQL database is not compacted here: its VACUUM FULL locks
the tables it rewrites, so when to run it is the operator's call (see
docs/operations.md).
Exit 0 done, 2 refused or error.`

const compactExamples = `  ledgerctl prune --db ledger.db --archive-dir /srv/ledger-archive --namespace payments --auto
  ledgerctl compact --db ledger.db
  ledgerctl verify --db ledger.db --namespace payments
`

// Run compacts the ledger file.
func (c *CompactCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("compact", flag.ContinueOnError)
	db := dbFlag(fs, "SQLite ledger `file` (opened for writing; ledgerd must be stopped)")
	asJSON := jsonFlag(fs, "print JSON: {\"db\", \"before\", \"after\"} in bytes")
	if err := parseNoArgs(fs, c.Env, args, compactSummary, compactExamples); err != nil {
		return err
	}
	if *db == "" {
		return usageErr(fs, c.Env, "give --db FILE")
	}
	if errors.Is(storage.CheckFile(*db), storage.ErrNoFiles) {
		return errors.New("compact rewrites SQLite ledger files only: on PostgreSQL, VACUUM FULL of the receipt tables " +
			"gives the space back but locks them while it runs, so when to run it is the operator's call (docs/operations.md)")
	}
	if err := checkDB(*db); err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	res, err := sqlite.Compact(ctx, *db, sqlite.Options{Logger: quiet})
	if err != nil {
		return fmt.Errorf("compact %s: %w", *db, err)
	}
	if *asJSON {
		return writeJSON(c.Stdout, map[string]any{"db": *db, "before": res.Before, "after": res.After})
	}
	_, err = fmt.Fprintf(c.Stdout, "compacted %s: %d bytes before, %d after (%d freed)\n", *db, res.Before, res.After, res.Before-res.After)
	return err
}
