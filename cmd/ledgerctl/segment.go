package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/archive"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// ArchiveCommand runs `ledgerctl archive`: it writes a segment (SPEC §16)
// of a namespace's receipts from a database opened read-only. It deletes
// nothing: the segment is a verifiable copy.
type ArchiveCommand struct{ *Env }

const archiveSummary = `Usage: ledgerctl archive --db FILE|URL [--namespace NS] [--from SEQ] --through SEQ --dir DIR [--vkey KEY…] [--json]

Writes the segment NS-FROM-THROUGH into DIR: the receipts from --from (default
1) through --through in canonical JSON, the payload values and salts still
kept, and a manifest with the chain hash before them, the tree's frontier and
the latest signed checkpoint (which must cover --through) with the
consistency proof to it. The files are fsynced, then the directory is renamed
into place and read back with ledgerctl verify --segment's checks (and the
checkpoint's signature, given --vkey). Nothing is deleted from the ledger.
Exit 0 written, 2 error.`

const archiveExamples = `  ledgerctl archive --db ledger.db --namespace payments --through 100000 --dir /srv/ledger-archive --vkey ./log.vkey
  ledgerctl verify --segment /srv/ledger-archive/payments-1-100000 --vkey ./log.vkey
`

// Run runs archive.
func (c *ArchiveCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("archive", flag.ContinueOnError)
	src := new(sourceFlags)
	src.registerDB(fs)
	src.registerNamespace(fs)
	src.registerJSON(fs)
	from := fs.Uint64("from", 1, "the first receipt's `seq`")
	through := fs.Uint64("through", 0, "the last receipt's `seq` (required)")
	dir := fs.String("dir", "", "the archive `directory` the segment goes in (required; it must exist)")
	var vkeys listFlag
	fs.Var(&vkeys, "vkey", "the log's verifier `key` (or a file holding it) to check the checkpoint's signature when the segment is read back; repeatable")
	if err := parseNoArgs(fs, c.Env, args, archiveSummary, archiveExamples); err != nil {
		return err
	}
	switch {
	case src.db == "":
		return usageErr(fs, c.Env, "--db is required")
	case *through == 0 || *dir == "":
		return usageErr(fs, c.Env, "--through and --dir are required")
	}
	vs, err := verifiers(fs, c.Env, vkeys)
	if err != nil {
		return err
	}
	st, _, err := src.openEither(ctx, fs, c.Env)
	if err != nil {
		return err
	}
	defer st.Close()
	path, err := ledger.Log{ChainReader: st.Chain, Payloads: st.Chain}.WriteSegment(ctx, src.ns(), *dir, *from, *through, vs)
	if err != nil {
		return err
	}
	got, err := archive.Check(path, vs)
	if err != nil {
		return err
	}
	return printSegment(c.Env, src.json, path, got)
}

// segmentReport is verify --segment's and archive's --json output.
type segmentReport struct {
	OK        bool     `json:"ok"`
	Path      string   `json:"path"`
	Namespace string   `json:"namespace,omitempty"`
	From      uint64   `json:"from,omitempty"`
	Through   uint64   `json:"through,omitempty"`
	Payloads  uint64   `json:"payloads"`
	Digest    string   `json:"digest,omitempty"`
	TreeSize  int64    `json:"tree_size,omitempty"`
	Signers   []string `json:"signers"`
	Rule      string   `json:"rule,omitempty"`
	Detail    string   `json:"detail,omitempty"`
}

// printSegment prints a segment Check found whole.
func printSegment(env *Env, asJSON bool, path string, got *archive.Checked) error {
	rep := segmentReport{OK: true, Path: path, Namespace: got.Namespace, From: got.From, Through: got.Through,
		Payloads: got.Payloads, Digest: got.Digest, TreeSize: got.Tree.Size, Signers: got.Signers}
	if rep.Signers == nil {
		rep.Signers = []string{}
	}
	if asJSON {
		return writeJSON(env.Stdout, rep)
	}
	signed := "signature not checked (no --vkey)"
	if len(got.Signers) > 0 {
		signed = fmt.Sprintf("signed by key ids %s", strings.Join(got.Signers, ", "))
	}
	fmt.Fprintf(env.Stdout, "OK: segment %s: namespace %s, receipts %d…%d, %s, digest %s; in the tree of the checkpoint of size %d, %s\n",
		path, got.Namespace, got.From, got.Through, plural(got.Payloads, "payload", "payloads"), got.Digest, got.Tree.Size, signed)
	return nil
}

// verifySegment runs verify --segment DIR: the segment checked alone
// (archive.Check). Exit 0 whole, 1 segment_invalid, 2 unreadable.
func (c *VerifyCommand) verifySegment(fs *flag.FlagSet, asJSON bool, path string, vkeys listFlag) error {
	vs, err := verifiers(fs, c.Env, vkeys)
	if err != nil {
		return err
	}
	got, err := archive.Check(path, vs)
	switch {
	case err == nil:
		return printSegment(c.Env, asJSON, path, got)
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("verify --segment: %w", err)
	case !errors.Is(err, archive.ErrInvalid):
		return err
	}
	rep := segmentReport{Path: path, Signers: []string{}, Rule: "segment_invalid", Detail: err.Error()}
	if asJSON {
		if err := writeJSON(c.Stdout, rep); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(c.Stdout, "FAILED: segment %s: segment_invalid: %v\n", path, err)
	}
	return &ViolationsError{Count: 1}
}

// verifiers parses --vkey values (keys or files holding them): a usage
// error names the one that does not parse.
func verifiers(fs *flag.FlagSet, env *Env, vkeys listFlag) ([]note.Verifier, error) {
	var vs []note.Verifier
	for _, s := range vkeys {
		v, err := readVerifier(s, tlog.NewVerifier)
		if err != nil {
			return nil, usageErr(fs, env, "--vkey: %v", err)
		}
		vs = append(vs, v)
	}
	return vs, nil
}
