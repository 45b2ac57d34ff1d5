package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// ApprovalsCommand runs `ledgerctl approvals list|show|approve|reject`
// (SPEC §13) against a server.
type ApprovalsCommand struct{ *Env }

const approvalsUsage = `Usage:
  ledgerctl approvals list    --server URL [-n NS] [--state STATE] [--after SEQ] [--limit N] [--json]
  ledgerctl approvals show    --server URL [-n NS] SEQ [--json]
  ledgerctl approvals approve --server URL [-n NS] SEQ [--note TEXT] [--json]
  ledgerctl approvals reject  --server URL [-n NS] SEQ [--note TEXT] [--json]

A call that the namespace's policy sends to approval is recorded as an ask
(a receipt; SEQ is its seq) and waits for a person. "list" shows the asks,
"show" one ask with the input it asks to run, "approve" and "reject" answer
it: the same call made again then runs once, or is refused. Reading needs a
reader token (the input only an approver or admin token); answering an
approver or admin token that the policy's rule lists, not the one that
asked. "ledgerctl approvals <list|show|approve|reject> --help" shows each
one's flags.
`

// approvalStates are the states an ask may be listed by.
var approvalStates = []string{"pending", "approved", "rejected", "expired", "consumed"}

// maxApprovalNote is the longest note an answer may carry, in bytes.
const maxApprovalNote = 1024

// Run dispatches the approvals subcommands.
func (c *ApprovalsCommand) Run(ctx context.Context, args []string) error {
	return dispatch(ctx, c.Env, "approvals", approvalsUsage, args, []subcommand{
		{"list", c.list}, {"show", c.show},
		{"approve", func(ctx context.Context, args []string) error { return c.answer(ctx, "approve", args) }},
		{"reject", func(ctx context.Context, args []string) error { return c.answer(ctx, "reject", args) }}})
}

// approvalsSource registers --server, --token, --namespace (and -n) and
// --json.
func approvalsSource(fs *flag.FlagSet) *sourceFlags {
	src := serverOnly(fs)
	src.registerNamespace(fs)
	return src
}

func (c *ApprovalsCommand) list(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("approvals list", flag.ContinueOnError)
	src := approvalsSource(fs)
	state := fs.String("state", "", "only asks in this `state`: pending, approved, rejected, expired or consumed")
	after := fs.Uint64("after", 0, "asks with seq greater than `SEQ`")
	limit := fs.Int("limit", 0, "at most `N` asks (default: the server's)")
	if err := parseNoArgs(fs, c.Env, args, `Usage: ledgerctl approvals list --server URL [-n NS] [--state STATE] [--after SEQ] [--limit N] [--json]

Lists the asks of the namespace by seq, with their state, the tool and key
they would run, who asked, when they expire and the answer; the next page
starts --after the last seq shown.`,
		`  ledgerctl approvals list --server http://127.0.0.1:8080 --state pending
  ledgerctl approvals list --server http://127.0.0.1:8080 -n payments --json
`); err != nil {
		return err
	}
	if *state != "" && !contains(approvalStates, *state) {
		return usageErr(fs, c.Env, "--state must be pending, approved, rejected, expired or consumed, got %q", *state)
	}
	if *limit < 0 || *limit > ledger.MaxPageLimit {
		return usageErr(fs, c.Env, "--limit must be from 1 to %d, got %d", ledger.MaxPageLimit, *limit)
	}
	client, err := c.client(fs, src)
	if err != nil {
		return err
	}
	list, next, err := client.approvals(ctx, *state, *after, *limit)
	if err != nil {
		return approvalsErr(err)
	}
	if src.json {
		if list == nil {
			list = []api.ApprovalView{}
		}
		return writeJSON(c.Stdout, map[string]any{"approvals": list, "next_after": next})
	}
	printApprovals(c.Stdout, list)
	if next != nil {
		fmt.Fprintf(c.Stdout, "(more: --after %d)\n", *next)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// printApprovals prints asks as a table.
func printApprovals(w io.Writer, list []api.ApprovalView) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tSTATE\tTOOL\tKEY\tACTOR\tASKED\tEXPIRES\tANSWER\tSUMMARY")
	for _, a := range list {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Seq, a.State, cell(a.Tool), keyCell(a.IdempotencyKey),
			cell(a.Actor), ms(a.AskedAt), ms(a.ExpiresAt), cell(answerCell(a.Answer)), cell(a.Summary))
	}
	_ = tw.Flush()
}

// answerCell is an answer in a table cell: "approve by ACTOR", or "-".
func answerCell(a *api.ApprovalAnswer) string {
	if a == nil {
		return "-"
	}
	by := a.Actor
	if by == "" {
		by = "(no token)"
	}
	return a.Decision + " by " + by
}

// client returns the client of --server in --namespace.
func (c *ApprovalsCommand) client(fs *flag.FlagSet, src *sourceFlags) (*server, error) {
	if err := src.check(); err != nil {
		return nil, usageErr(fs, c.Env, "%v", err)
	}
	return src.client(fs, c.Env)
}

// seqArg parses the one positional SEQ.
func seqArg(fs *flag.FlagSet, env *Env, pos []string) (uint64, error) {
	if len(pos) != 1 {
		return 0, usageErr(fs, env, "want exactly one SEQ (the ask's seq, from approvals list)")
	}
	seq, err := strconv.ParseUint(pos[0], 10, 64)
	if err != nil || seq == 0 {
		return 0, usageErr(fs, env, "SEQ must be a positive integer, got %q", pos[0])
	}
	return seq, nil
}

