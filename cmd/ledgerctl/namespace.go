package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// NamespaceCommand runs `ledgerctl namespace create|list|forget`.
type NamespaceCommand struct{ *Env }

const namespaceUsage = `Usage:
  ledgerctl namespace create (--db FILE|URL | --server URL) NAME [--key-ttl DURATION] [--json]
  ledgerctl namespace list   (--db FILE|URL | --server URL) [--json]
  ledgerctl namespace forget --db FILE NAME --by WHO --reason TEXT [--json]

A namespace is an independent chain: its own seq 1, 2, 3 …, its own head, its
own idempotency keys (the same key in two namespaces names two effects) and
its own verifiable log. The namespace "default" always exists and is what the
unprefixed API routes serve; namespace NAME is served under /v1/ns/NAME/… and
/log/NAME/. Names are 1–64 bytes of a-z 0-9 . _ -.

On SQLite every namespace lives in the ledger file itself, in the file's
shared tables (ns_receipts, ns_head, …), its rows keyed by its id: "default"
is 0 (the view receipts is its chain), each other namespace has the id the
file's registry gave it. One file holds them all: "ledgerctl backup" copies
and verifies it as one snapshot. "namespace create --db" may run while ledgerd serves the file;
"namespace forget" gives a namespace up, keeping its receipts in a ledger file
of their own. On PostgreSQL every namespace lives in the same tables, keyed
by name. "ledgerctl namespace <create|list|forget> --help" shows each one's
flags.
`

// Run dispatches the namespace subcommands.
func (c *NamespaceCommand) Run(ctx context.Context, args []string) error {
	return dispatch(ctx, c.Env, "namespace", namespaceUsage, args, []subcommand{
		{"create", c.create}, {"list", c.list}, {"forget", c.forget}})
}

// namespaceSource registers the flags of a namespace subcommand.
func namespaceSource(fs *flag.FlagSet, writes bool) *sourceFlags {
	var src sourceFlags
	src.hasDB = true
	usage := dbUsage
	if writes {
		usage = "ledger `database`: a SQLite file (may be served by a running ledgerd) or a PostgreSQL URL (postgres://user:pass@host/db)"
	}
	declareDB(fs, &src.db, usage)
	src.registerServer(fs)
	src.registerJSON(fs)
	return &src
}

func (c *NamespaceCommand) create(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("namespace create", flag.ContinueOnError)
	src := namespaceSource(fs, true)
	ttl := fs.Duration("key-ttl", 0, "forget a finalized key this long after its outcome, e.g. 24h (0: never); fixed at creation")
	payloads := fs.String("payloads", "", "inline or committed: how the payload fields are kept (docs/privacy.md; default "+string(ledger.DefaultPayloads)+"); fixed at creation")
	pos, err := parse(fs, c.Env, args, `Usage: ledgerctl namespace create (--db FILE|URL | --server URL) NAME [--key-ttl DURATION] [--payloads MODE] [--json]

Creates the empty namespace NAME (1–64 bytes of a-z 0-9 . _ -). With --server
it needs an admin token when tokens exist. With --db it registers NAME in
the ledger database (on SQLite, in the ledger file's registry and shared
tables); a running ledgerd serves it at once. Exit 2 if NAME exists.

--key-ttl sets the namespace's key lifetime: a reserve of a key whose
outcome (success or failure) is at least that old starts a new generation
of the key instead of replaying or refusing it. Reserved and interrupted
keys never expire. It is fixed when the namespace is created.

--payloads committed keeps the values of external_ref, result,
error_message and note beside the chain, which holds salted commitments
to them (docs/privacy.md); inline keeps them in the receipts. Fixed when
the namespace is created.`,
		`  ledgerctl namespace create --db ledger.db payments
  ledgerctl namespace create --db ledger.db reports --key-ttl 24h
  ledgerctl namespace create --db ledger.db customers --payloads committed
  ledgerctl namespace create --server http://127.0.0.1:8080 payments
  ledgerctl namespace create --db postgres://ledger@db.internal/ledger payments
`)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr(fs, c.Env, "want exactly one NAME")
	}
	name := pos[0]
	if err := src.check(); err != nil {
		return usageErr(fs, c.Env, "%v", err)
	}
	if !ledger.ValidNamespace(name) {
		return usageErr(fs, c.Env, "namespace %q: names are 1–64 bytes of a-z 0-9 . _ -", name)
	}
	keyTTL, err := keyTTLMS(*ttl)
	if err != nil {
		return usageErr(fs, c.Env, "--key-ttl: %v", err)
	}
	mode, err := ledger.ParsePayloadMode(*payloads, ledger.DefaultPayloads)
	if err != nil {
		return usageErr(fs, c.Env, "--payloads: want inline or committed")
	}
	st := ledger.NamespaceSettings{KeyTTL: keyTTL, Payloads: mode}
	info := ledger.NamespaceInfo{Name: name, KeyTTL: keyTTL, Payloads: mode}
	if src.server != "" {
		client, err := src.client(fs, c.Env)
		if err != nil {
			return err
		}
		if info, err = client.createNamespace(ctx, name, st); err != nil {
			return err
		}
	} else if err := createNamespaceDB(ctx, c.Env, src.db, name, st); err != nil {
		return err
	}
	if src.json {
		return writeJSON(c.Stdout, namespaceJSON(info))
	}
	where := storage.Describe(src.db)
	if src.server != "" {
		where = src.server
	} else if file, ok := storage.NamespaceFile(src.db, name); ok {
		where = file
	}
	_, err = fmt.Fprintf(c.Stdout, "namespace %s created (%s)\n", name, where)
	return err
}

