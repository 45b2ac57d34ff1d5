package verify

import (
	"cmp"
	"slices"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
)

// AuditFilter narrows the audit to recent events and one tool. An entry
// is in the window when its event is: a runtime retry's reserve, a
// re-invocation's receipt, a resolution; for an interrupted key its latest
// reserve, for a failed key its final receipt; for a duplicate effect its
// latest success and for a repeated failure its latest repeat (the entry
// then lists all its keys, older ones too).
type AuditFilter struct {
	Since    time.Time // events recorded at or after Since; zero for all
	SinceSeq uint64    // events at receipts with seq >= SinceSeq; 0 for all
	Tool     string    // keys of this tool only; empty for all
}

// window is an AuditFilter in the ledger's units.
type window struct {
	sinceMs, sinceSeq uint64
	tool              string
}

func (f AuditFilter) window() window {
	w := window{sinceSeq: f.SinceSeq, tool: f.Tool}
	if !f.Since.IsZero() && f.Since.UnixMilli() > 0 {
		w.sinceMs = uint64(f.Since.UnixMilli())
	}
	return w
}

// has reports whether an event of a key of tool, at receipt seq recorded
// at unix ms at, is in the window.
func (w window) has(tool string, seq, at uint64) bool {
	return seq >= w.sinceSeq && at >= w.sinceMs && (w.tool == "" || tool == w.tool)
}

// Audit tells runtime retries from re-invocations and lists what needs a
// person (SPEC §5). Each list names the keys involved.
type Audit struct {
	RuntimeRetries   []RuntimeRetry    `json:"runtime_retries"`
	ReInvocations    []ReInvocation    `json:"re_invocations"`
	DuplicateEffects []DuplicateEffect `json:"duplicate_effects"`
	RepeatedFailures []RepeatedFailure `json:"repeated_failures"`
	Interrupted      []InterruptedKey  `json:"interrupted"`
	Failed           []FailedKey       `json:"failed"`
	Resolutions      []Resolution      `json:"resolutions"`
	// RenewedKeys (SPEC §12) are the reserves that started a new
	// generation of an expired key.
	RenewedKeys []RenewedKey `json:"renewed_keys"`
	// NotAppliedReruns (SPEC §4.1) are the reserves that ran an effect
	// again after an outcome that claimed to apply nothing.
	NotAppliedReruns []NotAppliedRerun `json:"not_applied_reruns"`
	// Approvals (SPEC §13) lists each ask: its answer, approver and the
	// reserve that consumed it.
	Approvals []ApprovalRecord `json:"approvals"`
	// Denied lists the deny receipts: effects the policy refused.
	Denied []DeniedEffect `json:"denied"`
	// UnauthenticatedApprovals lists the approvals without an actor.
	UnauthenticatedApprovals []UnauthenticatedApproval `json:"unauthenticated_approvals"`
	// Reconciliations (SPEC §15) are the keys ended by the actor of their
	// reserve from a downstream's answer, apart from Resolutions.
	Reconciliations []Reconciliation `json:"reconciliations"`
	// ReconcileContradicted lists the original calls' late commits whose
	// outcome or external_ref differs from the reconciled one.
	ReconcileContradicted []ReconcileContradiction `json:"reconcile_contradicted"`
	// Erasures (SPEC §14) lists the erase receipts: who erased how many
	// receipts' payloads, which fields, and why (the reason unless it was
	// itself erased or is not kept).
	Erasures []ErasureEntry `json:"erasures"`
	// PrunedRanges (SPEC §16) lists the prune receipts: who pruned which
	// range, and the digest of its archived segment.
	PrunedRanges []PrunedRange `json:"pruned_ranges"`
}

// PrunedRange is one prune receipt in the audit.
type PrunedRange struct {
	Seq        uint64 `json:"seq"`
	Actor      string `json:"actor"`
	RecordedAt uint64 `json:"recorded_at"`
	From       uint64 `json:"from"`
	Through    uint64 `json:"through"`
	Digest     string `json:"digest"`
	// Segment is the segment's name, from the prune row (SPEC §16); the
	// actor and recorded_at of a prune whose receipt was itself pruned
	// are gone.
	Segment string `json:"segment,omitempty"`
}