func (c *ApprovalsCommand) show(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("approvals show", flag.ContinueOnError)
	src := approvalsSource(fs)
	pos, err := parse(fs, c.Env, args, `Usage: ledgerctl approvals show --server URL [-n NS] SEQ [--json]

Prints the ask SEQ: the call it would run, who asked and why (the summary is
the requester's own account), its state and answer, and the input itself,
indented, checked against the ask's input_hash. The input is shown to
approver and admin tokens only, and is deleted some days after the answer or
the expiry.`,
		`  ledgerctl approvals show --server http://127.0.0.1:8080 12
`)
	if err != nil {
		return err
	}
	seq, err := seqArg(fs, c.Env, pos)
	if err != nil {
		return err
	}
	client, err := c.client(fs, src)
	if err != nil {
		return err
	}
	a, err := client.approval(ctx, seq)
	if err != nil {
		return approvalsErr(err)
	}
	if src.json {
		return writeJSON(c.Stdout, a)
	}
	return printApproval(c.Stdout, a)
}

// printApproval prints one ask, its answer and its input.
func printApproval(w io.Writer, a *api.ApprovalView) error {
	idem := "not idempotent"
	if a.Idempotent {
		idem = "idempotent"
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "ask\t%d (%s)\n", a.Seq, a.State)
	fmt.Fprintf(tw, "key\t%s\n", keyCell(a.IdempotencyKey))
	fmt.Fprintf(tw, "tool\t%s (%s, %s)\n", keyCell(a.Tool), a.Effect, idem)
	fmt.Fprintf(tw, "execution\t%s attempt %d\n", keyCell(a.ExecutionID), a.Attempt)
	fmt.Fprintf(tw, "asked by\t%s at %s\n", orNone(a.Actor), ms(a.AskedAt))
	fmt.Fprintf(tw, "expires\t%s\n", ms(a.ExpiresAt))
	fmt.Fprintf(tw, "summary\t%s\n", keyCell(a.Summary))
	fmt.Fprintf(tw, "input hash\t%s\n", a.InputHash)
	if an := a.Answer; an != nil {
		line := fmt.Sprintf("%s by %s (%s) at %s, receipt %d", an.Decision, orNone(an.Actor), an.Role, ms(an.RecordedAt), an.Seq)
		if an.Note != "" {
			line += ": " + keyCell(an.Note)
		}
		fmt.Fprintf(tw, "answer\t%s\n", line)
	}
	if cb := a.ConsumedBy; cb != nil {
		fmt.Fprintf(tw, "consumed by\treserve %d (%s attempt %d)\n", cb.Seq, keyCell(cb.ExecutionID), cb.Attempt)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case len(a.Input) == 0 || string(a.Input) == "null":
		_, err := fmt.Fprintln(w, "input: not shown (deleted, or this token may not see it)")
		return err
	case a.InputVerified != nil && !*a.InputVerified:
		fmt.Fprintln(w, "input (NOT verified: its hash differs from the input hash above):")
	default:
		fmt.Fprintln(w, "input (verified against the input hash):")
	}
	return writeIndented(w, a.Input)
}

// orNone shows an empty actor as "(no token)".
func orNone(s string) string {
	if s == "" || s == "-" {
		return "(no token)"
	}
	return s
}

func (c *ApprovalsCommand) answer(ctx context.Context, decision string, args []string) error {
	fs := flag.NewFlagSet("approvals "+decision, flag.ContinueOnError)
	src := approvalsSource(fs)
	note := fs.String("note", "", "why, as `text` (recorded on the chain, at most 1024 bytes)")
	summary := map[string]string{
		"approve": "Approves the ask SEQ: the call it asks for may then run once, when the\nsame call is made again by whoever asked, before the ask expires.",
		"reject":  "Rejects the ask SEQ: the call is refused (approval_rejected) from now on.",
	}[decision]
	pos, err := parse(fs, c.Env, args, fmt.Sprintf(`Usage: ledgerctl approvals %s --server URL [-n NS] SEQ [--note TEXT] [--json]

%s

Needs an approver or admin token that the policy's rule lists, and not the
token that asked. Read the input first with "ledgerctl approvals show SEQ".
Sending the same decision again prints the recorded answer.`, decision, summary),
		fmt.Sprintf("  ledgerctl approvals %s --server http://127.0.0.1:8080 12 --note \"checked with the customer\"\n", decision))
	if err != nil {
		return err
	}
	seq, err := seqArg(fs, c.Env, pos)
	if err != nil {
		return err
	}
	if len(*note) > maxApprovalNote || !utf8.ValidString(*note) {
		return usageErr(fs, c.Env, "--note must be UTF-8 of at most %d bytes", maxApprovalNote)
	}
	client, err := c.client(fs, src)
	if err != nil {
		return err
	}
	a, err := client.answer(ctx, seq, decision, *note)
	if err != nil {
		return approvalsErr(err)
	}
	if src.json {
		return writeJSON(c.Stdout, a)
	}
	past := map[string]string{"approve": "approved", "reject": "rejected"}[decision]
	if a.Answer == nil {
		_, err = fmt.Fprintf(c.Stdout, "ask %d %s (now %s)\n", a.Seq, past, a.State)
		return err
	}
	_, err = fmt.Fprintf(c.Stdout, "ask %d %s by %s (approval receipt %d; now %s)\n", a.Seq, past, orNone(a.Answer.Actor),
		a.Answer.Seq, a.State)
	return err
}
