package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage"
	"github.com/effect-ledger/effect-ledger/verify"
)

// PruneCommand runs `ledgerctl prune`: archive, then prune (docs/spec.md
// §16), through a server or in process on a database.
type PruneCommand struct{ *Env }

const pruneSummary = `Usage: ledgerctl prune --namespace NS (--through SEQ | --auto) [--dry-run] --server URL [--token TOKEN] [--json]
       ledgerctl prune --namespace NS (--through SEQ | --auto) [--dry-run] --db FILE|URL --archive-dir DIR [--json]

Archives, then prunes, a namespace's receipts up to --through, or with --auto
as far as its policy's archive.keep_ms, the prunable watermark (every key
generation up to it finished and older than the key TTL) and the latest signed
checkpoint allow: the segment NS-FROM-THROUGH is written into the archive
directory, fsynced and read back, a prune receipt is appended, and the bodies
are deleted while every chain and tree hash is kept (proofs, tiles and
checkpoints answer as before; a read of a pruned receipt is 410 pruned). The
namespace needs a key TTL and a policy with an archive member.

With --server, ledgerd prunes into its --archive-dir (an admin token when
tokens exist). With --db, ledgerctl prunes in process into --archive-dir, on
a SQLite file ledgerd is not running on (or a PostgreSQL database), and
returns once the bodies are deleted. --dry-run prunes nothing: it prints the
watermark and the key generation that holds it back. The archive directory
holds the only copy of the pruned bodies: see docs/operations.md.
Exit 0 done (or nothing to prune), 2 refused or error.`

const pruneExamples = `  ledgerctl prune --server http://127.0.0.1:8080 --namespace payments --auto --dry-run
  ledgerctl prune --server http://127.0.0.1:8080 --namespace payments --through 100000
  ledgerctl prune --db ledger.db --archive-dir /srv/ledger-archive --namespace payments --auto
`

// pruneOpts are prune's flags.
type pruneOpts struct {
	src        sourceFlags
	through    uint64
	auto, dry  bool
	archiveDir string
}

// Run runs prune.
func (c *PruneCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prune", flag.ContinueOnError)
	var o pruneOpts
	o.src.registerSource(fs)
	declareNamespace(fs, &o.src.namespace, ledger.DefaultNamespace, "the `namespace` to prune")
	o.src.registerJSON(fs)
	fs.Uint64Var(&o.through, "through", 0, "prune up to this receipt `seq` (it must be at or below the prunable watermark)")
	fs.BoolVar(&o.auto, "auto", false, "prune as far as the namespace's policy, its watermark and the latest checkpoint allow")
	fs.BoolVar(&o.dry, "dry-run", false, "prune nothing: print the prunable watermark and what holds it back")
	fs.StringVar(&o.archiveDir, "archive-dir", "", "with --db: the archive `directory` the segment goes in (it must exist; the one ledgerd --archive-dir names)")
	if err := parseNoArgs(fs, c.Env, args, pruneSummary, pruneExamples); err != nil {
		return err
	}
	if err := o.src.check(); err != nil {
		return usageErr(fs, c.Env, "%v", err)
	}
	switch {
	case o.auto == (o.through > 0):
		return usageErr(fs, c.Env, "give exactly one of --through SEQ and --auto")
	case o.src.db != "" && o.archiveDir == "" && !o.dry:
		return usageErr(fs, c.Env, "--db needs --archive-dir DIR: where the segment goes")
	case o.src.server != "" && o.archiveDir != "":
		return usageErr(fs, c.Env, "--archive-dir goes with --db: with --server, ledgerd writes into its own --archive-dir")
	}
	if o.src.server != "" {
		return c.viaServer(ctx, fs, &o)
	}
	return c.inProcess(ctx, &o)
}