// ErasureEntry is one erase receipt in the audit.
type ErasureEntry struct {
	Seq        uint64   `json:"seq"`
	Actor      string   `json:"actor"`
	RecordedAt uint64   `json:"recorded_at"`
	Count      uint64   `json:"count"`
	Fields     []string `json:"fields"`
	Retention  bool     `json:"retention,omitempty"`
	Reason     string   `json:"reason,omitempty"`
}

// NotAppliedRerun is a reserve of a key whose last outcome was not_applied
// (SPEC §4.1): the effect is run again on the committer's claim that the
// earlier run applied nothing, so a false claim shows here.
type NotAppliedRerun struct {
	Key  string `json:"key"`
	Tool string `json:"tool"`
	// NotAppliedSeq is the commit or resolve with outcome not_applied,
	// ErrorCode its error code; Seq is the later reserve.
	NotAppliedSeq uint64 `json:"not_applied_seq"`
	ErrorCode     string `json:"error_code"`
	Seq           uint64 `json:"seq"`
	ExecutionID   string `json:"execution_id"`
	RecordedAt    uint64 `json:"recorded_at"`
}

// RenewedKey is a reserve of a key whose outcome was at least the
// namespace's key_ttl_ms old (SPEC §12): a new effect under the same key,
// not a re-invocation of the earlier one.
type RenewedKey struct {
	Key  string `json:"key"`
	Tool string `json:"tool"`
	// PreviousFinalSeq is the commit or resolve that ended the previous
	// generation, PreviousOutcome its outcome (succeeded, failed or not_applied); Seq
	// is the new generation's reserve.
	PreviousFinalSeq uint64 `json:"previous_final_seq"`
	PreviousOutcome  string `json:"previous_outcome"`
	Seq              uint64 `json:"seq"`
	ExecutionID      string `json:"execution_id"`
	RecordedAt       uint64 `json:"recorded_at"`
}

// RuntimeRetry is one execution that reserved a key more than once: its
// attempts in order, and what ended each attempt before the next (the
// failure's error code, or "interrupted" when its lease ran out).
type RuntimeRetry struct {
	Key         string   `json:"key"`
	Tool        string   `json:"tool"`
	ExecutionID string   `json:"execution_id"`
	Attempts    []uint64 `json:"attempts"`
	ErrorCodes  []string `json:"error_codes"`
	Seqs        []uint64 `json:"seqs"`
}

// ReInvocation is a receipt of a key by an execution other than the key's
// first: a call deduplicated by replay, or a takeover or retry by a new
// execution.
type ReInvocation struct {
	Key              string `json:"key"`
	Tool             string `json:"tool"`
	Seq              uint64 `json:"seq"`
	Kind             string `json:"kind"`
	Outcome          string `json:"outcome"` // deduped, takeover or retry
	ExecutionID      string `json:"execution_id"`
	FirstExecutionID string `json:"first_execution_id"`
	RecordedAt       uint64 `json:"recorded_at"`
}

// DuplicateEffect is a set of distinct keys that ran the same tool on the
// same input and all succeeded: the "refund called twice" a key could not
// catch.
type DuplicateEffect struct {
	Tool      string   `json:"tool"`
	InputHash string   `json:"input_hash"`
	Keys      []string `json:"keys"`
	Seqs      []uint64 `json:"seqs"` // the success receipts, in the order of Keys
}

// RepeatedFailure is "the same failing step run again": a call (a tool
// and a non-empty input_hash) whose effect failed under one key and that
// was then reserved again under other keys, unchanged, or under the same
// key by another execution after a not_applied (SPEC §4.1). A key counts as a
// repeat when its first reserve comes after the call's first failure;
// keys reserved before it ran alongside, not after, and are not listed.
// The repeats' own outcomes do not matter: a repeat that succeeded was
// still run again unchanged. Runtime retries of the failed key itself are
// RuntimeRetries, not this.
type RepeatedFailure struct {
	Tool      string `json:"tool"`
	InputHash string `json:"input_hash"`
	ErrorCode string `json:"error_code"` // of the first failure
	// Keys are the key of the first failure, then every other key
	// reserved after it, in seq order; each key once, also when it ran
	// the call again itself (after a not_applied, SPEC §4.1).
	Keys []string `json:"keys"`
	// Executions are the runs' executions: the failure's (i = 0), then
	// each repeat's — a later key's first reserve, or a reserve of a key
	// again after its not_applied by another execution — in seq order.
	Executions []string `json:"executions"`
	// Seqs are the runs' receipts, in the order of Executions: the
	// failure, then each repeat's reserve.
	Seqs []uint64 `json:"seqs"`
}

