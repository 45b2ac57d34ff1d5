package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"text/tabwriter"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/verify"
)

// BackupCommand runs `ledgerctl backup`.
type BackupCommand struct{ *Env }

const backupSummary = `Usage: ledgerctl backup --db LIVE --out FILE [--force] [--json]

Copies a ledger consistently, also while ledgerd writes it, with SQLite's
online backup API: one read snapshot copied in steps, which never blocks
ledgerd (WAL readers do not block the writer); receipts appended meanwhile
are not in the copy. The copy goes to a temporary file beside FILE, is
fsync'd and then moved to FILE, so FILE is either absent or complete. It is
one self-contained file (no -wal), readable on read-only media, and ledgerd
can start on it. Then the whole copy is verified (as ledgerctl verify) and
its head printed: pin it, e.g. verify --db FILE --expect-head SEQ:HASH later.
An existing FILE is never replaced without --force.

Namespaces: every namespace lives in the ledger file, so the copy holds them
all, from the same snapshot, and each is verified in the copy. (A ledger of
the earlier layout, one file per namespace, not yet opened by this ledgerd,
has each namespace file copied beside FILE and verified too.) SQLite only: a
PostgreSQL ledger is backed up with pg_dump or a replica.

Exit 0 the copy is intact, 1 the copy has violations (then the live ledger
has them too: run ledgerctl verify on it), 2 usage or I/O error.`

const backupExamples = `  ledgerctl backup --db /var/lib/ledger/ledger.db --out /backup/ledger-$(date +%F).db
  ledgerctl backup --db ledger.db --out ledger-copy.db --force --json
`

// Run copies the ledger and verifies the copy.
func (c *BackupCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("backup", flag.ContinueOnError)
	var src sourceFlags
	src.hasDB = true
	declareDB(fs, &src.db, "the live ledger's SQLite `file` (a PostgreSQL ledger is backed up with pg_dump or a replica)")
	src.registerJSON(fs)
	out := fs.String("out", "", "`file` to write the copy to (required; must not exist unless --force)")
	force := fs.Bool("force", false, "replace an existing --out file")
	pos, err := parse(fs, c.Env, args, backupSummary, backupExamples)
	if err != nil {
		return err
	}
	if err := src.checkNoArgs(fs, c.Env, pos); err != nil {
		return err
	}
	if *out == "" {
		return usageErr(fs, c.Env, "give --out FILE")
	}
	if errors.Is(storage.CheckFile(src.db), storage.ErrNoFiles) {
		return usageErr(fs, c.Env, "PostgreSQL ledgers are backed up with pg_dump or a replica; backup copies SQLite files only")
	}
	if err := checkDB(src.db); err != nil {
		return err
	}
	if fi, err := os.Stat(filepath.Dir(*out)); err != nil || !fi.IsDir() {
		return fmt.Errorf("--out %s: no directory %s to write it in", *out, filepath.Dir(*out))
	}
	res, err := sqlite.Backup(ctx, src.db, *out, sqlite.BackupOptions{Overwrite: *force})
	if errors.Is(err, sqlite.ErrBackupExists) {
		return fmt.Errorf("--out %s exists; give --force to replace it", *out)
	}
	if err != nil {
		return err
	}

	rep, err := verifyCopy(ctx, res)
	if err != nil {
		return err
	}
	names, err := copiedNamespaces(ctx, res.Path)
	if err != nil {
		return err
	}
	copies, err := backupNamespaces(ctx, src.db, *out, *force, names)
	if err != nil {
		return err
	}
	bad := rep.ViolationsTotal
	for _, cp := range copies {
		bad += cp.rep.ViolationsTotal
	}
	if err := c.report(src.json, res, rep, names, copies, bad); err != nil {
		return err
	}
	if bad > 0 {
		return &ViolationsError{Count: bad}
	}
	return nil
}

// nsCopy is one namespace's copy and its verification: res is nil for a
// namespace in the ledger file, which the copy of that file holds.
type nsCopy struct {
	res *sqlite.BackupResult
	rep *verify.Report
}

// backupNamespaces copies and verifies the files of the namespaces names
// of the ledger at db beside the copy at out.
func backupNamespaces(ctx context.Context, db, out string, force bool, names []string) ([]nsCopy, error) {
	var copies []nsCopy
	for _, ns := range names {
		file, own, err := sqlite.NamespaceFile(ctx, db, ns)
		if err != nil {
			return nil, fmt.Errorf("backup namespace %s: %w", ns, err)
		}
		if !own {
			rep, err := verifyInCopy(ctx, out, ns)
			if err != nil {
				return nil, fmt.Errorf("namespace %s: %w", ns, err)
			}
			copies = append(copies, nsCopy{nil, rep})
			continue
		}
		dst := filepath.Join(out+".ns", filepath.Base(file))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return nil, fmt.Errorf("backup namespace %s: %w", ns, err)
		}
		nres, err := sqlite.Backup(ctx, file, dst, sqlite.BackupOptions{Overwrite: force})
		if errors.Is(err, sqlite.ErrBackupExists) {
			return nil, fmt.Errorf("%s exists; give --force to replace it", dst)
		}
		if err != nil {
			return nil, fmt.Errorf("backup namespace %s: %w", ns, err)
		}
		nrep, err := verifyCopy(ctx, nres)
		if err != nil {
			return nil, fmt.Errorf("namespace %s: %w", ns, err)
		}
		copies = append(copies, nsCopy{nres, nrep})
	}
	return copies, nil
}

