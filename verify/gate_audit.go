package verify

import (
	"cmp"
	"slices"

	"github.com/effect-ledger/effect-ledger/chain"
)

// ApprovalRecord is one ask of the gate (SPEC §13) and what became of it.
type ApprovalRecord struct {
	AskSeq      uint64 `json:"ask_seq"`
	Key         string `json:"key"`
	Tool        string `json:"tool"`
	ExecutionID string `json:"execution_id"`
	Actor       string `json:"actor"` // who asked
	// State is pending, approved, rejected, expired or consumed, at the
	// run's time.
	State      string            `json:"state"`
	AskedAt    uint64            `json:"asked_at"`
	ExpiresAt  uint64            `json:"expires_at"`
	Answer     *ApprovalAnswer   `json:"answer"`
	ConsumedBy *ApprovalConsumer `json:"consumed_by"`
}

// ApprovalAnswer is the approval receipt that answered an ask.
type ApprovalAnswer struct {
	Seq        uint64 `json:"seq"`
	Decision   string `json:"decision"` // approve or reject
	Actor      string `json:"actor"`
	Role       string `json:"role"`
	Note       string `json:"note"`
	RecordedAt uint64 `json:"recorded_at"`
	Erased     Erased `json:"erased,omitempty"` // note
}

// ApprovalConsumer is the reserve that consumed an approval.
type ApprovalConsumer struct {
	Seq         uint64 `json:"seq"`
	ExecutionID string `json:"execution_id"`
	Attempt     uint64 `json:"attempt"`
}

// DeniedEffect is a deny receipt: a reserve the policy refused.
type DeniedEffect struct {
	Seq         uint64 `json:"seq"`
	Key         string `json:"key"`
	Tool        string `json:"tool"`
	ExecutionID string `json:"execution_id"`
	Actor       string `json:"actor"`
	RecordedAt  uint64 `json:"recorded_at"`
}

// UnauthenticatedApproval is an approval receipt without an actor (a
// ledger without tokens): who answered, and whether it was the asker,
// cannot be told.
type UnauthenticatedApproval struct {
	Seq        uint64 `json:"seq"`
	AskSeq     uint64 `json:"ask_seq"`
	Key        string `json:"key"`
	Tool       string `json:"tool"`
	Outcome    string `json:"outcome"`
	RecordedAt uint64 `json:"recorded_at"`
}

// fill sets the gate's members of the audit, each sorted by seq.
func (g *gateChecker) fill(a *Audit, now uint64) {
	a.Approvals = g.approvalRecords(now)
	a.Denied = append([]DeniedEffect{}, g.denied...)
	a.UnauthenticatedApprovals = append([]UnauthenticatedApproval{}, g.unauth...)
}

// approvalRecords lists the asks with an event (the ask, its answer or
// its consumption) after from and in the window, by ask seq.
func (g *gateChecker) approvalRecords(now uint64) []ApprovalRecord {
	out := []ApprovalRecord{}
	for _, e := range g.asks {
		seq, at := e.r.Seq, e.r.RecordedAt
		if e.answer != nil {
			seq, at = e.answer.r.Seq, e.answer.r.RecordedAt
		}
		if e.consumedBy != nil {
			seq, at = e.consumedBy.Seq, e.consumedBy.RecordedAt
		}
		if seq > g.from && g.win.has(e.r.Tool, seq, at) {
			out = append(out, e.record(now))
		}
	}
	slices.SortFunc(out, func(x, y ApprovalRecord) int { return cmp.Compare(x.AskSeq, y.AskSeq) })
	return out
}

// record is the audit entry of an ask at unix ms now.
func (e *askEntry) record(now uint64) ApprovalRecord {
	rec := ApprovalRecord{AskSeq: e.r.Seq, Key: e.r.IdempotencyKey, Tool: e.r.Tool, ExecutionID: e.r.ExecutionID,
		Actor: e.r.Actor, AskedAt: e.r.RecordedAt, ExpiresAt: e.r.LeaseExpiresAt}
	answered := e.answer != nil && e.answer.r.RecordedAt < e.r.LeaseExpiresAt
	switch {
	case e.consumedBy != nil:
		rec.State = "consumed"
	case answered && e.answer.r.Outcome == chain.OutcomeApproved:
		rec.State = "approved"
	case answered:
		rec.State = "rejected"
	case now < e.r.LeaseExpiresAt:
		rec.State = "pending"
	default:
		rec.State = "expired"
	}
	if a := e.answer; a != nil {
		decision := "reject"
		if a.r.Outcome == chain.OutcomeApproved {
			decision = "approve"
		}
		rec.Answer = &ApprovalAnswer{Seq: a.r.Seq, Decision: decision, Actor: a.r.Actor, Role: a.role,
			Note: a.note, RecordedAt: a.r.RecordedAt}
		rec.Answer.Erased.add("note", a.noteErased)
	}
	if c := e.consumedBy; c != nil {
		rec.ConsumedBy = &ApprovalConsumer{Seq: c.Seq, ExecutionID: c.ExecutionID, Attempt: c.Attempt}
	}
	return rec
}
