package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/effect-ledger/effect-ledger/storage"
	"github.com/effect-ledger/effect-ledger/verify"
)

// progressThreshold is the chain length above which verify shows a
// progress bar on a terminal.
const progressThreshold = 100_000

// VerifyCommand runs `ledgerctl verify`.
type VerifyCommand struct {
	*Env
}

const verifyExamples = `  ledgerctl verify --db ledger.db
  ledgerctl verify --server http://127.0.0.1:8080 --json
  ledgerctl verify --db ledger.db --expect-head 1042:5696e522798aa5923576765d1e4184cdd8076fbac9c7ea31056382427453c3c4
  # periodic job: pin the verified head, check only what was appended since
  ledgerctl verify --db ledger.db --state /var/lib/ledger/verify-state.json --incremental
  # against a signed checkpoint kept earlier (catches truncation and rewrites)
  ledgerctl verify --db ledger.db --checkpoint checkpoint.txt --vkey ./log.vkey --state verify-state.json
  # one namespace, or every one (each reported; exit 2 if any could not be verified, else 1 if any has violations)
  ledgerctl verify --db ledger.db --namespace payments
  ledgerctl verify --db postgres://auditor@db.internal/ledger --all-namespaces --json
  # an archived segment alone (ledgerctl archive writes them)
  ledgerctl verify --segment /srv/ledger-archive/payments-1-100000 --vkey ./log.vkey
  # every archived segment joined to the ledger it was pruned from
  ledgerctl verify --db ledger.db --namespace payments --segments /srv/ledger-archive --vkey ./log.vkey
`

// Run verifies the ledger and prints the report.
func (c *VerifyCommand) Run(ctx context.Context, args []string) error {
	fs, src := readFlags("verify")
	expect := fs.String("expect-head", "", "fail with head_mismatch unless the chain has `SEQ:HASH`")
	stateFile := fs.String("state", "", "state `file` holding the last verified head: the chain must extend it; rewritten atomically after a clean run")
	incremental := fs.Bool("incremental", false, "with --state: check only receipts after the pinned head (a full run now and then catches in-place edits)")
	maxV := fs.Int("max-violations", 100, "list at most `N` violations (all are counted)")
	noProgress := fs.Bool("no-progress", false, "never show a progress bar")
	receiptsOnly := fs.Bool("receipts-only", false, "a committed namespace whose payload table is missing (a copy of the receipts alone): check the chain alone and report the payloads unchecked, instead of failing with payloads_absent")
	segment := fs.String("segment", "", "check the archived segment in `DIR` alone (docs/spec.md §16: its receipts rehashed and chained, its digests, payloads and tree against its checkpoint; the signature too, given --vkey); exit 1 segment_invalid")
	segments := fs.String("segments", "", "with --db: join the archive `DIR`'s segments to the ledger (docs/spec.md §16): each prune receipt's segment NS-FROM-THROUGH must be there, check alone and hold the receipts whose hashes the ledger keeps; exit 1 segment_missing or segment_mismatch. --vkey checks the segments' checkpoint signatures too")
	all := fs.Bool("all-namespaces", false, "verify every namespace, one report each (--json: {\"ok\", \"namespaces\": {NAME: report, or {\"ok\": false, \"error\"} for one that could not be verified}}); exit 2 if any could not be verified, else 1 if any has violations")
	var cf checkpointFlags
	cf.register(fs)
	if err := parseNoArgs(fs, c.Env, args, verifySummary, verifyExamples); err != nil {
		return err
	}
	if *segment != "" {
		for _, f := range []string{"db", "server", "namespace", "n", "expect-head", "state", "incremental", "checkpoint", "all-namespaces", "receipts-only", "segments"} {
			if flagSet(fs, f) {
				return usageErr(fs, c.Env, "--segment checks a segment alone: leave out --%s", f)
			}
		}
		return c.verifySegment(fs, src.json, *segment, cf.vkeys)
	}
	if *segments != "" {
		for _, f := range []string{"server", "all-namespaces", "incremental"} {
			if flagSet(fs, f) {
				return usageErr(fs, c.Env, "--segments joins the segments to a database on a full run of one namespace: leave out --%s", f)
			}
		}
		if src.db == "" {
			return usageErr(fs, c.Env, "--segments needs --db (the database whose prune receipts the segments are joined to)")
		}
	}
	if *all {
		for _, f := range []string{"namespace", "expect-head", "state", "incremental", "checkpoint", "vkey"} {
			if flagSet(fs, f) {
				return usageErr(fs, c.Env, "--all-namespaces verifies each namespace against nothing pinned: leave out --%s (pin one namespace at a time with --namespace)", f)
			}
		}
		if *maxV < 1 {
			return usageErr(fs, c.Env, "--max-violations must be at least 1, got %d", *maxV)
		}
		return c.all(ctx, fs, src, verify.Opts{MaxViolations: *maxV, ReceiptsOnly: *receiptsOnly})
	}
	if *maxV < 1 {
		return usageErr(fs, c.Env, "--max-violations must be at least 1, got %d", *maxV)
	}
	if *incremental && *stateFile == "" {
		return usageErr(fs, c.Env, "--incremental needs --state")
	}
	opts, err := c.pins(fs, *expect, *stateFile, *incremental)
	if err != nil {
		return err
	}
	opts.MaxViolations, opts.ReceiptsOnly = *maxV, *receiptsOnly
	if src.server != "" && len(cf.vkeys) > 0 { // the checkpoint that proves a pruned prefix (docs/spec.md §16)
		if opts.Keys, err = verifiers(fs, c.Env, cf.vkeys); err != nil {
			return err
		}
	}
	if *segments != "" {
		vs, err := verifiers(fs, c.Env, cf.vkeys)
		if err != nil {
			return err
		}
		opts.Segments = &verify.Segments{Dir: *segments, Namespace: src.ns(), Keys: vs}
	}
	return c.check(ctx, fs, src, &cf, opts, *stateFile, !*noProgress)
}