// InterruptedKey is a key whose lease ended without an outcome. The
// non-idempotent ones await a person (resolve).
type InterruptedKey struct {
	Key            string `json:"key"`
	Tool           string `json:"tool"`
	Idempotent     bool   `json:"idempotent"`
	AwaitingPerson bool   `json:"awaiting_person"`
	ReserveSeq     uint64 `json:"reserve_seq"`
	ExecutionID    string `json:"execution_id"`
	Attempt        uint64 `json:"attempt"`
	LeaseExpiresAt uint64 `json:"lease_expires_at"`
}

// FailedKey is a key whose state is failed.
type FailedKey struct {
	Key       string `json:"key"`
	Tool      string `json:"tool"`
	ErrorCode string `json:"error_code"`
	Retryable bool   `json:"retryable"`
	Seq       uint64 `json:"seq"`
}

// Resolution is an operator's decision about an interrupted key.
type Resolution struct {
	Key        string `json:"key"`
	Tool       string `json:"tool"`
	Seq        uint64 `json:"seq"`
	Outcome    string `json:"outcome"`
	ErrorCode  string `json:"error_code"`
	Note       string `json:"note"`
	Actor      string `json:"actor"`
	RecordedAt uint64 `json:"recorded_at"`
	Erased     Erased `json:"erased,omitempty"` // note
}

// Erased names the members of an audit entry whose values were erased
// (SPEC §14), each with the seq of the erase receipt; such a member is
// "". Nil when none was.
type Erased map[string]uint64

// add records that member's value was erased by receipt by; by 0 adds
// nothing.
func (e *Erased) add(member string, by uint64) {
	if by == 0 {
		return
	}
	if *e == nil {
		*e = Erased{}
	}
	(*e)[member] = by
}

// payloadValue is what the audit shows of payload field f of r (SPEC
// §14): the value (r.Open's, or the field's text), or, once erased, ""
// and the seq of the erase receipt. known is false when the value is not
// there to show: erased, or a commitment whose value was not read (a copy
// without its payload table, a value that does not open it), which shows
// as "", never as its chain text.
func payloadValue(r *chain.Receipt, f chain.PayloadField) (value string, erasedBy uint64, known bool) {
	if p := r.Open.Get(f); p != nil {
		if p.ErasedBy > 0 {
			return "", p.ErasedBy, false
		}
		return p.Value, 0, true
	}
	if text := r.Field(f); !chain.IsCommitment(text) {
		return text, 0, true
	}
	return "", 0, false
}

// auditBuilder collects audit entries while the state checker runs.
type auditBuilder struct {
	win  window
	from uint64 // events at or before from were audited by an earlier run

	a       Audit
	retries map[string]map[string]*RuntimeRetry // key → execution → entry
	// dups, when not nil, collects the succeeded keys of each (tool,
	// input_hash) from the key states (a source without DuplicateSource).
	dups map[[2]string]*dupGroup
}

// dupGroup is a DuplicateEffect in the making, with its latest success.
type dupGroup struct {
	d                   DuplicateEffect
	latestSeq, latestAt uint64
}

func newAuditBuilder(f AuditFilter, from uint64) *auditBuilder {
	return &auditBuilder{win: f.window(), from: from, retries: map[string]map[string]*RuntimeRetry{},
		dups: map[[2]string]*dupGroup{}}
}

// wants reports whether an event of key k at receipt seq, recorded at
// unix ms at, is in the audit.
func (b *auditBuilder) wants(k *keyState, seq, at uint64) bool {
	return seq > b.from && b.win.has(k.first.Tool, seq, at)
}

func (b *auditBuilder) reserve(k *keyState, r *chain.Receipt, state string, seen bool, prev uint64) {
	if !b.wants(k, r.Seq, r.RecordedAt) {
		return
	}
	between := k.final.code
	if state == "interrupted" {
		between = "interrupted"
	}
	if seen && r.Attempt > prev {
		byExec := b.retries[k.key]
		if byExec == nil {
			byExec = map[string]*RuntimeRetry{}
			b.retries[k.key] = byExec
		}
		rr := byExec[r.ExecutionID]
		if rr == nil {
			rr = &RuntimeRetry{Key: k.key, Tool: k.first.Tool, ExecutionID: r.ExecutionID, Attempts: []uint64{prev}}
			byExec[r.ExecutionID] = rr
		}
		rr.Attempts = append(rr.Attempts, r.Attempt)
		rr.ErrorCodes = append(rr.ErrorCodes, between)
		rr.Seqs = append(rr.Seqs, r.Seq)
	}
	if r.ExecutionID != k.first.ExecutionID && state != "not_applied" { // listed as NotAppliedReruns
		outcome := "retry"
		if state == "interrupted" {
			outcome = "takeover"
		}
		b.reInvocation(k, r, outcome)
	}
}

