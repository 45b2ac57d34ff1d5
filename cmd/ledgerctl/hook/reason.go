package hook

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effect-ledger/effect-ledger/client"
)

// This file words the denies: each says what the ledger decided, that
// the call did not run, and what the model (or the person reading along)
// can do next.

const prefix = "effect-ledger: "

// approvalReason is the deny of a call sent to a person.
func (h *Hook) approvalReason(are *client.ApprovalRequiredError) string {
	s := prefix + fmt.Sprintf("this call needs a person's approval, so it was not run. The ledger recorded ask %d", are.Seq)
	if !are.ExpiresAt.IsZero() {
		s += " (it expires " + are.ExpiresAt.UTC().Format(time.RFC3339) + ")"
	}
	s += fmt.Sprintf(". A person approves or rejects it at %s or with: ledgerctl approvals approve %d --server %s",
		client.ApprovalPageURL(h.Client.BaseURL(), are.Seq), are.Seq, h.Client.BaseURL())
	if ns := h.Client.Namespace(); ns != "default" {
		s += " -n " + ns
	}
	return s + ". Once it is approved, make the identical call again: it will then run once. Tell the user it awaits their approval."
}

// refusals word each refusal of the ledger's; the ledger's own message
// follows.
var refusals = map[string]string{
	"denied_by_policy":     "the ledger's policy denies this call",
	"approval_rejected":    "a person rejected this call",
	"unchanged_retry":      "the same call failed recently and this retry changes nothing",
	"in_progress":          "the same call is running now; its outcome is recorded when it ends",
	"unsafe_resume":        "an earlier run of this call was interrupted without a recorded outcome, and a person must check what it did (ledgerctl resolve) before it may run again",
	"retry_not_allowed":    "this call failed before and its failure may not be retried",
	"fingerprint_mismatch": "this call's key was recorded for a different call",
	"attempt_conflict":     "a later attempt of this call is already recorded",
	"approval_expired":     "the approval this call waited for expired",
}

// refused is the deny for a reserve the ledger refused or could not
// answer.
func (h *Hook) refused(key string, err error) *Answer {
	var e *client.Error
	if !errors.As(err, &e) || e.Status >= 500 {
		return h.unavailable(err)
	}
	what, ok := refusals[e.Code]
	if !ok {
		what = "the ledger refused this call"
	}
	if key != "" {
		key = "; key " + key
	}
	return Deny(fmt.Sprintf("%s%s (%s: %s%s). It was not run.", prefix, what, e.Code, e.Message, key))
}

// unavailable is the deny when the ledger cannot be reached or fails:
// an effect never runs unrecorded, unless the hook was told to fail open.
func (h *Hook) unavailable(err error) *Answer {
	if h.FailOpen {
		h.Logger.Warn("hook: the ledger is unavailable; the call runs unrecorded (--fail-open)", "err", err)
		return nil
	}
	return Deny(fmt.Sprintf("%sledger_unavailable: the ledger could not record this call (%v), so it was not run: an effect never runs unrecorded. Try again once the ledger is back, or tell the user.", prefix, err))
}

// stateFailed is the deny when the hook cannot keep its own state.
func stateFailed(err error) *Answer {
	return Deny(fmt.Sprintf("%sthe hook could not keep its state (%v), so this call was not run.", prefix, err))
}

// maxShown is how much of a recorded result a replay's deny quotes.
const maxShown = 2000

// replayReason is the deny of a call that already ran: when, its receipt,
// and the recorded outcome.
func (h *Hook) replayReason(ctx context.Context, rsv *client.Reservation) string {
	when := ""
	if v, err := h.Client.Key(ctx, rsv.Key, false); err == nil {
		for _, r := range v.Receipts {
			if r.Seq == rsv.Original.Seq && r.RecordedAt > 0 {
				when = " at " + time.UnixMilli(r.RecordedAt).UTC().Format(time.RFC3339)
			}
		}
	}
	s := fmt.Sprintf("%sthis exact call already ran%s (receipt %d, key %s) and was not run again. Its recorded outcome: %s",
		prefix, when, rsv.Original.Seq, rsv.Key, rsv.Outcome)
	if len(rsv.Result) > 0 {
		s += ", result " + truncate(string(rsv.Result), maxShown)
	}
	return s + ". Use that outcome instead of running it again."
}
