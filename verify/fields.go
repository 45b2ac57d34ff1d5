package verify

import (
	"strings"
	"unicode/utf8"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// checkFields reports (rule invalid_field) every value of r that no ledger
// writes: values the receipt format cannot carry (r.Malformed), malformed
// keys, identifiers and error codes, values out of range, unknown kinds,
// effects and outcomes, and fields set on a kind that never carries them
// (SPEC §1–§4). Each problem is one violation; the checks go on.
func checkFields(col *collector, r *chain.Receipt) {
	bad := func(format string, args ...any) { col.addf(r.Seq, RuleInvalidField, format, args...) }
	for _, m := range r.Malformed {
		switch m.Field {
		case "prev_hash", "hash":
			bad("%s holds %s, which is not %s", m.Field, m.Value, fieldType(m.Field))
		default:
			bad("%s holds %s, which is not %s: the receipt has no canonical body and cannot be hashed",
				m.Field, m.Value, fieldType(m.Field))
		}
	}

	if !chain.KnownKind(r.Kind) {
		col.addf(r.Seq, RuleUnsupported, "kind %q is not one this verifier knows (%s): a newer ledger wrote it, or the receipt was altered; a newer ledgerctl may check it", truncate(r.Kind), chain.KindList())
		return // which fields belong is unknown
	}
	switch r.Kind {
	case chain.KindPolicy:
		checkPolicyFields(bad, r)
	case chain.KindErase:
		checkEraseFields(bad, r)
	case chain.KindKey:
		checkKeyReceiptFields(bad, r)
	case chain.KindPrune:
		checkPruneFields(bad, r)
	default:
		checkKeyFields(bad, r)
	}
	if r.RefSeq >= r.Seq && r.RefSeq != 0 {
		bad("ref_seq %d does not name an earlier receipt", r.RefSeq)
	}
	checkKindFields(bad, r)
	if (r.Kind == chain.KindCommit || r.Kind == chain.KindResolve || r.Kind == chain.KindReconcile) && r.Outcome == chain.OutcomeNotApplied && r.ExternalRef != "" {
		col.addf(r.Seq, RuleNotAppliedWithRef, "not_applied %s with external_ref %q: an effect that applied nothing has no downstream reference",
			r.Kind, truncate(r.ExternalRef))
	}
}

// checkKeyFields checks the fields of a receipt that names a key: the
// key, execution, attempt, tool, effect and input_hash (SPEC §1–§4). An
// approval carries no execution and attempt (SPEC §2.1).
func checkKeyFields(bad func(string, ...any), r *chain.Receipt) {
	if r.KeyGenerated {
		if !generatedKey(r.IdempotencyKey) {
			bad("generated idempotency_key %q is not %s followed by at least %d characters of A-Z a-z 0-9 _ -",
				truncate(r.IdempotencyKey), ledger.GeneratedKeyPrefix, minGeneratedRandom)
		}
	} else if len(r.IdempotencyKey) < ledger.MinKeyLen || len(r.IdempotencyKey) > ledger.MaxKeyLen || !visibleASCII(r.IdempotencyKey) {
		bad("idempotency_key %q is not %d–%d bytes of visible ASCII (shorter keys are generated)",
			truncate(r.IdempotencyKey), ledger.MinKeyLen, ledger.MaxKeyLen)
		// A supplied key starting with gen_ is refused since contract
		// v1.1, but v1 ledgers recorded such keys legitimately: not a
		// violation.
	}
	ids := []struct{ name, v string }{{"execution_id", r.ExecutionID}, {"tool", r.Tool}}
	if r.Kind == chain.KindApproval {
		ids = ids[1:]
		notOn(bad, r.Kind, "execution_id", r.ExecutionID)
		if r.Attempt != 0 {
			bad("approval with attempt %d (an approval carries none)", r.Attempt)
		}
	} else if (r.Attempt == 0 || r.Attempt > ledger.MaxAttempt) && !r.IsMalformed("attempt") {
		bad("attempt %d is not from 1 to %d", r.Attempt, uint64(ledger.MaxAttempt))
	}
	for _, f := range ids {
		if f.v == "" || len(f.v) > ledger.MaxIDLen || !visibleASCII(f.v) {
			bad("%s %q is not 1–%d bytes of visible ASCII", f.name, truncate(f.v), ledger.MaxIDLen)
		}
	}
	switch r.Effect {
	case chain.EffectWrite, chain.EffectDestructive, chain.EffectExternal:
	default:
		bad("effect %q is not write, destructive or external", truncate(r.Effect))
	}
	if len(r.InputHash) > ledger.MaxInputHashLen || !visibleASCII(r.InputHash) {
		bad("input_hash %q is not at most %d bytes of visible ASCII", truncate(r.InputHash), ledger.MaxInputHashLen)
	}
}

// checkKindFields reports the fields r's kind never carries or carries
// with a value no ledger writes (SPEC §2).
func checkKindFields(bad func(string, ...any), r *chain.Receipt) {
	switch r.Kind {
	case chain.KindReserve, chain.KindReplay:
		notOn(bad, r.Kind, "outcome", r.Outcome)
		notOn(bad, r.Kind, "external_ref", r.ExternalRef)
		notOn(bad, r.Kind, "result", r.Result)
		noFailure(bad, r.Kind, r)
	case chain.KindCommit, chain.KindResolve, chain.KindReconcile:
		checkText(bad, "external_ref", r.ExternalRef, ledger.MaxExternalRefLen)
		checkResult(bad, r.Result)
		switch r.Outcome {
		case chain.OutcomeFailed, chain.OutcomeNotApplied:
			if !ledger.ValidErrorCode(r.ErrorCode) {
				bad("%s %s with error_code %q, not 1–%d characters of A-Z 0-9 _", r.Outcome, r.Kind, truncate(r.ErrorCode), ledger.MaxErrorCodeLen)
			}
			checkText(bad, "error_message", r.ErrorMessage, ledger.MaxErrorMessageLen)
			if r.Outcome == chain.OutcomeNotApplied && r.Retryable {
				bad("not_applied %s marked retryable (the ledger stores false)", r.Kind)
			}
		case chain.OutcomeSucceeded:
			noFailure(bad, "successful "+r.Kind, r)
		default: // which error fields belong is unknown
			bad("%s with outcome %q, not succeeded, failed or not_applied", r.Kind, truncate(r.Outcome))
		}
	case chain.KindPolicy, chain.KindErase, chain.KindKey, chain.KindPrune:
		return // checkPolicyFields, checkEraseFields, checkKeyReceiptFields or checkPruneFields checked every field
	case chain.KindAsk:
		checkAskFields(bad, r)
	case chain.KindApproval:
		checkApprovalFields(bad, r)
	case chain.KindDeny:
		notOn(bad, r.Kind, "outcome", r.Outcome)
		notOn(bad, r.Kind, "external_ref", r.ExternalRef)
		notOn(bad, r.Kind, "result", r.Result)
		noFailure(bad, r.Kind, r)
	}
	checkLease(bad, r)
	checkNote(bad, r)
}

// checkLease checks lease_expires_at: a reserve's lease, an ask's expiry
// (after its recorded_at), and nothing on the other kinds.
func checkLease(bad func(string, ...any), r *chain.Receipt) {
	if r.IsMalformed("lease_expires_at") || r.IsMalformed("recorded_at") {
		return
	}
	switch r.Kind {
	case chain.KindReserve:
		lease := r.LeaseExpiresAt - r.RecordedAt
		if r.LeaseExpiresAt < r.RecordedAt || lease < ledger.MinLeaseMS || lease > ledger.MaxLeaseMS {
			bad("reserve with lease_expires_at %d, not %d–%d ms after recorded_at %d",
				r.LeaseExpiresAt, ledger.MinLeaseMS, ledger.MaxLeaseMS, r.RecordedAt)
		}
	case chain.KindAsk:
		if r.LeaseExpiresAt <= r.RecordedAt {
			bad("ask expiring at %d (lease_expires_at), not after its recorded_at %d", r.LeaseExpiresAt, r.RecordedAt)
		}
	default:
		if r.LeaseExpiresAt != 0 {
			bad("%s with lease_expires_at %d", r.Kind, r.LeaseExpiresAt)
		}
	}
}

// checkNote checks note: a resolve's required note, an approval's
// optional one, a reserve's changed object (SPEC §13), and nothing on the
// other kinds.
func checkNote(bad func(string, ...any), r *chain.Receipt) {
	switch r.Kind {
	case chain.KindResolve:
		if r.Note == "" {
			bad("resolve without a note")
		}
		checkText(bad, "note", r.Note, ledger.MaxNoteLen)
	case chain.KindApproval:
		checkText(bad, "note", r.Note, ledger.MaxNoteLen)
	case chain.KindReserve:
		checkChanged(bad, r.Note)
	case chain.KindReconcile:
		if !chain.IsCommitment(r.Note) { // else its value is not there to check: erased, or not read (SPEC §14)
			checkEvidence(bad, r.Note)
		}
	default:
		notOn(bad, r.Kind, "note", r.Note)
	}
}

// fieldType names what a field must hold, for malformed values.
func fieldType(field string) string {
	switch field {
	case "key_generated", "idempotent", "retryable":
		return "0 or 1"
	case "prev_hash", "hash":
		return "32 bytes"
	case "seq", "attempt", "lease_expires_at", "ref_seq", "recorded_at":
		return "an unsigned integer"
	default:
		return "text"
	}
}

// noFailure checks that r, which did not fail, carries no error fields.
func noFailure(bad func(string, ...any), what string, r *chain.Receipt) {
	notOn(bad, what, "error_code", r.ErrorCode)
	notOn(bad, what, "error_message", r.ErrorMessage)
	if r.Retryable {
		bad("%s marked retryable", what)
	}
}

func notOn(bad func(string, ...any), what, field, v string) {
	if v != "" {
		bad("%s with %s %q", what, field, truncate(v))
	}
}

// checkText checks a free-text field: UTF-8, at most max characters.
func checkText(bad func(string, ...any), field, v string, max int) {
	if !utf8.ValidString(v) || utf8.RuneCountInString(v) > max {
		bad("%s %q is not UTF-8 of at most %d characters", field, truncate(v), max)
	}
}

// checkResult checks a stored result: empty, or compact JSON of at most
// ledger.MaxResultLen bytes, never the literal null (stored as empty).
func checkResult(bad func(string, ...any), v string) {
	switch {
	case v == "":
	case v == "null":
		bad("result is the text null; the ledger stores a null result as the empty string")
	case !chain.IsCompactJSON(v):
		bad("result %q is not compact JSON in UTF-8 (the ledger stores results compacted)", truncate(v))
	case len(v) > ledger.MaxResultLen:
		bad("result of %d bytes is over %d", len(v), ledger.MaxResultLen)
	}
}

// visibleASCII reports whether s is made of bytes 0x21–0x7E only.
func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7E {
			return false
		}
	}
	return true
}

// minGeneratedRandom is the shortest random part of a generated key:
// 128 bits in base64 (the ledger writes 26 base32 characters).
const minGeneratedRandom = 22

func generatedKey(k string) bool {
	rest, ok := strings.CutPrefix(k, ledger.GeneratedKeyPrefix)
	if !ok || len(rest) < minGeneratedRandom || len(k) > ledger.MaxKeyLen {
		return false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// truncate shortens a value quoted in a detail.
func truncate(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}