// renewed records the reserve r that starts a new generation of k, whose
// previous generation ended at receipt finalSeq.
func (b *auditBuilder) renewed(k *keyState, r *chain.Receipt, finalSeq uint64) {
	if r.Seq > b.from && b.win.has(r.Tool, r.Seq, r.RecordedAt) {
		b.a.RenewedKeys = append(b.a.RenewedKeys, RenewedKey{Key: k.key, Tool: r.Tool, PreviousFinalSeq: finalSeq,
			PreviousOutcome: k.final.outcome, Seq: r.Seq, ExecutionID: r.ExecutionID, RecordedAt: r.RecordedAt})
	}
}

// notAppliedRerun records the reserve r of k, whose last outcome was
// not_applied.
func (b *auditBuilder) notAppliedRerun(k *keyState, r *chain.Receipt) {
	if b.wants(k, r.Seq, r.RecordedAt) {
		b.a.NotAppliedReruns = append(b.a.NotAppliedReruns, NotAppliedRerun{Key: k.key, Tool: k.first.Tool,
			NotAppliedSeq: k.final.seq, ErrorCode: k.final.code, Seq: r.Seq, ExecutionID: r.ExecutionID,
			RecordedAt: r.RecordedAt})
	}
}

func (b *auditBuilder) replay(k *keyState, r *chain.Receipt) {
	if r.ExecutionID != k.first.ExecutionID && b.wants(k, r.Seq, r.RecordedAt) {
		b.reInvocation(k, r, "deduped")
	}
}

func (b *auditBuilder) reInvocation(k *keyState, r *chain.Receipt, outcome string) {
	b.a.ReInvocations = append(b.a.ReInvocations, ReInvocation{Key: k.key, Tool: k.first.Tool, Seq: r.Seq,
		Kind: r.Kind, Outcome: outcome, ExecutionID: r.ExecutionID, FirstExecutionID: k.first.ExecutionID,
		RecordedAt: r.RecordedAt})
}

// resolution records the resolve r of k, shown with its values.
func (b *auditBuilder) resolution(k *keyState, r *chain.Receipt) {
	if b.wants(k, r.Seq, r.RecordedAt) {
		note, erasedBy, _ := payloadValue(r, chain.FieldNote)
		res := Resolution{Key: k.key, Tool: k.first.Tool, Seq: r.Seq, Outcome: r.Outcome, ErrorCode: r.ErrorCode,
			Note: note, Actor: r.Actor, RecordedAt: r.RecordedAt}
		res.Erased.add("note", erasedBy)
		b.a.Resolutions = append(b.a.Resolutions, res)
	}
}

// finishKey records the key's final state at unix ms now.
func (b *auditBuilder) finishKey(k *keyState, now uint64) {
	switch k.state(now) {
	case "interrupted":
		// A state, not an event: listed for every key read, however old.
		if b.win.has(k.first.Tool, k.latest.seq, k.latest.recordedAt) {
			b.a.Interrupted = append(b.a.Interrupted, InterruptedKey{Key: k.key, Tool: k.first.Tool,
				Idempotent: k.first.Idempotent, AwaitingPerson: !k.first.Idempotent, ReserveSeq: k.latest.seq,
				ExecutionID: k.latest.execution, Attempt: k.latest.attempt, LeaseExpiresAt: k.latest.lease})
		}
	case "failed":
		if b.win.has(k.first.Tool, k.final.seq, k.final.recordedAt) {
			b.a.Failed = append(b.a.Failed, FailedKey{Key: k.key, Tool: k.first.Tool, ErrorCode: k.final.code,
				Retryable: k.final.retryable, Seq: k.final.seq})
		}
	case "succeeded":
		if b.dups != nil && k.first.InputHash != "" && (b.win.tool == "" || k.first.Tool == b.win.tool) {
			id := [2]string{k.first.Tool, k.first.InputHash}
			g := b.dups[id]
			if g == nil {
				g = &dupGroup{d: DuplicateEffect{Tool: id[0], InputHash: id[1]}}
				b.dups[id] = g
			}
			g.d.Keys = append(g.d.Keys, k.key)
			g.d.Seqs = append(g.d.Seqs, k.final.seq)
			if k.final.seq > g.latestSeq {
				g.latestSeq, g.latestAt = k.final.seq, k.final.recordedAt
			}
		}
	}
}

