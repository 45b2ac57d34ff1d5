package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// ReceiptsCommand runs `ledgerctl receipts`.
type ReceiptsCommand struct{ *Env }

// Run lists one page of receipts.
func (c *ReceiptsCommand) Run(ctx context.Context, args []string) error {
	fs, src := readFlags("receipts")
	var f ledger.ReceiptFilter
	fs.Uint64Var(&f.After, "after", 0, "receipts with seq greater than `SEQ`")
	fs.IntVar(&f.Limit, "limit", ledger.DefaultPageLimit, "at most `N` receipts (1–1000)")
	fs.StringVar(&f.Key, "key", "", "only this idempotency `key`")
	fs.StringVar(&f.ExecutionID, "execution-id", "", "only this `execution`")
	fs.StringVar(&f.Tool, "tool", "", "only this `tool`")
	fs.StringVar(&f.Kind, "kind", "", "only this `kind`: "+chain.KindList())
	pos, err := parse(fs, c.Env, args, "Usage: ledgerctl receipts (--db FILE|URL | --server URL) [flags]\n\nLists receipts oldest first; the next page starts --after the last seq shown.",
		"  ledgerctl receipts --db ledger.db --limit 20\n  ledgerctl receipts --server http://127.0.0.1:8080 --kind commit --tool payments.refund --json\n")
	if err != nil {
		return err
	}
	if f.Limit < 1 || f.Limit > ledger.MaxPageLimit {
		return usageErr(fs, c.Env, "--limit must be from 1 to %d, got %d", ledger.MaxPageLimit, f.Limit)
	}
	if f.Kind != "" && !chain.KnownKind(f.Kind) {
		return usageErr(fs, c.Env, "--kind must be %s, got %q", chain.KindList(), f.Kind)
	}
	st, err := src.openNoArgs(ctx, fs, c.Env, pos)
	if err != nil {
		return err
	}
	defer st.Close()
	rs, next, err := st.ListReceipts(ctx, f)
	if err != nil {
		return err
	}
	if src.json {
		_, err := c.Stdout.Write(append(api.AppendReceiptPage(nil, rs, next), '\n'))
		return err
	}
	printReceipts(c.Stdout, rs)
	if next != nil {
		fmt.Fprintf(c.Stdout, "(more: --after %d)\n", *next)
	}
	return nil
}

func printReceipts(w io.Writer, rs []chain.Receipt) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tKIND\tKEY\tEXECUTION\tATTEMPT\tTOOL\tOUTCOME\tREF/ERROR\tREF_SEQ\tRECORDED\tHASH")
	for _, r := range rs {
		detail := r.Value(chain.FieldExternalRef)
		if r.ErrorCode != "" {
			detail = r.ErrorCode
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Seq, r.Kind, keyCell(r.IdempotencyKey),
			cell(r.ExecutionID), r.Attempt, cell(r.Tool), cell(r.Outcome), cell(detail), r.RefSeq, ms(r.RecordedAt), short(r.Hash.String()))
	}
	_ = tw.Flush()
}

// ShowCommand runs `ledgerctl show KEY`.
type ShowCommand struct{ *Env }

// Run prints a key's state and its receipts as a timeline.
func (c *ShowCommand) Run(ctx context.Context, args []string) error {
	fs, src := readFlags("show")
	history := fs.Bool("history", false, "list the receipts of every generation of the key, not only the current one")
	pos, err := parse(fs, c.Env, args, "Usage: ledgerctl show (--db FILE|URL | --server URL) [flags] KEY\n\n"+
		"Shows one key's state, fingerprint, expiry (in a namespace with a key TTL) and the receipts of\n"+
		"its current generation; --history shows those of the earlier generations too.",
		"  ledgerctl show --db ledger.db refund-order-1234\n  ledgerctl show --server http://127.0.0.1:8080 --json refund-order-1234\n"+
			"  ledgerctl show --db ledger.db --namespace reports --history daily-report\n")
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr(fs, c.Env, "want exactly one KEY")
	}
	st, err := src.open(ctx, fs, c.Env)
	if err != nil {
		return err
	}
	defer st.Close()
	v, err := st.Key(ctx, pos[0], *history)
	if err != nil {
		return err
	}
	if src.json {
		_, err := c.Stdout.Write(append(api.AppendKeyView(nil, v), '\n'))
		return err
	}
	fmt.Fprintf(c.Stdout, "key        %s\nstate      %s\ntool       %s\neffect     %s\nidempotent %t\ninput      %s\n",
		v.IdempotencyKey, v.State, v.Tool, v.Effect, v.Idempotent, cell(v.InputHash))
	if v.ExpiresAt != 0 {
		fmt.Fprintf(c.Stdout, "expires    %s\n", ms(v.ExpiresAt))
	}
	fmt.Fprintln(c.Stdout)
	tw := tabwriter.NewWriter(c.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tRECORDED\tKIND\tEXECUTION\tATTEMPT\tWHAT")
	for _, r := range v.Receipts {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\n", r.Seq, ms(r.RecordedAt), r.Kind, cell(r.ExecutionID), r.Attempt, describe(&r))
	}
	return tw.Flush()
}

