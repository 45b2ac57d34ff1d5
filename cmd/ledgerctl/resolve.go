package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"

	"github.com/effect-ledger/effect-ledger/api"
)

// ResolveCommand runs `ledgerctl resolve`.
type ResolveCommand struct{ *Env }

// Run records an operator's decision about an interrupted key.
func (c *ResolveCommand) Run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("resolve", flag.ContinueOnError)
	var src sourceFlags
	src.register(fs)
	var body api.ResolveBody
	var fail api.FailureBody
	fs.StringVar(&body.Outcome, "outcome", "", "what happened: succeeded or failed (required)")
	fs.StringVar(&body.ExternalRef, "ref", "", "downstream `reference` (charge id, message id, …)")
	result := fs.String("result", "", "recorded result as `JSON`")
	fs.StringVar(&fail.Code, "error-code", "", "failed: error `CODE` (A-Z, 0-9, _)")
	fs.StringVar(&fail.Message, "error-message", "", "failed: error `message`")
	fs.BoolVar(&fail.Retryable, "retryable", false, "failed: the error is transient (an idempotent key may then be retried)")
	fs.StringVar(&body.Note, "note", "", "why: what the operator checked (required)")
	pos, err := parse(fs, c.Env, args, "Usage: ledgerctl resolve --server URL KEY --outcome succeeded|failed --note TEXT [flags]\n\nRecords what really happened to an interrupted effect (a reservation whose\nlease ended without a commit). Server only: a resolve appends a receipt.",
		"  ledgerctl resolve --server http://127.0.0.1:8080 charge-77 --outcome succeeded --ref ch_3Pq9 --note \"charge found in the PSP dashboard\"\n  ledgerctl resolve --server http://127.0.0.1:8080 charge-78 --outcome failed --error-code NOT_CHARGED --note \"no charge at the PSP\"\n")
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr(fs, c.Env, "want exactly one KEY")
	}
	key := pos[0]
	if src.db != "" {
		return usageErr(fs, c.Env, "resolve appends a receipt: use --server, not --db")
	}
	if body.Outcome != "succeeded" && body.Outcome != "failed" {
		return usageErr(fs, c.Env, "--outcome must be succeeded or failed")
	}
	if body.Note == "" {
		return usageErr(fs, c.Env, "--note is required: say what you checked")
	}
	if *result != "" {
		if !json.Valid([]byte(*result)) {
			return usageErr(fs, c.Env, "--result is not valid JSON")
		}
		body.Result = json.RawMessage(*result)
	}
	if fail.Code != "" || fail.Message != "" || fail.Retryable {
		body.Error = &fail
	}
	st, err := src.open(ctx, fs, c.Env)
	if err != nil {
		return err
	}
	client := st.(serverStore).Client
	res, err := client.Resolve(ctx, key, body)
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