// pins reads the heads a run must extend: --expect-head and the head of
// the --state file (an incremental run checks only what follows it).
func (c *VerifyCommand) pins(fs *flag.FlagSet, expect, stateFile string, incremental bool) (verify.Opts, error) {
	var opts verify.Opts
	if expect != "" {
		pin, err := verify.ParsePin(expect)
		if err != nil {
			return opts, usageErr(fs, c.Env, "--expect-head: %v", err)
		}
		opts.ExpectHead = pin
	}
	if stateFile != "" {
		pin, err := verify.ReadState(stateFile)
		if err != nil {
			return opts, err
		}
		opts.Pinned = pin
		opts.Incremental = incremental && pin != nil // the first run is a full one
	}
	return opts, nil
}

// check verifies one namespace, checks the signed checkpoint if asked,
// rewrites the state file after a clean run and prints the report.
func (c *VerifyCommand) check(ctx context.Context, fs *flag.FlagSet, src *sourceFlags, cf *checkpointFlags,
	opts verify.Opts, stateFile string, progress bool) error {
	cc, err := cf.load(ctx, fs, c.Env, src, stateFile, opts.Segments != nil)
	if err != nil {
		return err
	}
	st, err := src.open(ctx, fs, c.Env)
	if err != nil {
		return err
	}
	defer st.Close()

	if progress {
		if bar := c.progressBar(ctx, st); bar != nil {
			opts.Progress = func(seq uint64) { _ = bar.Set64(int64(seq)) }
			defer func() { _ = bar.Finish(); fmt.Fprintln(c.Stderr) }()
		}
	}
	start := time.Now()
	rep, err := checkWith(ctx, st, opts)
	if err != nil {
		return err
	}
	var latest []byte
	var keys *verify.KeyTrust
	if cc != nil {
		if latest, keys, err = checkCheckpoint(ctx, cc, st, rep); err != nil {
			return err
		}
	}
	elapsed := time.Since(start)
	if rep.OK && stateFile != "" {
		if err := writeState(stateFile, rep.Head, latest, keys); err != nil {
			return err
		}
	}
	if src.json {
		if err := writeJSON(c.Stdout, rep); err != nil {
			return err
		}
	} else {
		printReport(c.Stdout, rep, elapsed)
	}
	if err := unsupported(rep); err != nil {
		return err
	}
	if !rep.OK {
		return &ViolationsError{Count: rep.ViolationsTotal}
	}
	return nil
}