// describe says in words what a receipt recorded.
func describe(r *chain.Receipt) string {
	switch r.Kind {
	case chain.KindReserve:
		s := "reserved until " + ms(r.LeaseExpiresAt)
		if r.RefSeq != 0 {
			s += fmt.Sprintf(" (after seq %d)", r.RefSeq)
		}
		return s
	case chain.KindReplay:
		return fmt.Sprintf("replayed the outcome of seq %d", r.RefSeq)
	}
	s := r.Outcome
	if ref := r.Value(chain.FieldExternalRef); ref != "" {
		s += " ref=" + cell(ref)
	}
	switch {
	case r.Outcome == chain.OutcomeNotApplied:
		s += " error=" + cell(r.ErrorCode) + " (nothing applied: the key may be reserved again)"
	case r.ErrorCode != "":
		s += fmt.Sprintf(" error=%s retryable=%t", cell(r.ErrorCode), r.Retryable)
	}
	if r.Kind == chain.KindResolve || r.Kind == chain.KindReconcile {
		s += fmt.Sprintf(" by %s: %s", cell(r.Actor), cell(r.Value(chain.FieldNote))) // a reconcile's note is its evidence
	}
	return s
}

// HeadCommand runs `ledgerctl head`.
type HeadCommand struct{ *Env }

// Run prints the chain head.
func (c *HeadCommand) Run(ctx context.Context, args []string) error {
	fs, src := readFlags("head")
	st, err := src.parseAndOpen(ctx, fs, c.Env, args, "Usage: ledgerctl head (--db FILE|URL | --server URL) [--json]\n\nPrints SEQ:HASH of the latest receipt, the form --expect-head takes.",
		"  ledgerctl head --db ledger.db\n  ledgerctl head --server http://127.0.0.1:8080 --json\n")
	if err != nil {
		return err
	}
	defer st.Close()
	h, err := st.Head(ctx)
	if err != nil {
		return err
	}
	if src.json {
		return writeJSON(c.Stdout, map[string]any{"seq": h.Seq, "hash": h.Hash.String()})
	}
	_, err = fmt.Fprintf(c.Stdout, "%d:%s\n", h.Seq, h.Hash)
	return err
}

// ExportCommand runs `ledgerctl export`.
type ExportCommand struct{ *Env }

// Run prints every receipt after --after as JSON lines.
func (c *ExportCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("export", flag.ContinueOnError)
	var src sourceFlags
	src.registerSource(fs)
	src.registerNamespace(fs)
	// Every read command takes --json (docs/spec.md §6); export's output
	// is JSON either way.
	declareJSON(fs, &src.json, false, "accepted for symmetry: export always prints JSON lines")
	after := fs.Uint64("after", 0, "export receipts with seq greater than `SEQ`")
	st, err := src.parseAndOpen(ctx, fs, c.Env, args, "Usage: ledgerctl export (--db FILE|URL | --server URL) [--after SEQ]\n\nPrints one JSON receipt a line, oldest first (the JSON form of docs/spec.md §2).",
		"  ledgerctl export --db ledger.db > receipts.jsonl\n  ledgerctl export --server http://127.0.0.1:8080 --after 1000\n")
	if err != nil {
		return err
	}
	defer st.Close()
	w := bufio.NewWriterSize(c.Stdout, 1<<16)
	buf := make([]byte, 0, 1024)
	if err := st.Receipts(ctx, *after, func(r *chain.Receipt) error {
		buf = append(r.AppendJSON(buf[:0]), '\n')
		_, err := w.Write(buf)
		return err
	}); err != nil {
		return err
	}
	return w.Flush()
}
