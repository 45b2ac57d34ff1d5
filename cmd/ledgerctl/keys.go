package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/effect-ledger/effect-ledger/verify"
)

// KeysCommand runs `ledgerctl keys rotate|list` (SPEC §9.2) against a
// server.
type KeysCommand struct{ *Env }

const keysUsage = `Usage:
  ledgerctl keys rotate --server URL [--namespace NS] --new-vkey VKEY [--retires ID] [--json]
  ledgerctl keys list   --server URL [--namespace NS] [--json]

A namespace's checkpoints are signed by the log's key; a new key is
announced on the chain by a key receipt, so that verifiers who trust the old
key learn the new one from the log itself. Make the new key with ledgerctl
keygen, announce it with keys rotate (an admin token), restart ledgerd with
--signing-key NEW --handover-key OLD, then with NEW alone
(docs/operations.md). "ledgerctl keys <rotate|list> --help" shows each one's
flags.
`

// Run dispatches the keys subcommands.
func (c *KeysCommand) Run(ctx context.Context, args []string) error {
	return dispatch(ctx, c.Env, "keys", keysUsage, args, []subcommand{{"rotate", c.rotate}, {"list", c.list}})
}

func (c *KeysCommand) rotate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("keys rotate", flag.ContinueOnError)
	src := serverOnly(fs)
	src.registerNamespace(fs)
	vkey := fs.String("new-vkey", "", "the new key's verifier `key` (as ledgerctl keygen prints it), or a file holding it")
	retires := fs.String("retires", "", "the key `id` (8 hex digits) it retires; default: the key in use")
	pos, err := parse(fs, c.Env, args, `Usage: ledgerctl keys rotate --server URL [--namespace NS] --new-vkey VKEY [--retires ID] [--json]

Appends a key receipt to namespace NS (default "default"): it announces VKEY
as the key that signs the namespace's checkpoints from now on, and retires
the key in use. VKEY must bear the log's origin prefix as its name. A key
is retired once and announced once: a second rotation of either is refused
(409 key_rotation_conflict). Needs an admin token.`,
		`  ledgerctl keygen --origin ledger.example.com --out /etc/ledgerd/log-2027.key > log-2027.vkey
  ledgerctl keys rotate --server http://127.0.0.1:8080 --namespace payments --new-vkey ./log-2027.vkey
`)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageErr(fs, c.Env, "unexpected arguments %q", pos)
	}
	if *vkey == "" {
		return usageErr(fs, c.Env, "give --new-vkey")
	}
	if err := src.check(); err != nil {
		return usageErr(fs, c.Env, "%v", err)
	}
	key, err := readKeyText(*vkey)
	if err != nil {
		return usageErr(fs, c.Env, "--new-vkey: %v", err)
	}
	if strings.HasPrefix(key, "PRIVATE+KEY+") {
		return usageErr(fs, c.Env, "--new-vkey: that is a private key; give the verifier key ledgerctl keygen printed (the private key stays with ledgerd)")
	}
	srv, err := src.client(fs, c.Env)
	if err != nil {
		return err
	}
	res, err := srv.Client.RotateKey(ctx, key, *retires)
	if err != nil {
		return verify.ServerErr(err)
	}
	if src.json {
		return writeJSON(c.Stdout, res)
	}
	_, err = fmt.Fprintf(c.Stdout, "key %s announced in %s, retiring key %s (key receipt %d:%s)\n", res.KeyID, src.ns(), res.Retires,
		res.Receipt.Seq, res.Receipt.Hash)
	return err
}

func (c *KeysCommand) list(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("keys list", flag.ContinueOnError)
	src := serverOnly(fs)
	src.registerNamespace(fs)
	pos, err := parse(fs, c.Env, args, `Usage: ledgerctl keys list --server URL [--namespace NS] [--json]

Lists the namespace's key receipts (the rotation history) and the ids of the
keys that signed its latest checkpoint.`, "  ledgerctl keys list --server http://127.0.0.1:8080 --namespace payments\n")
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageErr(fs, c.Env, "unexpected arguments %q", pos)
	}
	if err := src.check(); err != nil {
		return usageErr(fs, c.Env, "%v", err)
	}
	srv, err := src.client(fs, c.Env)
	if err != nil {
		return err
	}
	res, err := srv.Client.SigningKeys(ctx)
	if err != nil {
		return verify.ServerErr(err)
	}
	if src.json {
		return writeJSON(c.Stdout, res)
	}
	tw := tabwriter.NewWriter(c.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tKEY\tRETIRES\tACTOR\tVKEY")
	for _, r := range res.Rotations {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", r.Seq, r.KeyID, r.Retires, r.Actor, r.VKey)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.Stdout, "latest checkpoint (size %d) signed by: %s\n", res.CheckpointSize, strings.Join(res.CheckpointKeys, ", "))
	return err
}
