package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/verify"
)

// AuditCommand runs `ledgerctl audit`.
type AuditCommand struct {
	*Env
}

const auditExamples = `  ledgerctl audit --db ledger.db
  ledgerctl audit --server http://127.0.0.1:8080 --since 24h --tool payments.refund
  ledgerctl audit --db ledger.db --since 2026-11-01T00:00:00Z --json
  ledgerctl audit --db ledger.db --since 1043     # what happened after head 1042
`

const auditSummary = `Usage: ledgerctl audit (--db FILE|URL | --server URL) [flags]

Tells runtime retries (same execution, next attempt) from re-invocations (a new
execution of the same call) and lists what needs attention: duplicate effects
(distinct keys, same tool and input, all succeeded), repeated failures (a call
that failed or applied nothing, run again unchanged), interrupted and failed keys,
operator resolutions, renewed keys and not-applied reruns (effects run again
after an outcome that claimed to apply nothing). Exit 1 if the chain itself has violations (run verify).

--since and --tool apply to every list. An entry is in the --since window when
its event is: a runtime retry's reserve, a re-invocation's receipt, a resolution;
an interrupted key's latest reserve, a failed key's failure; a duplicate effect's
latest success, a repeated failure's latest repeat (such an entry still lists
all its keys, older ones too). --tool keeps the keys of that tool.`