// unsupported is the error (exit 2) of a report that met receipts this
// verifier does not know (docs/spec.md §14): it cannot vouch for the
// chain either way.
func unsupported(rep *verify.Report) error {
	if rep.Unsupported == 0 {
		return nil
	}
	return fmt.Errorf("unsupported: %s of a kind this verifier does not know; a newer ledgerctl may check them",
		plural(rep.Unsupported, "receipt", "receipts"))
}

const verifySummary = `Usage: ledgerctl verify (--db FILE|URL | --server URL) [--namespace NS | --all-namespaces] [flags]

Rehashes the chain, replays every receipt through the key state machine and
reports violations with seq, rule and detail. Each namespace is a chain of its
own: --namespace picks one (default "default"), --all-namespaces checks them
all, one report each, whatever the others gave. Exit 0 intact, 1 violations,
2 error (with --all-namespaces: the worst of the namespaces' results, 2 if
any could not be verified).`

// all verifies every namespace, each whatever the others gave: one report
// section each (one JSON object keyed by namespace with --json), then the
// worst status: exit 2 if any could not be verified, else 1 if any has
// violations.
func (c *VerifyCommand) all(ctx context.Context, fs *flag.FlagSet, src *sourceFlags, opts verify.Opts) error {
	fsrc, client, err := src.openEither(ctx, fs, c.Env)
	if err != nil {
		return err
	}
	var names []string
	var open func(ns string) (store, error)
	if client != nil {
		list, err := client.namespaces(ctx)
		if err != nil {
			return fmt.Errorf("list namespaces: %w", err)
		}
		for _, n := range list {
			names = append(names, n.Name)
		}
		open = func(ns string) (store, error) {
			st, err := client.in(ns)
			if err != nil {
				return nil, err
			}
			return st, nil
		}
	} else {
		defer fsrc.Close()
		st := fsrc.db
		if names, err = st.Namespaces(ctx); err != nil {
			return storage.RedactError(src.db, fmt.Errorf("list namespaces: %w", err))
		}
		open = func(ns string) (store, error) {
			ch, err := chainOf(ctx, st, src.db, ns)
			return fileStore{Chain: ch}, err
		}
	}
	slices.Sort(names)
	results := make([]nsResult, len(names))
	for i, ns := range names {
		results[i] = checkNamespace(ctx, open, ns, opts)
		if client == nil {
			results[i].err = storage.RedactError(src.db, results[i].err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return c.printAll(src.json, names, results)
}

// nsResult is what verifying one namespace of --all-namespaces gave: a
// report, or the error that kept it from being verified.
type nsResult struct {
	rep     *verify.Report
	err     error
	elapsed time.Duration
}

// checkNamespace verifies namespace ns of a store open opens.
func checkNamespace(ctx context.Context, open func(ns string) (store, error), ns string, opts verify.Opts) nsResult {
	start := time.Now()
	st, err := open(ns)
	if err != nil {
		return nsResult{err: err}
	}
	rep, err := checkWith(ctx, st, opts)
	return nsResult{rep: rep, err: err, elapsed: time.Since(start)}
}

// printAll prints every namespace's result (one JSON object keyed by
// namespace with --json; a namespace that could not be verified is
// {"ok": false, "error": …}) and returns the worst: an error naming the
// namespaces that could not be verified (exit 2), else the violations
// (exit 1).
func (c *VerifyCommand) printAll(asJSON bool, names []string, results []nsResult) error {
	violations, bad := 0, 0
	var errs []string
	for i, r := range results {
		switch {
		case r.err != nil:
			errs = append(errs, fmt.Sprintf("namespace %s: %v", names[i], r.err))
		case unsupported(r.rep) != nil:
			errs = append(errs, fmt.Sprintf("namespace %s: %v", names[i], unsupported(r.rep)))
			violations += r.rep.ViolationsTotal
		case !r.rep.OK:
			violations += r.rep.ViolationsTotal
			bad++
		}
	}
	if asJSON {
		spaces := make(map[string]any, len(names))
		for i, r := range results {
			if r.err != nil {
				spaces[names[i]] = map[string]any{"ok": false, "error": r.err.Error()}
			} else {
				spaces[names[i]] = r.rep
			}
		}
		if err := writeJSON(c.Stdout, map[string]any{"ok": violations == 0 && len(errs) == 0, "namespaces": spaces}); err != nil {
			return err
		}
	} else {
		for i, ns := range names {
			if i > 0 {
				fmt.Fprintln(c.Stdout)
			}
			fmt.Fprintf(c.Stdout, "== namespace %s ==\n", ns)
			if r := results[i]; r.err != nil {
				fmt.Fprintf(c.Stdout, "ERROR: could not be verified: %v\n", r.err)
			} else {
				printReport(c.Stdout, r.rep, r.elapsed)
			}
		}
		fmt.Fprintf(c.Stdout, "\n%s verified, %d with violations", plural(len(names), "namespace", "namespaces"), bad)
		if len(errs) > 0 {
			fmt.Fprintf(c.Stdout, ", %d could not be verified", len(errs))
		}
		fmt.Fprintln(c.Stdout)
	}
	switch {
	case len(errs) > 0:
		return errors.New(strings.Join(errs, "; "))
	case violations > 0:
		return &ViolationsError{Count: violations}
	}
	return nil
}

// progressBar returns a bar on stderr for long chains on a terminal.
func (c *VerifyCommand) progressBar(ctx context.Context, st store) *progressbar.ProgressBar {
	f, ok := c.Stderr.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	head, err := st.Head(ctx)
	if err != nil || head.Seq < progressThreshold {
		return nil
	}
	return progressbar.NewOptions64(int64(head.Seq),
		progressbar.OptionSetWriter(f),
		progressbar.OptionSetDescription("verifying"),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("receipts"),
		progressbar.OptionThrottle(200*time.Millisecond),
	)
}

func printReport(w io.Writer, rep *verify.Report, elapsed time.Duration) {
	if rep.OK {
		fmt.Fprintf(w, "OK: %s, head %d:%s (%d rehashed in %s)\n", plural(rep.Receipts, "receipt", "receipts"), rep.Head.Seq, rep.Head.Hash,
			rep.Checked, elapsed.Round(time.Millisecond))
	} else {
		fmt.Fprintf(w, "FAILED: %s in %s, head %d:%s\n\n", plural(rep.ViolationsTotal, "violation", "violations"), plural(rep.Receipts, "receipt", "receipts"),
			rep.Head.Seq, rep.Head.Hash)
		printViolations(w, rep)
	}
	if rep.SegmentsJoined > 0 {
		fmt.Fprintf(w, "segments: %s joined to the ledger\n", plural(rep.SegmentsJoined, "segment", "segments"))
	}
	if p := rep.Pruned; p != nil {
		against := "the latest checkpoint the server serves, its signature unchecked (--vkey checks it)"
		if p.Signed {
			against = "the latest checkpoint the server serves, signed by a key of --vkey"
		}
		proven := "proven"
		if !p.Proven {
			proven = "NOT proven"
		}
		fmt.Fprintf(w, "pruned: receipts 1…%d were pruned (docs/spec.md §16); the chain starts from hash %s of receipt %d, %s in %s (size %d)\n",
			p.Through, p.Hash, p.Through, proven, against, p.TreeSize)
	}
	if u := rep.UnverifiedPruned; len(u) == 2 {
		fmt.Fprintf(w, "pruned: receipts %d…%d after the pinned head were pruned (docs/spec.md §16) before this run could check them; --segments DIR joins their segments\n", u[0], u[1])
	}
	if rep.PayloadsUnchecked {
		fmt.Fprintln(w, "payloads: unchecked — the database has no payload table; the chain alone was checked")
	}
	a := rep.Audit
	awaiting := 0
	for _, k := range a.Interrupted {
		if k.AwaitingPerson {
			awaiting++
		}
	}
	fmt.Fprintf(w, "audit: %s, %s, %s, %s, %d interrupted (%d awaiting a person), %d failed, %s, %s, %s, %d reconcile contradicted\n",
		plural(len(a.RuntimeRetries), "runtime retry", "runtime retries"), plural(len(a.ReInvocations), "re-invocation", "re-invocations"),
		plural(len(a.DuplicateEffects), "duplicate effect", "duplicate effects"), plural(len(a.RepeatedFailures), "repeated failure", "repeated failures"),
		len(a.Interrupted), awaiting, len(a.Failed), plural(len(a.Resolutions), "resolution", "resolutions"),
		plural(len(a.NotAppliedReruns), "not-applied rerun", "not-applied reruns"),
		plural(len(a.Reconciliations), "reconciliation", "reconciliations"), len(a.ReconcileContradicted))
}
