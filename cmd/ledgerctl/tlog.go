package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// KeygenCommand writes a new checkpoint signing key.
type KeygenCommand struct{ Env *Env }

// Run runs keygen.
func (c *KeygenCommand) Run(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("keygen", flag.ContinueOnError)
	origin := fs.String("origin", tlog.DefaultOriginPrefix, "checkpoint origin `prefix` (ledgerd --log-origin); the key's name")
	out := fs.String("out", "", "write the private key to this new `file` (mode 0600)")
	from := fs.String("from", "", "print the verifier key of an existing --signing-key (an OpenSSH Ed25519 key `file` or ssh-agent:<fingerprint>) instead of making a key")
	pos, err := parse(fs, c.Env, args, `Usage: ledgerctl keygen --origin PREFIX --out FILE
       ledgerctl keygen --origin PREFIX --from KEY

Makes a new Ed25519 checkpoint signing key for ledgerd --signing-key, writes
it to FILE (note PRIVATE+KEY+… form, mode 0600, never overwriting a file) and
prints its verifier key on stdout: give that to whoever checks checkpoints
and proofs (ledgerctl check-proof --vkey, verify --vkey). With --from, prints
the verifier key of an OpenSSH Ed25519 key or an ssh-agent identity.`,
		`  ledgerctl keygen --origin ledger.example.com --out /etc/ledgerd/log.key
  ledgerctl keygen --origin ledger.example.com --from ~/.ssh/id_ed25519
  ledgerctl keygen --origin ledger.example.com --from ssh-agent:SHA256:abc…
`)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return usageErr(fs, c.Env, "unexpected arguments %q", pos)
	case *origin == "" || strings.ContainsAny(*origin, "+ \t\n"):
		return usageErr(fs, c.Env, "--origin must be a non-empty name without spaces or '+'")
	case (*out == "") == (*from == ""):
		return usageErr(fs, c.Env, "give --out FILE or --from KEY")
	}
	if *from != "" {
		_, vkey, closeKey, err := tlog.LoadSigner(*from, *origin, tlog.KeyOptions{})
		if err != nil {
			return err
		}
		_ = closeKey()
		_, err = fmt.Fprintln(c.Env.Stdout, vkey)
		return err
	}
	skey, vkey, err := tlog.GenerateKey(*origin)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	if _, err := f.WriteString(skey + "\n"); err != nil {
		_ = f.Close()
		return fmt.Errorf("keygen: %w", err)
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	_, err = fmt.Fprintln(c.Env.Stdout, vkey)
	return err
}

// logSource is what checkpoint and prove read, from a file or a server.
type logSource interface {
	checkpoint(ctx context.Context) ([]byte, error)
	// portable returns receipt seq with its inclusion proof; with
	// erasedBy, and the proof of its fields' erasure (SPEC §14).
	portable(ctx context.Context, seq uint64, erasedBy bool) (*tlog.PortableReceipt, error)
	key(ctx context.Context, key string) (*ledger.KeyView, error)
	Close() error
}

type fileLog struct{ fileStore }

func (f fileLog) checkpoint(ctx context.Context) ([]byte, error) {
	c, err := f.LatestCheckpoint(ctx)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, errors.New("no checkpoint has been signed yet (ledgerd --signing-key signs them)")
	}
	return []byte(c.Note), nil
}

func (f fileLog) portable(ctx context.Context, seq uint64, erasedBy bool) (*tlog.PortableReceipt, error) {
	l := ledger.Log{ChainReader: f.kept(), Payloads: f.Chain}
	p, err := l.PortableReceipt(ctx, seq)
	if err == nil && erasedBy {
		err = l.AddErasedBy(ctx, p)
	}
	return p, err
}

func (f fileLog) key(ctx context.Context, key string) (*ledger.KeyView, error) {
	return f.Key(ctx, key, false)
}

// openLog opens --db or --server as a logSource.
func (s *sourceFlags) openLog(ctx context.Context, fs *flag.FlagSet, env *Env) (logSource, error) {
	fsrc, c, err := s.openEither(ctx, fs, env)
	switch {
	case err != nil:
		return nil, err
	case c == nil:
		return fileLog{fsrc}, nil
	}
	return c, nil
}

// CheckpointCommand prints the latest signed checkpoint.
type CheckpointCommand struct{ Env *Env }

