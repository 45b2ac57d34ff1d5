package verify

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Rules a violation can name (SPEC §5). RuleDerivedState is reported when a
// derived table disagrees with the receipts; RuleInvalidField when a field
// holds a value no ledger writes.
const (
	RuleGenesis              = "genesis"
	RuleSeqGap               = "seq_gap"
	RuleBrokenLink           = "broken_link"
	RuleHashMismatch         = "hash_mismatch"
	RuleCommitWithoutReserve = "commit_without_reserve"
	RuleDoubleFinalization   = "double_finalization"
	RuleReserveAfterSuccess  = "reserve_after_success"
	RuleRetryNotAllowed      = "retry_not_allowed"
	RuleReplayWithoutSuccess = "replay_without_success"
	RuleAttemptOrder         = "attempt_order"
	RuleFingerprintChanged   = "fingerprint_changed"
	RuleHeadMismatch         = "head_mismatch"
	RuleDerivedState         = "derived_state"
	RuleInvalidField         = "invalid_field"
	// RuleRecordedAtDecreased: a receipt's recorded_at is before its
	// predecessor's (contract v1.3): a ledger holds its time at the last
	// recorded one when its clock steps back.
	RuleRecordedAtDecreased = "recorded_at_decreased"
	// RuleNotAppliedWithRef: a commit or resolve with outcome not_applied
	// carries an external_ref (contract v1.3, SPEC §4.1): an effect that
	// applied nothing has no downstream reference.
	RuleNotAppliedWithRef = "not_applied_with_ref"

	// The gate's rules (contract v1.3, SPEC §13), each decided with the
	// policy in force at the receipt: the latest policy receipt before it.

	// RuleApprovalMissing: a reserve the policy gated names no approval
	// and is not by the execution that consumed one for its key's
	// generation.
	RuleApprovalMissing = "approval_missing"
	// RuleApprovalReused: two reserves name one approval.
	RuleApprovalReused = "approval_reused"
	// RuleApprovalMismatch: a reserve names a rejected approval, one
	// recorded at or after its ask's expiry (or is itself), one of another
	// key, fingerprint or actor, or one whose approver the rule in force
	// does not list.
	RuleApprovalMismatch = "approval_mismatch"
	// RuleSelfApproved: an approval by its ask's own actor while the
	// policy in force denies self-approval.
	RuleSelfApproved = "self_approved"
	// RuleDeniedEffectRun: a reserve the policy in force denies.
	RuleDeniedEffectRun = "denied_effect_run"
	// RuleUnchangedRetry: a reserve the repeat guard in force refuses.
	RuleUnchangedRetry = "unchanged_retry"
	// RulePolicyUnknown: a policy receipt whose text does not parse.
	RulePolicyUnknown = "policy_unknown"

	// The rules of committed payloads (contract v1.4, SPEC §14), checked
	// from the chain and the values kept beside it. Details name the seq
	// and the field, never a value.

	// RulePayloadMismatch: a kept value does not open its commitment.
	RulePayloadMismatch = "payload_mismatch"
	// RulePayloadMissing: a commitment without its value (and no erase
	// receipt lists it).
	RulePayloadMissing = "payload_missing"
	// RulePayloadUncommitted: in a committed namespace, a non-empty payload
	// field that is not a commitment, or an exempt one that is.
	RulePayloadUncommitted = "payload_uncommitted"
	// RulePayloadUnexpected: a value kept for a field whose chain text is
	// empty, exempt or inline.
	RulePayloadUnexpected = "payload_unexpected"
	// RuleEraseIncomplete: a value still kept for a seq and field an erase
	// receipt lists.
	RuleEraseIncomplete = "erase_incomplete"
	// RuleEraseInvalid: an erase receipt in an inline namespace, whose set
	// does not match its stored ranges, with a range not below its own
	// seq, a count that is not the ranges' size, or fields that are not
	// payload fields; a retention sweep without a retention in force, or
	// listing a receipt younger than it or of a key not final at the
	// sweep (retention.go).
	RuleEraseInvalid = "erase_invalid"
	// RulePayloadsAbsent: a committed namespace read without its payload
	// table (a copy of the receipts alone), unless Opts.ReceiptsOnly.
	RulePayloadsAbsent = "payloads_absent"

	// Reconciling an unknown outcome (contract v1.4, SPEC §15).

	// RuleReconcileInvalid: a reconcile of a key not interrupted at that
	// point of the chain, whose fields differ from its reserve's, or with
	// an outcome other than succeeded (with an external_ref) or
	// not_applied.
	RuleReconcileInvalid = "reconcile_invalid"
	// RuleReconcileNotAllowed: a reconcile the policy in force did not
	// allow for its tool, or whose actor is neither its reserve's actor
	// nor an admin the verifier knows.
	RuleReconcileNotAllowed = "reconcile_not_allowed"

	// RulePruneInvalid: a prune receipt (SPEC §16) whose result is not a
	// prune result, whose range is not below it, or does not follow the
	// range the earlier prune receipts pruned (the first from receipt 1).
	RulePruneInvalid = "prune_invalid"
	// RuleSegmentMissing: with Opts.Segments, a prune receipt's range
	// that no segment in the archive directory covers (SPEC §16).
	RuleSegmentMissing = "segment_missing"
	// RuleSegmentMismatch: with Opts.Segments, a prune receipt's segment
	// that does not check alone (archive.Check), whose manifest names
	// another range or digest than the receipt, or whose hashes differ
	// from the ones the ledger keeps for its seqs and the seq before.
	RuleSegmentMismatch = "segment_mismatch"

	// RulePrunedReference: a receipt after a prune receipt whose ref_seq
	// names a receipt that prune pruned (SPEC §16): a key pruned whole is
	// a new key (ref_seq 0), so nothing later may point into the range.
	RulePrunedReference = "pruned_reference"

	// RuleUnsupported: a receipt of a kind this verifier does not know
	// (SPEC §14: a verifier that meets a kind, a policy member or a
	// payload mode it does not know exits 2, never 1): a newer ledger
	// wrote it, or it was altered; either way this build cannot vouch for
	// the chain. Report.Unsupported counts them.
	RuleUnsupported = "unsupported"
)