// keyTTLMS converts a --key-ttl duration to key_ttl_ms: whole
// milliseconds from 0 to ledger.MaxKeyTTL.
func keyTTLMS(d time.Duration) (uint64, error) {
	if d < 0 || d%time.Millisecond != 0 || uint64(d.Milliseconds()) > ledger.MaxKeyTTL {
		return 0, fmt.Errorf("%s is not a whole number of milliseconds from 0 up", d)
	}
	return uint64(d.Milliseconds()), nil
}

// createNamespaceDB creates namespace name in the database dsn.
func createNamespaceDB(ctx context.Context, env *Env, dsn, name string, st ledger.NamespaceSettings) error {
	if err := checkDB(dsn); err != nil {
		return err
	}
	err := storage.CreateNamespace(ctx, dsn, name, st, storage.Options{Logger: warnLogger(env)})
	if errors.Is(err, ledger.ErrNamespaceExists) {
		return fmt.Errorf("namespace %q exists in %s", name, storage.Describe(dsn))
	}
	return storage.RedactError(dsn, err)
}

// namespaceJSON is a namespace as the API and --json show it.
func namespaceJSON(n ledger.NamespaceInfo) map[string]any {
	out := map[string]any{"name": n.Name, "head": map[string]any{"seq": n.Head.Seq, "hash": n.Head.Hash.String()},
		"key_ttl_ms": n.KeyTTL, "payloads": n.Payloads}
	if n.SwitchedAt > 0 {
		out["committed_after"] = n.SwitchedAt
	}
	return out
}