// Run runs checkpoint.
func (c *CheckpointCommand) Run(ctx context.Context, args []string) error {
	fs, src := readFlags("checkpoint")
	if err := parseNoArgs(fs, c.Env, args, `Usage: ledgerctl checkpoint (--db FILE|URL | --server URL)

Prints the latest signed checkpoint of the Merkle tree (a C2SP signed note:
origin, tree size, base64 root, then the signature lines). Keep it: a later
verify --checkpoint with it catches any rewrite of what it covers.`,
		`  ledgerctl checkpoint --server http://127.0.0.1:8080 > checkpoint.txt
  ledgerctl checkpoint --db ledger.db
`); err != nil {
		return err
	}
	l, err := src.openLog(ctx, fs, c.Env)
	if err != nil {
		return err
	}
	defer func() { _ = l.Close() }()
	note, err := l.checkpoint(ctx)
	if err != nil {
		return err
	}
	if src.json {
		cp, err := tlog.ParseCheckpoint(tlog.NoteText(note))
		if err != nil {
			return err
		}
		return writeJSON(c.Env.Stdout, map[string]any{"origin": cp.Origin, "tree_size": cp.Size,
			"root": tlog.HexHash(cp.Root), "checkpoint": string(note)})
	}
	_, err = c.Env.Stdout.Write(note)
	return err
}

// ProveCommand prints portable receipts.
type ProveCommand struct{ Env *Env }

// Run runs prove.
func (c *ProveCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("prove", flag.ContinueOnError)
	var src sourceFlags
	src.registerSource(fs)
	src.registerNamespace(fs)
	declareJSON(fs, &src.json, true, "print JSON (always: a portable receipt is JSON; accepted like every read command's --json)")
	erasedBy := fs.Bool("erased-by", false, "also prove the erasure of erased fields (\"erased_by\": the erase receipt, its inclusion proof and the erased ranges' opening); discloses which receipts were erased together; --server needs an admin token")
	pos, err := parse(fs, c.Env, args, `Usage: ledgerctl prove (--db FILE|URL | --server URL) [--erased-by] SEQ|KEY

Prints the portable receipt of receipt SEQ, or of every receipt of the
idempotency key KEY (one JSON object a line): the receipt, its leaf index,
its inclusion proof and the signed checkpoint it is proven against. Anyone
with the log's verifier key can check it with ledgerctl check-proof, with no
access to the ledger. An argument of digits only is a seq unless a key of
that name exists. In a committed namespace (contract §14) the receipt opens
its payload fields in "payloads" and names erased ones in "erased"; with
--erased-by it also carries "erased_by", which check-proof verifies to print
"erased by S". Its ranges name every receipt erased with this one (the chain
keeps them secret), so hand it only to whom may know that.`,
		`  ledgerctl prove --server http://127.0.0.1:8080 42 > receipt-42.json
  ledgerctl prove --db ledger.db refund-order-1234 > refund.jsonl
  ledgerctl prove --db ledger.db --erased-by 42 > receipt-42-erased.json
`)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr(fs, c.Env, "give one SEQ or KEY")
	}
	l, err := src.openLog(ctx, fs, c.Env)
	if err != nil {
		return err
	}
	defer func() { _ = l.Close() }()
	arg := pos[0]
	var seqs []uint64
	kv, kerr := l.key(ctx, arg)
	switch {
	case kerr == nil:
		for _, r := range kv.Receipts {
			seqs = append(seqs, r.Seq)
		}
	case ledger.ErrorCode(kerr) == ledger.ECodeUnknownKey || ledger.ErrorCode(kerr) == ledger.ECodeInvalidKey:
		seq, err := strconv.ParseUint(arg, 10, 63)
		if err != nil {
			return fmt.Errorf("prove: %q is neither a known key nor a seq", arg)
		}
		seqs = []uint64{seq}
	default:
		return kerr
	}
	for _, seq := range seqs {
		p, err := l.portable(ctx, seq, *erasedBy)
		if err != nil {
			return fmt.Errorf("prove receipt %d: %w", seq, err)
		}
		if err := writeJSON(c.Env.Stdout, p); err != nil {
			return err
		}
	}
	return nil
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

// Set adds one value.
func (l *listFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// flagSet reports whether the flag name (or its short form) was given.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name || shortForms[name] == f.Name })
	return set
}