// Pin is a verified head: the chain must keep the receipt at Seq with Hash.
type Pin struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

// Violation is one broken rule.
type Violation struct {
	Seq    uint64 `json:"seq"`
	Rule   string `json:"rule"`
	Detail string `json:"detail"`
}

// Report is the result of a check, in the JSON form of SPEC §5.
type Report struct {
	OK       bool   `json:"ok"`
	Receipts uint64 `json:"receipts"`
	Head     Pin    `json:"head"`
	// Violations holds the first Opts.MaxViolations; ViolationsTotal
	// counts them all.
	Violations      []Violation `json:"violations"`
	ViolationsTotal int         `json:"violations_total"`
	// Unsupported counts the violations of RuleUnsupported among them:
	// any makes ledgerctl verify exit 2.
	Unsupported int `json:"unsupported,omitempty"`
	// Checked is how many receipts were rehashed (fewer than Receipts on
	// an incremental run).
	Checked uint64 `json:"checked"`
	// PayloadsUnchecked: a committed namespace read without its payload
	// table with Opts.ReceiptsOnly: the chain alone was checked.
	PayloadsUnchecked bool `json:"payloads_unchecked,omitempty"`
	// SegmentsJoined counts the segments Opts.Segments found joined to
	// the ledger: one per prune receipt, each checked whole.
	SegmentsJoined int `json:"segments_joined,omitempty"`
	// UnverifiedPruned is [from, through]: the receipts after the pinned
	// head (--state, --expect-head) that were pruned (SPEC §16) and that
	// no segment joined covers, whose bodies this run could not check.
	UnverifiedPruned []uint64 `json:"unverified_pruned,omitempty"`
	// Pruned says how a run over a server's pruned namespace proved the
	// hash of the last pruned receipt, from which its chain pass started
	// (SPEC §16); nil for a database or a namespace never pruned.
	Pruned *PrunedProof `json:"pruned,omitempty"`
	Audit  *Audit       `json:"audit"`
}

// mergeViolations orders the violations of both passes by seq and keeps
// the first max.
func mergeViolations(max int, cols ...*collector) []Violation {
	out := []Violation{}
	for _, c := range cols {
		out = append(out, c.list...)
	}
	slices.SortStableFunc(out, func(a, b Violation) int { return cmp.Compare(a.Seq, b.Seq) })
	if len(out) > max {
		out = out[:max]
	}
	return out
}

// collector keeps the first max violations and counts them all. With
// bySeq set, violations may come in any seq order (the key states of a
// single pass replayed from spill files come after later receipts): it
// keeps the max with the lowest seq, in the order found among equal seqs.
type collector struct {
	max         int
	list        []Violation
	total       int
	unsupported int // of RuleUnsupported
	bySeq       bool
}

func (c *collector) add(seq uint64, rule, detail string) {
	c.total++
	if rule == RuleUnsupported {
		c.unsupported++
	}
	switch {
	case len(c.list) < c.max:
	case !c.bySeq:
		return
	case len(c.list) >= 2*c.max:
		slices.SortStableFunc(c.list, func(a, b Violation) int { return cmp.Compare(a.Seq, b.Seq) })
		c.list = c.list[:c.max]
	}
	c.list = append(c.list, Violation{Seq: seq, Rule: rule, Detail: detail})
}

func (c *collector) addf(seq uint64, rule, format string, args ...any) {
	c.add(seq, rule, fmt.Sprintf(format, args...))
}

// ParsePin parses "SEQ:HASH".
func ParsePin(s string) (*Pin, error) {
	var seq uint64
	var hash string
	if _, err := fmt.Sscanf(s, "%d:%s", &seq, &hash); err != nil {
		return nil, fmt.Errorf("parse head %q: want SEQ:HASH", s)
	}
	h, err := chain.ParseHash(hash)
	if err != nil {
		return nil, fmt.Errorf("parse head %q: %w", s, err)
	}
	return &Pin{Seq: seq, Hash: h.String()}, nil
}