// build returns the audit with every list sorted by key and seq. dups and
// repeats, when not nil, are what a DuplicateSource or a RepeatSource (or
// a repeatFinder) found.
func (b *auditBuilder) build(dups []DuplicateEffect, repeats []RepeatedFailure) *Audit {
	a := b.a
	a.DuplicateEffects = append(a.DuplicateEffects, dups...)
	a.RepeatedFailures = append(a.RepeatedFailures, repeats...)
	for _, byExec := range b.retries {
		for _, rr := range byExec {
			a.RuntimeRetries = append(a.RuntimeRetries, *rr)
		}
	}
	for _, g := range b.dups {
		if len(g.d.Keys) < 2 || g.latestSeq <= b.from || !b.win.has(g.d.Tool, g.latestSeq, g.latestAt) {
			continue
		}
		d := g.d
		sortBySeq(d.Keys, d.Seqs) // keys were finished in map order
		a.DuplicateEffects = append(a.DuplicateEffects, d)
	}
	slices.SortFunc(a.RuntimeRetries, func(x, y RuntimeRetry) int {
		return cmp.Or(cmp.Compare(x.Key, y.Key), cmp.Compare(x.Seqs[0], y.Seqs[0]))
	})
	slices.SortFunc(a.ReInvocations, func(x, y ReInvocation) int { return cmp.Compare(x.Seq, y.Seq) })
	slices.SortFunc(a.DuplicateEffects, func(x, y DuplicateEffect) int {
		return cmp.Or(cmp.Compare(x.Tool, y.Tool), cmp.Compare(x.InputHash, y.InputHash))
	})
	slices.SortFunc(a.RepeatedFailures, func(x, y RepeatedFailure) int {
		return cmp.Or(cmp.Compare(x.Tool, y.Tool), cmp.Compare(x.InputHash, y.InputHash))
	})
	slices.SortFunc(a.Interrupted, func(x, y InterruptedKey) int { return cmp.Compare(x.ReserveSeq, y.ReserveSeq) })
	slices.SortFunc(a.Failed, func(x, y FailedKey) int { return cmp.Compare(x.Seq, y.Seq) })
	slices.SortFunc(a.Resolutions, func(x, y Resolution) int { return cmp.Compare(x.Seq, y.Seq) })
	slices.SortFunc(a.RenewedKeys, func(x, y RenewedKey) int { return cmp.Compare(x.Seq, y.Seq) })
	slices.SortFunc(a.NotAppliedReruns, func(x, y NotAppliedRerun) int { return cmp.Compare(x.Seq, y.Seq) })
	slices.SortFunc(a.Reconciliations, func(x, y Reconciliation) int { return cmp.Compare(x.Seq, y.Seq) })
	slices.SortFunc(a.ReconcileContradicted, func(x, y ReconcileContradiction) int { return cmp.Compare(x.CommitSeq, y.CommitSeq) })
	ensure(&a.Reconciliations)
	ensure(&a.Erasures)
	ensure(&a.PrunedRanges)
	ensure(&a.ReconcileContradicted)
	ensure(&a.RenewedKeys)
	ensure(&a.NotAppliedReruns)
	ensure(&a.RuntimeRetries)
	ensure(&a.ReInvocations)
	ensure(&a.DuplicateEffects)
	ensure(&a.RepeatedFailures)
	ensure(&a.Interrupted)
	ensure(&a.Failed)
	ensure(&a.Resolutions)
	return &a
}

// sortBySeq sorts keys and their seqs together, by seq.
func sortBySeq(keys []string, seqs []uint64) {
	idx := make([]int, len(keys))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(x, y int) int { return cmp.Compare(seqs[x], seqs[y]) })
	k, s := slices.Clone(keys), slices.Clone(seqs)
	for i, j := range idx {
		keys[i], seqs[i] = k[j], s[j]
	}
}

// ensure makes a nil list an empty one, so JSON shows [] not null.
func ensure[T any](l *[]T) {
	if *l == nil {
		*l = []T{}
	}
}