// viaServer prunes, or reads the watermark (--dry-run), through ledgerd.
func (c *PruneCommand) viaServer(ctx context.Context, fs *flag.FlagSet, o *pruneOpts) error {
	srv, err := o.src.client(fs, c.Env)
	if err != nil {
		return err
	}
	if o.dry {
		st, err := srv.Client.PruneStatus(ctx)
		if err != nil {
			return verify.ServerErr(err)
		}
		if o.src.json {
			return writeJSON(c.Stdout, st)
		}
		w := st.Watermark
		var pin *pinText
		if p := w.PinnedBy; p != nil {
			pin = &pinText{key: p.Key, state: p.State, seq: p.Seq, until: p.Until}
		}
		return c.printStatus(o, st.Archive != nil, st.PrunedThrough, st.KeptThrough, w.Through, w.Floor, w.Head, pin)
	}
	res, err := srv.Client.Prune(ctx, o.through)
	if err != nil {
		return pruneRefusal(verify.ServerErr(err), err)
	}
	if o.src.json {
		return writeJSON(c.Stdout, res)
	}
	ref := ""
	if res.Receipt != nil {
		ref = fmt.Sprintf("%d:%s", res.Receipt.Seq, res.Receipt.Hash)
	}
	return c.printResult(o, res.Status, ref, res.From, res.Through, res.Segment, res.Deleting)
}

// pruneRefusal adds to a 409 not_prunable the reason and what pins.
func pruneRefusal(err, raw error) error {
	var ce *client.Error
	if !errors.As(raw, &ce) || ce.Code != "not_prunable" {
		return err
	}
	msg := fmt.Sprintf("prune refused (%v): %s", ce.Details["reason"], ce.Message)
	if p, ok := ce.Details["pinned_by"].(map[string]any); ok {
		msg += fmt.Sprintf("; pinned by key %v (%v, from seq %v)", p["key"], p["state"], p["seq"])
	}
	return errors.New(msg)
}

// inProcess prunes the database of --db in process, and waits for the
// deletion of the bodies.
func (c *PruneCommand) inProcess(ctx context.Context, o *pruneOpts) (err error) {
	if o.archiveDir != "" {
		if fi, serr := os.Stat(o.archiveDir); serr != nil || !fi.IsDir() {
			return fmt.Errorf("--archive-dir %s is not an existing directory", o.archiveDir)
		}
	}
	st, err := openDB(ctx, o.src.db, c.Env, false)
	if err != nil {
		return err
	}
	l := ledger.New(st, ledger.Config{Logger: warnLogger(c.Env), CanPurge: !storage.IsPostgres(o.src.db), ArchiveDir: o.archiveDir})
	defer func() {
		if cerr := l.Close(); err == nil && cerr != nil {
			err = storage.RedactError(o.src.db, fmt.Errorf("close %s: %w", storage.Describe(o.src.db), cerr))
		}
	}()
	n, err := l.NS(ctx, o.src.ns())
	if err != nil {
		return storage.RedactError(o.src.db, fmt.Errorf("namespace %s: %w", o.src.ns(), err))
	}
	if o.dry {
		return c.dryRunDB(ctx, o, n)
	}
	res, err := n.Prune(ctx, ledger.PruneRequest{Through: o.through, Actor: "ledgerctl"})
	if err != nil {
		var le *ledger.Error
		if errors.As(err, &le) && le.Code == ledger.ECodeNotPrunable {
			return pruneRefusalDB(le)
		}
		return err
	}
	// Wait for the bodies to go, as ledgerd would in the background.
	if err := n.DeletePruned(ctx); err != nil {
		return fmt.Errorf("the prune receipt is appended, but deleting the bodies stopped (it resumes at the next start of ledgerd or prune): %w", err)
	}
	if o.src.json {
		out := map[string]any{"status": res.Status, "from": res.From, "through": res.Through, "segment": res.Segment,
			"digest": res.Digest, "deleting": false}
		if res.Receipt != nil {
			out["receipt"] = map[string]any{"seq": res.Receipt.Seq, "hash": res.Receipt.Hash.String()}
		}
		return writeJSON(c.Stdout, out)
	}
	ref := ""
	if res.Receipt != nil {
		ref = fmt.Sprintf("%d:%s", res.Receipt.Seq, res.Receipt.Hash)
	}
	return c.printResult(o, res.Status, ref, res.From, res.Through, res.Segment, false)
}