// Run prints the audit: runtime retries, re-invocations, duplicate
// effects, repeated failures, interrupted and failed keys, and operator
// resolutions.
func (c *AuditCommand) Run(ctx context.Context, args []string) error {
	fs, src := readFlags("audit")
	since := fs.String("since", "", "only events since `WHEN`: an RFC 3339 time (at or after it), a duration ago such as 24h, or a receipt seq such as 1043 (that receipt and later ones)")
	tool := fs.String("tool", "", "only keys of this `tool`")
	pos, err := parse(fs, c.Env, args, auditSummary, auditExamples)
	if err != nil {
		return err
	}
	filter := verify.AuditFilter{Tool: *tool}
	if *since != "" {
		if err := api.ParseSince(*since, time.Now(), &filter); err != nil {
			return usageErr(fs, c.Env, "--since: %v", err)
		}
	}
	st, err := src.openNoArgs(ctx, fs, c.Env, pos)
	if err != nil {
		return err
	}
	defer st.Close()
	rep, err := checkWith(ctx, st, verify.Opts{Filter: filter})
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
		fmt.Fprintf(c.Stderr, "ledgerctl audit: the chain has %s; run ledgerctl verify\n", plural(rep.ViolationsTotal, "violation", "violations"))
		return &ViolationsError{Count: rep.ViolationsTotal}
	}
	return nil
}

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
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", keyCell(r.Key), cell(r.Tool), cell(r.ExecutionID), strings.Join(att, "→"), strings.Join(r.ErrorCodes, ", "))
		}
	})
	section("Re-invocations: a new execution of the same call", len(a.ReInvocations), "SEQ\tKEY\tTOOL\tEXECUTION\tFIRST EXECUTION\tOUTCOME", func(tw io.Writer) {
		for _, r := range a.ReInvocations {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\n", r.Seq, keyCell(r.Key), cell(r.Tool), cell(r.ExecutionID), cell(r.FirstExecutionID), r.Outcome)
		}
	})
	section("Duplicate effects: distinct keys, same tool and input, all succeeded", len(a.DuplicateEffects), "TOOL\tINPUT\tKEYS", func(tw io.Writer) {
		for _, d := range a.DuplicateEffects {
			keys := make([]string, len(d.Keys))
			for i, k := range d.Keys {
				keys[i] = keyCell(k)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", cell(d.Tool), cell(d.InputHash), strings.Join(keys, ", "))
		}
	})
	section("Repeated failures: a failed call run again unchanged under new keys", len(a.RepeatedFailures), "TOOL\tINPUT\tFIRST ERROR\tFAILED KEY → LATER KEYS\tEXECUTIONS", func(tw io.Writer) {
		for _, r := range a.RepeatedFailures {
			keys := make([]string, len(r.Keys))
			for i, k := range r.Keys {
				keys[i] = keyCell(k)
			}
			execs := make([]string, len(r.Executions))
			for i, e := range r.Executions {
				execs[i] = cell(e)
			}
			later := strings.Join(keys[1:], ", ")
			if later == "" {
				later = "(the same key again)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s → %s\t%s\n", cell(r.Tool), cell(r.InputHash), cell(r.ErrorCode),
				keys[0], later, strings.Join(execs, ", "))
		}
	})
	section("Interrupted: lease ended without an outcome", len(a.Interrupted), "KEY\tTOOL\tEXECUTION\tATTEMPT\tLEASE ENDED\tNEXT STEP", func(tw io.Writer) {
		for _, k := range a.Interrupted {
			next := "next reserve takes over (idempotent)"
			if k.AwaitingPerson {
				next = "a person must resolve it"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\n", keyCell(k.Key), cell(k.Tool), cell(k.ExecutionID), k.Attempt, ms(k.LeaseExpiresAt), next)
		}
	})
	section("Failed", len(a.Failed), "SEQ\tKEY\tTOOL\tERROR\tRETRYABLE", func(tw io.Writer) {
		for _, f := range a.Failed {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%t\n", f.Seq, keyCell(f.Key), cell(f.Tool), cell(f.ErrorCode), f.Retryable)
		}
	})
	section("Resolutions by operators", len(a.Resolutions), "SEQ\tKEY\tOUTCOME\tACTOR\tAT\tNOTE", func(tw io.Writer) {
		for _, r := range a.Resolutions {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\n", r.Seq, keyCell(r.Key), r.Outcome, cell(r.Actor), ms(r.RecordedAt), cell(erasedOr(r.Note, r.Erased, "note")))
		}
	})
	section("Reconciliations: interrupted keys ended from a downstream's answer", len(a.Reconciliations), "SEQ\tKEY\tTOOL\tOUTCOME\tLOOKUP\tACTOR\tAT", func(tw io.Writer) {
		for _, r := range a.Reconciliations {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Seq, keyCell(r.Key), cell(r.Tool), r.Outcome, cell(erasedOr(r.Lookup, r.Erased, "lookup")), cell(r.Actor), ms(r.RecordedAt))
		}
	})
	section("Reconcile contradicted: the original call landed with another outcome (a person should look)", len(a.ReconcileContradicted), "COMMIT\tKEY\tTOOL\tRECONCILED\tAS\tCOMMITTED\tEXTERNAL REF", func(tw io.Writer) {
		for _, r := range a.ReconcileContradicted {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%d\t%s\t%s\t%s\n", r.CommitSeq, keyCell(r.Key), cell(r.Tool), r.ReconcileSeq,
				cell(r.ReconciledOutcome+" "+erasedOr(r.ReconciledExternalRef, r.Erased, "reconciled_external_ref")), r.Outcome,
				cell(erasedOr(r.ExternalRef, r.Erased, "external_ref")))
		}
	})
	section("Erasures: payloads erased (docs/privacy.md)", len(a.Erasures), "SEQ\tACTOR\tAT\tRECEIPTS\tFIELDS\tRETENTION\tREASON", func(tw io.Writer) {
		for _, e := range a.Erasures {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%d\t%s\t%t\t%s\n", e.Seq, cell(e.Actor), ms(e.RecordedAt), e.Count,
				strings.Join(e.Fields, ","), e.Retention, cell(e.Reason))
		}
	})
	section("Pruned ranges: receipt bodies archived and pruned (docs/operations.md)", len(a.PrunedRanges), "SEQ\tACTOR\tAT\tFROM\tTHROUGH\tDIGEST", func(tw io.Writer) {
		for _, p := range a.PrunedRanges {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%d\t%d\t%s\n", p.Seq, cell(p.Actor), ms(p.RecordedAt), p.From, p.Through, cell(p.Digest))
		}
	})
	section("Renewed keys: a new generation after the key's lifetime", len(a.RenewedKeys), "SEQ\tKEY\tTOOL\tEXECUTION\tAT\tPREVIOUS OUTCOME\tPREVIOUS SEQ", func(tw io.Writer) {
		for _, r := range a.RenewedKeys {
			// A server before contract v1.3 sends no previous_outcome: "-".
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%d\n", r.Seq, keyCell(r.Key), cell(r.Tool), cell(r.ExecutionID), ms(r.RecordedAt),
				cell(r.PreviousOutcome), r.PreviousFinalSeq)
		}
	})
	section("Not-applied reruns: run again after an outcome that claimed to apply nothing", len(a.NotAppliedReruns), "SEQ\tKEY\tTOOL\tEXECUTION\tAT\tNOT_APPLIED SEQ\tCODE", func(tw io.Writer) {
		for _, r := range a.NotAppliedReruns {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%d\t%s\n", r.Seq, keyCell(r.Key), cell(r.Tool), cell(r.ExecutionID), ms(r.RecordedAt),
				r.NotAppliedSeq, cell(r.ErrorCode))
		}
	})
	section("Approvals: each ask, its answer and the reserve that consumed it", len(a.Approvals), "ASK\tKEY\tTOOL\tASKED BY\tSTATE\tANSWER\tAPPROVER\tNOTE\tCONSUMED BY", func(tw io.Writer) {
		for _, r := range a.Approvals {
			answer, approver, note, consumer := "-", "-", "", "-"
			if r.Answer != nil {
				answer, approver, note = fmt.Sprintf("%d %s", r.Answer.Seq, r.Answer.Decision), cell(r.Answer.Actor+" ("+r.Answer.Role+")"),
					erasedOr(r.Answer.Note, r.Answer.Erased, "note")
			}
			if r.ConsumedBy != nil {
				consumer = fmt.Sprintf("%d %s", r.ConsumedBy.Seq, r.ConsumedBy.ExecutionID)
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.AskSeq, keyCell(r.Key), cell(r.Tool), cell(r.Actor), r.State,
				answer, approver, cell(note), cell(consumer))
		}
	})
	section("Denied by policy: effects the policy refused", len(a.Denied), "SEQ\tKEY\tTOOL\tEXECUTION\tACTOR\tAT", func(tw io.Writer) {
		for _, r := range a.Denied {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\n", r.Seq, keyCell(r.Key), cell(r.Tool), cell(r.ExecutionID), cell(r.Actor), ms(r.RecordedAt))
		}
	})
	section("Unauthenticated approvals: answers recorded without a token", len(a.UnauthenticatedApprovals), "SEQ\tASK\tKEY\tTOOL\tOUTCOME\tAT", func(tw io.Writer) {
		for _, r := range a.UnauthenticatedApprovals {
			fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\t%s\t%s\n", r.Seq, r.AskSeq, keyCell(r.Key), cell(r.Tool), r.Outcome, ms(r.RecordedAt))
		}
	})
}

// erasedOr is the cell of an audit member whose value may have been
// erased (SPEC §14): the value, or which erase receipt took it.
func erasedOr(value string, erased verify.Erased, member string) string {
	if by := erased[member]; by > 0 {
		return fmt.Sprintf("(erased by %d)", by)
	}
	return value
}
