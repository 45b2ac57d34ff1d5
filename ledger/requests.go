package ledger

import (
	"encoding/json"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
)

// State is the state of an idempotency key (SPEC §3).
type State string

// Key states.
const (
	StateReserved    State = "reserved"
	StateInterrupted State = "interrupted"
	StateSucceeded   State = "succeeded"
	StateFailed      State = "failed"
	// StateNotApplied (v1.3, SPEC §4.1): the last outcome applied nothing;
	// the next reserve is decided as for a new key of the same generation.
	StateNotApplied State = "not_applied"
	// StateAwaitingApproval (v1.3, SPEC §13): a pending ask.
	StateAwaitingApproval State = "awaiting_approval"
	// StateRejected (v1.3, SPEC §13): a person rejected the key's ask.
	StateRejected State = "rejected"
	// StateApproved (SPEC §13): the key's latest ask was approved and no
	// reserve consumed the approval yet; the asker's next reserve before
	// the ask's expiry runs the effect.
	StateApproved State = "approved"
	// StateApprovalExpired (SPEC §13): a key that never ran, whose only
	// ask expired unanswered or approved and unused; the next reserve asks
	// again.
	StateApprovalExpired State = "approval_expired"
)

// Error codes of a not_applied outcome that attempted nothing (SPEC §4.1,
// §11.1): the call only asked for input, or could not ask. The audit's
// repeated failures do not count them.
const (
	CodeInputRequired           = "INPUT_REQUIRED"
	CodeClientCapabilityMissing = "CLIENT_CAPABILITY_MISSING"
)

// CountsAsFailure reports whether an outcome with error code code is a
// failure for the audit's repeated failures (SPEC §5, §4.1): failed, or
// not_applied unless its code says nothing was attempted.
func CountsAsFailure(outcome, code string) bool {
	switch outcome {
	case chain.OutcomeFailed:
		return true
	case chain.OutcomeNotApplied:
		return code != CodeInputRequired && code != CodeClientCapabilityMissing
	}
	return false
}

// CountsForAttempts reports whether a receipt of kind counts for the
// attempt rule of SPEC §4: the gate's policy, ask, approval and deny
// receipts do not (SPEC §2.1).
func CountsForAttempts(kind string) bool {
	switch kind {
	case chain.KindAsk, chain.KindApproval, chain.KindDeny:
		return false
	}
	return !chain.Keyless(kind)
}

// Reserve statuses (the body "status" of a successful reserve).
const (
	StatusReserved    = "reserved"
	StatusReplayed    = "replayed"
	StatusNotRecorded = "not_recorded"
	StatusCommitted   = "committed"
	StatusResolved    = "resolved"
	// StatusApprovalRequired (SPEC §13): the reserve waits for a person;
	// the result names the ask.
	StatusApprovalRequired = "approval_required"
)

// ReserveRequest asks for the right to run an effect once. Pointer fields
// are optional: nil means absent and takes the contract's default.
type ReserveRequest struct {
	IdempotencyKey string
	ExecutionID    string
	Attempt        *int64 // default 1
	Tool           string
	Effect         string
	Idempotent     bool
	InputHash      string
	Input          json.RawMessage // fingerprinted with RFC 8785; exclusive with InputHash
	LeaseMS        *int64          // default DefaultLeaseMS
	WaitMS         *int64          // 0 … MaxWaitMS, default 0: wait for another reservation to end (SPEC §8)
	Actor          string          // authenticated principal, empty without auth
	// ApprovalSummary is shown to an approver as the requester's claim
	// (SPEC §13; ≤ MaxApprovalSummary bytes).
	ApprovalSummary string
	// Changed is what differs from a failed attempt (SPEC §13 repeat guard).
	Changed *Changed
	// Subjects are the people the effect concerns (SPEC §14): opaque ids,
	// at most MaxSubjects, fixed by the first reserve of the key's
	// generation and kept only as MACs, never on the chain.
	Subjects []string
}

// Lease bounds in milliseconds.
const (
	MinLeaseMS     = 10
	MaxLeaseMS     = 86_400_000
	DefaultLeaseMS = 30_000
)

// ReceiptRef names a receipt by seq and hash.
type ReceiptRef struct {
	Seq  uint64
	Hash chain.Hash
}

func refOf(r *chain.Receipt) ReceiptRef { return ReceiptRef{Seq: r.Seq, Hash: r.Hash} }

// ReserveResult is the outcome of a successful Reserve.
type ReserveResult struct {
	Status         string // StatusReserved, StatusReplayed or StatusNotRecorded
	IdempotencyKey string
	KeyGenerated   bool

	// StatusReserved.
	Reservation    string // the secret token; returned once
	Attempt        uint64
	LeaseExpiresAt uint64
	Takeover       bool
	Retry          bool
	// Renewed is set when the key had expired (SPEC §12): the reserve
	// starts a new generation linked to the receipt it names.
	Renewed *Renewal
	// AfterNotApplied is set when the key's last outcome was not_applied
	// (SPEC §4.1): the reserve runs the effect again and names it.
	AfterNotApplied *NotAppliedRef

	// StatusReplayed: the recorded outcome and the receipt it came from.
	Outcome     string
	ExternalRef string
	Result      string // compact JSON text, empty if none
	Original    ReceiptRef
	// Erased names the recorded fields an erasure removed (SPEC §14), by
	// field name: the seq of the erase receipt; nil when none was.
	Erased map[string]uint64

	// Approval is the approval a reserve consumed (SPEC §13), nil if none.
	Approval *ApprovalRef

	// StatusApprovalRequired: the pending ask (Receipt is the ask too).
	Ask *AskRef

	// The receipt appended (reserve or replay); zero for not_recorded.
	Receipt ReceiptRef
}

