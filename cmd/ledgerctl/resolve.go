package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// ResolveCommand runs `ledgerctl resolve`.
type ResolveCommand struct{ *Env }

// resolveFlags maps the API's field names to the flags that set them, so
// that messages name what the operator typed.
var resolveFlags = map[string]string{
	"outcome":       "--outcome",
	"external_ref":  "--ref",
	"result":        "--result",
	"error":         "--error-code",
	"error.code":    "--error-code",
	"error.message": "--error-message",
	"note":          "--note",
}

// Run records an operator's decision about an interrupted key.
func (c *ResolveCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("resolve", flag.ContinueOnError)
	var src sourceFlags
	src.registerServer(fs)
	src.registerNamespace(fs)
	src.registerJSON(fs)
	var body client.Resolution
	var fail client.Failure
	fs.StringVar(&body.Outcome, "outcome", "", "what happened: `succeeded|failed|not_applied` (required)")
	fs.StringVar(&body.ExternalRef, "ref", "", "downstream `reference` (charge id, message id, …)")
	result := fs.String("result", "", "recorded result as `JSON`")
	fs.StringVar(&fail.Code, "error-code", "", "with --outcome failed or not_applied (required there): error `CODE` (A-Z, 0-9, _)")
	fs.StringVar(&fail.Message, "error-message", "", "with --outcome failed or not_applied: error `message`")
	fs.BoolVar(&fail.Retryable, "retryable", false, "with --outcome failed: the error is transient (an idempotent key may then be retried)")
	fs.StringVar(&body.Note, "note", "", "why: what the operator checked, as `text` (required)")
	setUsage(fs, c.Env, "Usage: ledgerctl resolve --server URL KEY --outcome succeeded|failed|not_applied --note TEXT [flags]\n\nRecords what really happened to an interrupted effect (a reservation whose\nlease ended without a commit). --outcome not_applied says nothing happened:\nthe key may then be reserved again; it also corrects a failed key whose\nfailure applied nothing. Server only: a resolve appends a receipt, and\nonly ledgerd writes the ledger. Needs an admin token when tokens exist.",
		"  ledgerctl resolve --server http://127.0.0.1:8080 charge-77 --outcome succeeded --ref ch_3Pq9 --note \"charge found in the PSP dashboard\"\n  ledgerctl resolve --server http://127.0.0.1:8080 charge-78 --outcome failed --error-code NOT_CHARGED --note \"no charge at the PSP\"\n  ledgerctl resolve --server http://127.0.0.1:8080 mail-79 --outcome not_applied --error-code NOT_SENT --note \"nothing in the outbox\"\n")
	for _, a := range args {
		if a == "--db" || a == "-db" || strings.HasPrefix(a, "--db=") || strings.HasPrefix(a, "-db=") {
			return usageErr(fs, c.Env, "resolve appends a receipt, which only ledgerd does: give --server URL, not --db")
		}
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr(fs, c.Env, "want exactly one KEY")
	}
	key := pos[0]
	if err := src.check(); err != nil {
		return usageErr(fs, c.Env, "%v", err)
	}
	if err := checkResolve(&body, &fail, *result); err != nil {
		return usageErr(fs, c.Env, "%v", err)
	}
	if body.Outcome == "failed" || body.Outcome == "not_applied" {
		body.Failure = &fail
	}
	srv, err := src.client(fs, c.Env)
	if err != nil {
		return err
	}
	res, err := srv.resolve(ctx, key, body)
	var le *ledger.Error
	if errors.As(err, &le) && le.Code == ledger.ECodeInvalidRequest {
		if f, ok := le.Details["field"].(string); ok && resolveFlags[f] != "" {
			return fmt.Errorf("%s: %w", resolveFlags[f], err)
		}
	}
	if err != nil {
		return err
	}
	if src.json {
		return writeJSON(c.Stdout, map[string]any{"status": "resolved", "idempotency_key": res.IdempotencyKey,
			"state": res.State, "receipt": map[string]any{"seq": res.Receipt.Seq, "hash": res.Receipt.Hash.String()}})
	}
	_, err = fmt.Fprintf(c.Stdout, "resolved %s: now %s (receipt %d:%s)\n", res.IdempotencyKey, res.State, res.Receipt.Seq, res.Receipt.Hash)
	return err
}

// checkResolve checks the flags as the server would, naming the flags.
func checkResolve(body *client.Resolution, fail *client.Failure, result string) error {
	switch body.Outcome {
	case "succeeded":
		if fail.Code != "" || fail.Message != "" || fail.Retryable {
			return errors.New("--error-code, --error-message and --retryable go with --outcome failed or not_applied only")
		}
	case "failed", "not_applied":
		if fail.Code == "" {
			return fmt.Errorf("--outcome %s needs --error-code CODE", body.Outcome)
		}
		if body.Outcome == "not_applied" && (fail.Retryable || body.ExternalRef != "") {
			return errors.New("--outcome not_applied takes neither --retryable nor --ref: nothing was applied")
		}
		if !ledger.ValidErrorCode(fail.Code) {
			return fmt.Errorf("--error-code must be 1–%d characters of A-Z, 0-9 and _, got %q", ledger.MaxErrorCodeLen, fail.Code)
		}
		if utf8.RuneCountInString(fail.Message) > ledger.MaxErrorMessageLen {
			return fmt.Errorf("--error-message must be at most %d characters", ledger.MaxErrorMessageLen)
		}
	case "":
		return errors.New("--outcome is required: succeeded, failed or not_applied")
	default:
		return fmt.Errorf("--outcome must be succeeded, failed or not_applied, got %q", body.Outcome)
	}
	if n := utf8.RuneCountInString(body.Note); n == 0 {
		return errors.New("--note is required: say what you checked")
	} else if n > ledger.MaxNoteLen {
		return fmt.Errorf("--note must be at most %d characters", ledger.MaxNoteLen)
	}
	if utf8.RuneCountInString(body.ExternalRef) > ledger.MaxExternalRefLen {
		return fmt.Errorf("--ref must be at most %d characters", ledger.MaxExternalRefLen)
	}
	if result != "" {
		var buf bytes.Buffer
		if err := json.Compact(&buf, []byte(result)); err != nil {
			return fmt.Errorf("--result is not valid JSON: %v", err)
		}
		if buf.Len() > ledger.MaxResultLen {
			return fmt.Errorf("--result must be at most %d bytes as compact JSON", ledger.MaxResultLen)
		}
		body.Result = json.RawMessage(buf.Bytes())
	}
	return nil
}
