package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/effect-ledger/effect-ledger/verify"
)

// AuditCommand runs `ledgerctl audit`.
type AuditCommand struct {
	*Env
}

const auditExamples = `  ledgerctl audit --db ledger.db
  ledgerctl audit --server http://127.0.0.1:8080 --since 24h --tool payments.refund
  ledgerctl audit --db ledger.db --since 2026-11-01T00:00:00Z --json
`

// Run prints the audit: runtime retries, re-invocations, duplicate
// effects, interrupted and failed keys, and operator resolutions.
func (c *AuditCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	var src sourceFlags
	src.register(fs)
	since := fs.String("since", "", "only events since `WHEN`: an RFC 3339 time or a duration ago such as 24h")
	tool := fs.String("tool", "", "only keys of this `tool`")
	pos, err := parse(fs, c.Env, args, "Usage: ledgerctl audit (--db FILE | --server URL) [flags]\n\nTells runtime retries (same execution, next attempt) from re-invocations (a new\nexecution of the same call) and lists what needs attention. Exit 1 if the chain\nitself has violations (run verify to see them).", auditExamples)
	if err != nil {
		return err
	}
	filter := verify.AuditFilter{Tool: *tool}
	if *since != "" {
		t, err := parseSince(*since, time.Now())
		if err != nil {
			return usageErr(fs, c.Env, "--since: %v", err)
		}
		filter.Since = t
	}
	st, err := src.openNoArgs(ctx, fs, c.Env, pos)
	if err != nil {
		return err
	}
	defer st.Close()
	rep, err := verify.New(st, verify.Opts{Filter: filter}).Check(ctx)
	if err != nil {
		return err
	}
	if src.json {
		err = writeJSON(c.Stdout, rep.Audit)
	} else {
		printAudit(c.Stdout, rep.Audit)
	}
	if err != nil {
		return err
	}
	if !rep.OK {
		fmt.Fprintf(c.Stderr, "ledgerctl audit: the chain has %d violations; run ledgerctl verify\n", rep.ViolationsTotal)
		return &ViolationsError{Count: rep.ViolationsTotal}
	}
	return nil
}

// parseSince reads an RFC 3339 time or a duration before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("want an RFC 3339 time or a duration, got %q", s)
	}
	return t, nil
}

func ms(v uint64) string { return time.UnixMilli(int64(v)).UTC().Format(time.RFC3339) }

func printAudit(w io.Writer, a *verify.Audit) {
	section := func(title string, n int, header string, rows func(tw io.Writer)) {
		fmt.Fprintf(w, "%s (%d)\n", title, n)
		if n > 0 {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "  "+header)
			rows(tw)
			_ = tw.Flush()
		}
		fmt.Fprintln(w)
	}
	section("Runtime retries: same execution, next attempt", len(a.RuntimeRetries), "KEY\tTOOL\tEXECUTION\tATTEMPTS\tBETWEEN", func(tw io.Writer) {
		for _, r := range a.RuntimeRetries {
			att := make([]string, len(r.Attempts))
			for i, n := range r.Attempts {
				att[i] = fmt.Sprint(n)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", cell(r.Key), cell(r.Tool), cell(r.ExecutionID), strings.Join(att, "→"), strings.Join(r.ErrorCodes, ", "))
		}
	})
	section("Re-invocations: a new execution of the same call", len(a.ReInvocations), "SEQ\tKEY\tTOOL\tEXECUTION\tFIRST EXECUTION\tOUTCOME", func(tw io.Writer) {
		for _, r := range a.ReInvocations {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\n", r.Seq, cell(r.Key), cell(r.Tool), cell(r.ExecutionID), cell(r.FirstExecutionID), r.Outcome)
		}
	})
	section("Duplicate effects: distinct keys, same tool and input, all succeeded", len(a.DuplicateEffects), "TOOL\tINPUT\tKEYS", func(tw io.Writer) {
		for _, d := range a.DuplicateEffects {
			keys := make([]string, len(d.Keys))
			for i, k := range d.Keys {
				keys[i] = cell(k)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", cell(d.Tool), cell(d.InputHash), strings.Join(keys, ", "))
		}
	})
	section("Interrupted: lease ended without an outcome", len(a.Interrupted), "KEY\tTOOL\tEXECUTION\tATTEMPT\tLEASE ENDED\tNEXT STEP", func(tw io.Writer) {
		for _, k := range a.Interrupted {
			next := "next reserve takes over (idempotent)"
			if k.AwaitingPerson {
				next = "a person must resolve it"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\n", cell(k.Key), cell(k.Tool), cell(k.ExecutionID), k.Attempt, ms(k.LeaseExpiresAt), next)
		}
	})
	section("Failed", len(a.Failed), "SEQ\tKEY\tTOOL\tERROR\tRETRYABLE", func(tw io.Writer) {
		for _, f := range a.Failed {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%t\n", f.Seq, cell(f.Key), cell(f.Tool), cell(f.ErrorCode), f.Retryable)
		}
	})
	section("Resolutions by operators", len(a.Resolutions), "SEQ\tKEY\tOUTCOME\tACTOR\tAT\tNOTE", func(tw io.Writer) {
		for _, r := range a.Resolutions {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\n", r.Seq, cell(r.Key), r.Outcome, cell(r.Actor), ms(r.RecordedAt), cell(r.Note))
		}
	})
}
