// Command ledgerctl audits and inspects an effect ledger: it verifies the
// hash chain and the key state machine, reports runtime retries and
// re-invocations, lists receipts, and records operators' resolutions.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Exit codes.
const (
	ExitOK         = 0
	ExitViolations = 1
	ExitUsage      = 2
)

const usage = `ledgerctl audits and inspects an effect ledger.

Usage:
  ledgerctl <command> [flags]

Commands:
  verify    check chain integrity and the key state machine (exit 1 on violations)
  audit     runtime retries, re-invocations, duplicate effects, interrupted and failed keys
  receipts  list receipts, with the API's filters
  show      one key's state and its receipts as a timeline
  head      print the chain head
  export    print every receipt as JSON lines
  resolve   record an operator's decision about an interrupted key (server only)
  erase     erase the payloads of keys or of a subject in a committed namespace (server only); --replay FILE erases them again in a restored backup (--db)
  erasures  export what was erased (erasures export), for erase --replay on a restored backup
  token     create, list and revoke API bearer tokens (reader, writer, approver, admin; --db only), optionally limited to namespaces
  backup    copy a live SQLite ledger (every namespace) consistently, and verify the copy
  archive   write a verifiable segment of a namespace's receipts into an archive directory (--db only; deletes nothing)
  prune     archive, then prune, a namespace's old receipts (their hashes and every proof kept); --dry-run shows the watermark
  compact   give the space a prune freed back to the file system (SQLite, ledgerd stopped)
  rebuild-index rebuild the key index of a SQLite ledger from its receipts (ledgerd stopped)
  version   print the build version and the contract versions implemented
  keygen       make a checkpoint signing key for ledgerd --signing-key; print its verifier key
  keys         announce a new checkpoint signing key on the chain (rotate) and list the rotations (server only)
  checkpoint   print the latest signed checkpoint of the Merkle tree
  prove        print the portable receipt (receipt + inclusion proof + checkpoint) of a SEQ or KEY
  check-proof  check portable receipts with only the verifier key (exit 1 if one is not proven)
  namespace    create and list namespaces (independent chains), with their heads
  policy       set and show a namespace's gate policy: approvals, denials, the repeat guard (server only)
  approvals    list and show the asks awaiting a person, approve or reject them (server only)
  hook         the PreToolUse/PostToolUse command of coding agents (Claude Code, Codex); "hook install" writes their settings

The read commands take either the database (--db FILE for SQLite, or
--db postgres://… for PostgreSQL; opened read-only, safe while ledgerd runs)
or a running server (--server URL; a bare HOST:PORT means http://HOST:PORT),
and --namespace NS or -n NS (default "default"). "ledgerctl <command> --help" shows the
flags that command takes, with examples. The receipt format, the API and the rules the
verifier checks are in docs/spec.md.

Exit codes: 0 ok, 1 violations found, 2 usage or I/O error.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(Run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// Run runs ledgerctl with args and returns its exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitUsage
	}
	var cmd interface {
		Run(ctx context.Context, args []string) error
	}
	env := &Env{Stdout: stdout, Stderr: stderr}
	switch args[0] {
	case "verify":
		cmd = &VerifyCommand{Env: env}
	case "audit":
		cmd = &AuditCommand{Env: env}
	case "receipts":
		cmd = &ReceiptsCommand{Env: env}
	case "show":
		cmd = &ShowCommand{Env: env}
	case "head":
		cmd = &HeadCommand{Env: env}
	case "export":
		cmd = &ExportCommand{Env: env}
	case "resolve":
		cmd = &ResolveCommand{Env: env}
	case "erase":
		cmd = &EraseCommand{Env: env}
	case "erasures":
		cmd = &ErasuresCommand{Env: env}
	case "token":
		cmd = &TokenCommand{Env: env}
	case "rebuild-index", "rebuild-keys": // rebuild-keys: its name before the key index
		cmd = &RebuildIndexCommand{Env: env, name: args[0]}
	case "backup":
		cmd = &BackupCommand{Env: env}
	case "archive":
		cmd = &ArchiveCommand{Env: env}
	case "prune":
		cmd = &PruneCommand{Env: env}
	case "compact":
		cmd = &CompactCommand{Env: env}
	case "version", "--version", "-version":
		cmd = &VersionCommand{Env: env}
	case "keygen":
		cmd = &KeygenCommand{Env: env}
	case "keys":
		cmd = &KeysCommand{Env: env}
	case "checkpoint":
		cmd = &CheckpointCommand{Env: env}
	case "prove":
		cmd = &ProveCommand{Env: env}
	case "check-proof":
		cmd = &CheckProofCommand{Env: env}
	case "namespace":
		cmd = &NamespaceCommand{Env: env}
	case "policy":
		cmd = &PolicyCommand{Env: env}
	case "approvals":
		cmd = &ApprovalsCommand{Env: env}
	case "hook":
		cmd = &HookCommand{Env: env, Stdin: os.Stdin}
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return ExitOK
	default:
		fmt.Fprintf(stderr, "ledgerctl: unknown command %q\n\n%s", args[0], usage)
		return ExitUsage
	}
	err := cmd.Run(ctx, args[1:])
	var ve *ViolationsError
	var code exitCode
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, flag.ErrHelp):
		return ExitOK
	case errors.As(err, &ve):
		return ExitViolations
	case errors.As(err, &code):
		return int(code)
	case errors.Is(err, errUsage):
		return ExitUsage
	default:
		fmt.Fprintln(stderr, "ledgerctl:", err)
		return ExitUsage
	}
}

// ViolationsError means the ledger broke rules; the report was printed.
type ViolationsError struct{ Count int }

func (e *ViolationsError) Error() string { return plural(e.Count, "violation", "violations") }

// errUsage marks an error already explained by a usage message.
var errUsage = errors.New("usage")

// Env is what every command writes to.
type Env struct {
	Stdout, Stderr io.Writer
}