// ApprovalRef names the approval a reserve consumed and its ask.
type ApprovalRef struct {
	Seq, AskSeq uint64
}

// AskRef names a pending ask and its expiry (unix ms).
type AskRef struct {
	Seq, ExpiresAt uint64
}

// FailureDetail describes a failed outcome.
type FailureDetail struct {
	Code      string
	Message   string
	Retryable bool
}

// CommitRequest records the outcome of a reserved effect.
type CommitRequest struct {
	IdempotencyKey string
	Reservation    string
	Outcome        string
	ExternalRef    string
	Result         json.RawMessage // any JSON; nil or null is absent
	Error          *FailureDetail  // required when Outcome is failed
	Actor          string
}

// CommitResult is the outcome of a successful Commit.
type CommitResult struct {
	IdempotencyKey string
	Outcome        string
	Receipt        ReceiptRef
	Late           bool // committed after the lease ended
	// Replayed is true when the same commit was recorded before and
	// nothing was appended now.
	Replayed bool
	// ReconciledEarlier is set on the original call's commit of a
	// reservation a reconcile finalized (SPEC §15): appended, the key's
	// state unchanged.
	ReconciledEarlier *ReconciledRef
}

// ResolveRequest is an operator's decision about an interrupted key.
type ResolveRequest struct {
	IdempotencyKey string
	Outcome        string
	ExternalRef    string
	Result         json.RawMessage
	Error          *FailureDetail
	Note           string
	Actor          string
	// MayCorrect allows the correction of a failed key to not_applied
	// (SPEC §4.1): the caller holds an admin token, or the ledger has no
	// tokens.
	MayCorrect bool
}

// ResolveResult is the outcome of a successful Resolve.
type ResolveResult struct {
	IdempotencyKey string
	State          State
	Receipt        ReceiptRef
}

// NotAppliedRef names the not_applied outcome a reserve follows.
type NotAppliedRef struct {
	Seq       uint64
	ErrorCode string
}

// Renewal names the latest receipt of a key's previous generation.
type Renewal struct {
	Seq        uint64
	RecordedAt uint64
}

// KeyView is the state of a key with its receipts, oldest first.
type KeyView struct {
	IdempotencyKey string
	State          State
	Tool           string
	Effect         string
	Idempotent     bool
	InputHash      string
	// FirstSeq is the first reserve of the key's current generation and
	// FinalSeq its latest commit or resolve (0 if none), as in KeyRecord.
	FirstSeq, FinalSeq uint64
	// ExpiresAt is when a finalized key of a namespace with a key TTL is
	// forgotten (unix ms; 0 otherwise). Set by WithLifetime.
	ExpiresAt uint64
	Receipts  []chain.Receipt
}

// WithLifetime applies the namespace's key_ttl_ms to a view read by a
// driver (SPEC §12): it sets ExpiresAt for a finalized key, and keeps
// only the current generation's receipts unless history is true.
func (v *KeyView) WithLifetime(keyTTL uint64, history bool) {
	if v.State == StateSucceeded || v.State == StateFailed || v.State == StateNotApplied {
		for i := range v.Receipts {
			if v.Receipts[i].Seq == v.FinalSeq {
				v.ExpiresAt = ExpiresAt(v.Receipts[i].RecordedAt, keyTTL)
			}
		}
	}
	if history {
		return
	}
	i := 0
	for i < len(v.Receipts) && v.Receipts[i].Seq < v.FirstSeq {
		i++
	}
	v.Receipts = v.Receipts[i:]
}

// ReceiptFilter selects receipts for ListReceipts. Empty strings match all.
type ReceiptFilter struct {
	After       uint64
	Limit       int
	Key         string
	ExecutionID string
	Tool        string
	Kind        string
}

// Check sets the default limit and validates the filter: what every
// driver's ListReceipts does first. Errors: *Error with
// ECodeInvalidRequest naming limit or kind.
func (f *ReceiptFilter) Check() error {
	if f.Limit == 0 {
		f.Limit = DefaultPageLimit
	}
	if f.Limit < 1 || f.Limit > MaxPageLimit {
		return Invalid("limit", "limit must be from 1 to %d", MaxPageLimit)
	}
	if f.Kind != "" && !chain.KnownKind(f.Kind) {
		return Invalid("kind", "kind must be %s", chain.KindList())
	}
	return nil
}

// Receipt page bounds.
const (
	DefaultPageLimit = 100
	MaxPageLimit     = 1000
)

// Head is the latest receipt of the chain: seq 0 and the zero hash when
// the ledger is empty.
type Head struct {
	Seq  uint64
	Hash chain.Hash
}

// MsDuration converts a count of milliseconds into a time.Duration.
func MsDuration(ms uint64) time.Duration { return time.Duration(ms) * time.Millisecond }