// pruneRefusalDB is pruneRefusal for the domain's error.
func pruneRefusalDB(le *ledger.Error) error {
	msg := fmt.Sprintf("prune refused (%v): %s", le.Details["reason"], le.Message)
	if p, ok := le.Details["pinned_by"].(*ledger.Pin); ok && p != nil {
		msg += fmt.Sprintf("; pinned by key %s (%s, from seq %d)", p.Key, p.State, p.Seq)
	}
	return errors.New(msg)
}

// dryRunDB prints the watermark of n read in process.
func (c *PruneCommand) dryRunDB(ctx context.Context, o *pruneOpts, n *ledger.Namespace) error {
	p, _, err := n.Policy(ctx)
	if err != nil {
		return err
	}
	floor := uint64(ledger.MinArchiveKeepMS)
	if p.Archive != nil {
		floor = p.Archive.MinKeepMS
	}
	m, err := n.Reader().Pruned(ctx)
	if err != nil {
		return err
	}
	w, err := n.Prunable(ctx, m.Through, floor)
	if err != nil {
		return err
	}
	if o.src.json {
		return writeJSON(c.Stdout, map[string]any{"namespace": n.Name(), "archive": p.Archive, "watermark": w,
			"pruned_through": m.Through, "kept_through": m.Kept})
	}
	var pin *pinText
	if w.Pin != nil {
		pin = &pinText{key: w.Pin.Key, state: string(w.Pin.State), seq: w.Pin.Seq, until: w.Pin.Until}
	}
	return c.printStatus(o, p.Archive != nil, m.Through, m.Kept, w.Through, w.Floor, w.Head, pin)
}

// pinText is the key generation that holds a watermark back.
type pinText struct {
	key, state string
	seq, until uint64
}

// printStatus prints a dry run.
func (c *PruneCommand) printStatus(o *pruneOpts, archive bool, pruned, kept, through, floor, head uint64, pin *pinText) error {
	var b strings.Builder
	fmt.Fprintf(&b, "namespace %s: head %d, pruned through %d (bodies deleted through %d)\n", o.src.ns(), head, pruned, kept)
	fmt.Fprintf(&b, "prunable through %d (receipts old enough for archive.min_keep_ms: through %d)\n", through, floor)
	if pin != nil {
		fmt.Fprintf(&b, "held back by key %s: %s, its generation from seq %d", pin.key, pin.state, pin.seq)
		if pin.until > 0 {
			fmt.Fprintf(&b, ", until %d (unix ms)", pin.until)
		}
		b.WriteString("\n")
	}
	switch {
	case !archive:
		b.WriteString("the policy has no archive member: nothing can be pruned until one is set\n")
	case o.through > 0 && o.through <= pruned:
		fmt.Fprintf(&b, "--through %d is already pruned\n", o.through)
	case o.through > through:
		fmt.Fprintf(&b, "--through %d would be refused: it is above the watermark\n", o.through)
	case o.through > 0:
		fmt.Fprintf(&b, "--through %d can be pruned (if a signed checkpoint covers it)\n", o.through)
	}
	_, err := fmt.Fprint(c.Stdout, b.String())
	return err
}

// printResult prints a prune's answer.
func (c *PruneCommand) printResult(o *pruneOpts, status, ref string, from, through uint64, segment string, deleting bool) error {
	var err error
	switch status {
	case ledger.PruneStatusPruned:
		where := segment
		if o.archiveDir != "" {
			where = filepath.Join(o.archiveDir, segment)
		}
		_, err = fmt.Fprintf(c.Stdout, "pruned receipts %d–%d of %s (prune receipt %s); archived in segment %s\n", from, through, o.src.ns(), ref, where)
		if err == nil && deleting {
			_, err = fmt.Fprintln(c.Stdout, "their bodies are being deleted in the background")
		}
	case ledger.PruneStatusAlready:
		_, err = fmt.Fprintf(c.Stdout, "already pruned: receipts %d–%d by prune receipt %s (segment %s)\n", from, through, ref, segment)
	default:
		_, err = fmt.Fprintf(c.Stdout, "nothing to prune (pruned through %d)\n", through)
	}
	return err
}