// report prints what backup copied and what the copies' verification
// found.
func (c *BackupCommand) report(asJSON bool, res *sqlite.BackupResult, rep *verify.Report, names []string, copies []nsCopy, bad int) error {
	if !asJSON {
		printBackup(c.Stdout, res, rep)
		for i, ns := range names {
			fmt.Fprintf(c.Stdout, "namespace %s: ", ns)
			if copies[i].res == nil {
				fmt.Fprintf(c.Stdout, "in the copy (%s); ", plural(copies[i].rep.Receipts, "receipt", "receipts"))
				printVerified(c.Stdout, copies[i].rep)
				continue
			}
			printBackup(c.Stdout, copies[i].res, copies[i].rep)
		}
		return nil
	}
	spaces := map[string]any{}
	for i, ns := range names {
		r := copies[i]
		out, bytes := res.Path, int64(0) // in the ledger file's copy
		if r.res != nil {
			out, bytes = r.res.Path, r.res.Bytes
		}
		spaces[ns] = map[string]any{"ok": r.rep.OK, "out": out, "bytes": bytes,
			"receipts": r.rep.Receipts, "head": r.rep.Head, "violations": r.rep.Violations,
			"violations_total": r.rep.ViolationsTotal}
	}
	return writeJSON(c.Stdout, map[string]any{"ok": bad == 0, "out": res.Path, "bytes": res.Bytes,
		"receipts": rep.Receipts, "head": rep.Head, "violations": rep.Violations,
		"violations_total": rep.ViolationsTotal, "namespaces": spaces})
}

// verifyCopy verifies a copy made by sqlite.Backup against the head it
// copied.
func verifyCopy(ctx context.Context, res *sqlite.BackupResult) (*verify.Report, error) {
	rd, err := sqlite.OpenReader(ctx, res.Path, sqlite.Options{})
	if err != nil {
		return nil, fmt.Errorf("open the copy: %w", err)
	}
	defer rd.Close()
	pin := &verify.Pin{Seq: res.Head.Seq, Hash: res.Head.Hash.String()}
	rep, err := verify.New(rd, verify.Opts{ExpectHead: pin}).Check(ctx)
	if err != nil {
		return nil, fmt.Errorf("verify the copy: %w", err)
	}
	return rep, nil
}

// copiedNamespaces lists the namespaces other than default that the
// registry of the copy at path holds.
func copiedNamespaces(ctx context.Context, path string) ([]string, error) {
	st, err := sqlite.OpenStore(ctx, path, sqlite.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, true)
	if err != nil {
		return nil, fmt.Errorf("open the copy: %w", err)
	}
	defer func() { _ = st.Close() }()
	names, err := st.Namespaces(ctx)
	if err != nil {
		return nil, fmt.Errorf("the copy's namespaces: %w", err)
	}
	return slices.DeleteFunc(names, func(ns string) bool { return ns == ledger.DefaultNamespace }), nil
}

func printBackup(w io.Writer, res *sqlite.BackupResult, rep *verify.Report) {
	fmt.Fprintf(w, "backup: wrote %s (%s, %s)\n", res.Path, plural(res.Bytes, "byte", "bytes"), plural(rep.Receipts, "receipt", "receipts"))
	printVerified(w, rep)
}

// printVerified prints what verifying a copy found.
func printVerified(w io.Writer, rep *verify.Report) {
	if rep.OK {
		fmt.Fprintf(w, "verified: OK, head %d:%s\n", rep.Head.Seq, rep.Head.Hash)
		return
	}
	fmt.Fprintf(w, "verified: FAILED, %s (the live ledger has them too: run ledgerctl verify on it)\n\n",
		plural(rep.ViolationsTotal, "violation", "violations"))
	printViolations(w, rep)
}

// printViolations lists a report's violations as a table.
func printViolations(w io.Writer, rep *verify.Report) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tRULE\tDETAIL")
	for _, v := range rep.Violations {
		fmt.Fprintf(tw, "%d\t%s\t%s\n", v.Seq, v.Rule, v.Detail)
	}
	_ = tw.Flush()
	if n := rep.ViolationsTotal - len(rep.Violations); n > 0 {
		fmt.Fprintf(w, "… and %d more\n", n)
	}
}

// verifyInCopy verifies namespace ns in the copy of the ledger file at
// path, which holds every namespace of the ledger file.
func verifyInCopy(ctx context.Context, path, ns string) (*verify.Report, error) {
	st, err := sqlite.OpenStore(ctx, path, sqlite.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, true)
	if err != nil {
		return nil, fmt.Errorf("open the copy: %w", err)
	}
	defer func() { _ = st.Close() }()
	c, err := st.Chain(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("open the copy: %w", err)
	}
	rep, err := verify.New(c, verify.Opts{}).Check(ctx)
	if err != nil {
		return nil, fmt.Errorf("verify the copy: %w", err)
	}
	return rep, nil
}
