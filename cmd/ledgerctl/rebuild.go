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

// RebuildIndexCommand runs `ledgerctl rebuild-index` (once called
// rebuild-keys): it rebuilds a namespace's part of the key index from the
// receipts.
type RebuildIndexCommand struct {
	*Env
	name string
}

const rebuildUsage = `Usage:
  ledgerctl rebuild-index --db FILE [--namespace NS] [--json]

Rebuilds the key index of a SQLite ledger (FILE.idx/: the state of every
idempotency key and the receipts of each key, execution, tool and kind)
for the default namespace or, with --namespace, for that namespace, from
its receipts in FILE, and makes the namespace's recorded head
match its receipts again. ledgerd keeps the index up to date on its own:
it replays what the index lacks when it opens a file, and rebuilds an index
that is missing, damaged or of another chain. This command is for when
ledgerd refuses to start because the recorded head and the receipts differ
(receipts removed by a bad restore or by hand), and for rebuilding on
purpose. An index whose files are corrupt is moved aside (to
FILE.idx.unreadable-<unix ms>, which you may delete) and built anew. The
receipts are never changed; open reservations keep their tokens. Progress
goes to stderr.

Stop ledgerd first (the command takes the same locks), and check the chain
with "ledgerctl verify --db FILE" before and after.`

const rebuildExamples = `  ledgerctl verify --db ledger.db
  ledgerctl rebuild-index --db ledger.db
  ledgerctl rebuild-index --db ledger.db --namespace payments
`

// Run rebuilds the index.
func (c *RebuildIndexCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	db := dbFlag(fs, "SQLite ledger `file` (opened for writing; ledgerd must be stopped)")
	ns := namespaceFlag(fs, ledger.DefaultNamespace, "the namespace whose index to rebuild")
	asJSON := jsonFlag(fs, "print JSON")
	if err := parseNoArgs(fs, c.Env, args, rebuildUsage, rebuildExamples); err != nil {
		return err
	}
	if *db == "" {
		return usageErr(fs, c.Env, "give --db FILE")
	}
	if errors.Is(storage.CheckFile(*db), storage.ErrNoFiles) {
		return usageErr(fs, c.Env, "%s rebuilds the key index of SQLite ledger files only; a PostgreSQL database keeps its own indexes", c.name)
	}
	if err := ledger.CheckNamespace(*ns); err != nil {
		return usageErr(fs, c.Env, "--namespace: %s", ledger.ErrorMessage(err))
	}
	if err := checkDB(*db); err != nil {
		return err
	}
	if *ns != ledger.DefaultNamespace {
		// The namespace must be registered in the ledger file.
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
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
	progress := slog.New(slog.NewTextHandler(c.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	head, err := sqlite.RebuildIndex(ctx, *db, *ns, sqlite.Options{Logger: progress})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(c.Stdout, map[string]any{"namespace": *ns, "head": map[string]any{"seq": head.Seq, "hash": head.Hash.String()}})
	}
	_, err = fmt.Fprintf(c.Stdout, "rebuilt the key index of namespace %s: %s, head %d %s\n", *ns,
		plural(int64(head.Seq), "receipt", "receipts"), head.Seq, head.Hash)
	return err
}