func (c *NamespaceCommand) list(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("namespace list", flag.ContinueOnError)
	src := namespaceSource(fs, false)
	pos, err := parse(fs, c.Env, args, `Usage: ledgerctl namespace list (--db FILE|URL | --server URL) [--json]

Lists the namespaces by name, "default" included, with their heads (SEQ:HASH,
the form verify --expect-head takes), their key lifetimes (KEY_TTL, "-" for
keys that never expire) and payload modes (PAYLOADS: inline or committed;
"committed after S" for a namespace a policy switched from inline at seq S,
whose receipts up to S stay inline).
Through --server a token limited to namespaces sees only those.`,
		`  ledgerctl namespace list --db ledger.db
  ledgerctl namespace list --server http://127.0.0.1:8080 --json
`)
	if err != nil {
		return err
	}
	if err := src.checkNoArgs(fs, c.Env, pos); err != nil {
		return err
	}
	var list []ledger.NamespaceInfo
	if src.server != "" {
		client, err := src.client(fs, c.Env)
		if err != nil {
			return err
		}
		if list, err = client.namespaces(ctx); err != nil {
			return err
		}
	} else if list, err = listNamespacesDB(ctx, c.Env, src.db); err != nil {
		return err
	}
	if src.json {
		out := make([]map[string]any, 0, len(list))
		for _, n := range list {
			out = append(out, namespaceJSON(n))
		}
		return writeJSON(c.Stdout, map[string]any{"namespaces": out})
	}
	tw := tabwriter.NewWriter(c.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSEQ\tHASH\tKEY_TTL\tPAYLOADS")
	for _, n := range list {
		ttl := "-"
		if n.KeyTTL != 0 {
			ttl = ledger.MsDuration(n.KeyTTL).String()
		}
		mode := string(n.Payloads)
		if n.SwitchedAt > 0 {
			mode = fmt.Sprintf("%s after %d", mode, n.SwitchedAt)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", n.Name, n.Head.Seq, n.Head.Hash, ttl, mode)
	}
	return tw.Flush()
}

// listNamespacesDB lists the namespaces of the database dsn with their
// heads, read without a lock.
func listNamespacesDB(ctx context.Context, env *Env, dsn string) ([]ledger.NamespaceInfo, error) {
	st, err := openDB(ctx, dsn, env, true)
	if err != nil {
		return nil, err
	}
	defer func() { _ = st.Close() }()
	names, err := st.Namespaces(ctx)
	if err != nil {
		return nil, storage.RedactError(dsn, fmt.Errorf("list namespaces: %w", err))
	}
	slices.Sort(names)
	out := make([]ledger.NamespaceInfo, 0, len(names))
	for _, name := range names {
		ch, err := chainOf(ctx, st, dsn, name)
		if err != nil {
			return nil, err
		}
		h, err := ch.Head(ctx)
		if err != nil {
			return nil, storage.RedactError(dsn, fmt.Errorf("namespace %s: head: %w", name, err))
		}
		ttl, err := ch.KeyTTL(ctx)
		if err != nil {
			return nil, storage.RedactError(dsn, fmt.Errorf("namespace %s: key ttl: %w", name, err))
		}
		mode, at, err := ledger.PayloadsOf(ctx, ch)
		if err != nil {
			return nil, storage.RedactError(dsn, fmt.Errorf("namespace %s: payload mode: %w", name, err))
		}
		out = append(out, ledger.NamespaceInfo{Name: name, Head: h, KeyTTL: ttl, Payloads: mode, SwitchedAt: at})
	}
	return out, nil
}

func (c *NamespaceCommand) forget(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("namespace forget", flag.ContinueOnError)
	db := dbFlag(fs, "the SQLite ledger `file` (ledgerd stopped)")
	by := fs.String("by", "", "`who` decides to give the namespace up (recorded)")
	reason := fs.String("reason", "", "`why` (recorded)")
	asJSON := jsonFlag(fs, "print the result as JSON")
	pos, err := parse(fs, c.Env, args, `Usage: ledgerctl namespace forget --db FILE NAME --by WHO --reason TEXT [--json]

Gives up namespace NAME of a SQLite ledger that is no longer wanted: its
receipts are first copied to a ledger file of their own beside the ledger
file (a namespace whose payloads can be erased has every value erased
before, by erase receipts of actor WHO with note TEXT), <db>.forgotten-NAME-UNIXMS (ledgerctl verify --db reads it), then its
rows leave the ledger file's shared tables and the name its registry, and the
decision — who, why, and the head the registry had recorded — is kept in the
ledger file's namespace_events table. NAME can then be created again, empty:
keys used in it before run again. A ledger of the earlier layout, whose
namespace file is missing or behind the registry, makes ledgerd refuse to
start; forget gives such a namespace up too (its file, if any, is moved
aside, nothing is deleted), restoring the namespace files of the same backup
is the other way out. Needs ledgerd stopped. Exit 2 on any error.`,
		`  ledgerctl namespace forget --db ledger.db payments --by alice --reason "disk lost, no backup (INC-42)"
`)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr(fs, c.Env, "want exactly one NAME")
	}
	switch {
	case *db == "":
		return usageErr(fs, c.Env, "--db is required")
	case errors.Is(storage.CheckFile(*db), storage.ErrNoFiles):
		return usageErr(fs, c.Env, "forget is for SQLite ledgers: a PostgreSQL namespace has no file to lose")
	case *by == "" || *reason == "":
		return usageErr(fs, c.Env, "--by and --reason are required: the decision is recorded")
	case ledger.CheckEraseReason(*reason) != nil:
		// The note of the erase receipts a committed namespace gets first.
		return usageErr(fs, c.Env, "--reason must be UTF-8 of at most 256 characters")
	}
	if err := checkDB(*db); err != nil {
		return err
	}
	erased, err := eraseBeforeForget(ctx, c.Env, *db, pos[0], *by, *reason)
	if err != nil {
		return fmt.Errorf("forget: erasing the namespace's payloads first: %w (nothing was forgotten)", err)
	}
	res, err := sqlite.ForgetNamespace(ctx, *db, pos[0], *by, *reason)
	if errors.Is(err, ledger.ErrUnknownNamespace) {
		return fmt.Errorf("no namespace %q in %s", pos[0], *db)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		seqs := make([]uint64, 0, len(erased))
		for _, r := range erased {
			seqs = append(seqs, r.Seq)
		}
		return writeJSON(c.Stdout, map[string]any{"name": pos[0], "forgotten": true, "moved_to": res.MovedTo,
			"recorded_head": map[string]any{"seq": res.Head.Seq, "hash": res.Head.Hash.String()}, "erased_by": seqs})
	}
	if len(erased) > 0 {
		if _, err := fmt.Fprintf(c.Stdout, "namespace %s: its payloads erased first (erase receipts %d–%d)\n",
			pos[0], erased[0].Seq, erased[len(erased)-1].Seq); err != nil {
			return err
		}
	}
	moved := "its file was missing"
	switch {
	case res.Kept:
		moved = "its receipts kept in " + res.MovedTo
	case res.MovedTo != "":
		moved = "its file moved to " + res.MovedTo
	}
	_, err = fmt.Fprintf(c.Stdout, "namespace %s forgotten (%s; the registry had recorded %d receipts); decided by %s: %s\n",
		pos[0], moved, res.Head.Seq, *by, *reason)
	return err
}

// eraseBeforeForget erases every value namespace ns of the SQLite ledger
// db keeps (SPEC §14: forget of a committed namespace erases its payloads
// first), so that neither the copy forget keeps nor the ledger file holds
// them, and waits until the file and its WAL are rid of them. It returns
// the erase receipts, none when the namespace kept no value.
func eraseBeforeForget(ctx context.Context, env *Env, db, ns, by, reason string) ([]ledger.ReceiptRef, error) {
	keeps, err := sqlite.NamespaceKeepsPayloads(ctx, db, ns)
	if err != nil || !keeps {
		return nil, err
	}
	st, err := openDB(ctx, db, env, false)
	if err != nil {
		return nil, err
	}
	l := ledger.New(st, ledger.Config{Logger: warnLogger(env), CanPurge: true})
	erased, err := func() ([]ledger.ReceiptRef, error) {
		n, err := l.NS(ctx, ns)
		if err != nil {
			return nil, err
		}
		erased, err := n.EraseAll(ctx, by, reason)
		if err != nil || len(erased) == 0 {
			return erased, err
		}
		purged, err := waitPurged(ctx, n, erased)
		if err == nil && !purged {
			err = fmt.Errorf("the values are erased, but the file's log still held them after %s", purgeWait)
		}
		return erased, err
	}()
	if cerr := l.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return erased, err
}
