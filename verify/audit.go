package verify

import (
	"cmp"
	"slices"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
)

// AuditFilter narrows the audit to recent events and one tool.
type AuditFilter struct {
	Since time.Time // events recorded at or after Since; zero for all
	Tool  string    // keys of this tool only; empty for all
}

// Audit tells runtime retries from re-invocations and lists what needs a
// person (SPEC §5). Each list names the keys involved.
type Audit struct {
	RuntimeRetries   []RuntimeRetry    `json:"runtime_retries"`
	ReInvocations    []ReInvocation    `json:"re_invocations"`
	DuplicateEffects []DuplicateEffect `json:"duplicate_effects"`
	Interrupted      []InterruptedKey  `json:"interrupted"`
	Failed           []FailedKey       `json:"failed"`
	Resolutions      []Resolution      `json:"resolutions"`
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
}

// auditBuilder collects audit entries while the state checker runs.
type auditBuilder struct {
	since uint64
	tool  string
	from  uint64 // events at or before from were audited by an earlier run

	a       Audit
	retries map[string]map[string]*RuntimeRetry // key → execution → entry
	dups    map[[2]string]*DuplicateEffect
}

func newAuditBuilder(f AuditFilter, from uint64) *auditBuilder {
	b := &auditBuilder{tool: f.Tool, from: from, retries: map[string]map[string]*RuntimeRetry{},
		dups: map[[2]string]*DuplicateEffect{}}
	if !f.Since.IsZero() {
		b.since = uint64(f.Since.UnixMilli())
	}
	return b
}

// wants reports whether an event of key k at receipt r is in the audit.
func (b *auditBuilder) wants(k *keyState, seq, at uint64) bool {
	return seq > b.from && at >= b.since && (b.tool == "" || k.first.Tool == b.tool)
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
	if r.ExecutionID != k.first.ExecutionID {
		outcome := "retry"
		if state == "interrupted" {
			outcome = "takeover"
		}
		b.reInvocation(k, r, outcome)
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

func (b *auditBuilder) resolution(k *keyState, r *chain.Receipt) {
	if b.wants(k, r.Seq, r.RecordedAt) {
		b.a.Resolutions = append(b.a.Resolutions, Resolution{Key: k.key, Tool: k.first.Tool, Seq: r.Seq,
			Outcome: r.Outcome, ErrorCode: r.ErrorCode, Note: r.Note, Actor: r.Actor, RecordedAt: r.RecordedAt})
	}
}

// finishKey records the key's final state at unix ms now.
func (b *auditBuilder) finishKey(k *keyState, now uint64) {
	switch k.state(now) {
	case "interrupted":
		// A state, not an event: listed for every key read, however old.
		if b.wants(k, b.from+1, k.latest.recordedAt) {
			b.a.Interrupted = append(b.a.Interrupted, InterruptedKey{Key: k.key, Tool: k.first.Tool,
				Idempotent: k.first.Idempotent, AwaitingPerson: !k.first.Idempotent, ReserveSeq: k.latest.seq,
				ExecutionID: k.latest.execution, Attempt: k.latest.attempt, LeaseExpiresAt: k.latest.lease})
		}
	case "failed":
		if b.wants(k, b.from+1, k.final.recordedAt) {
			b.a.Failed = append(b.a.Failed, FailedKey{Key: k.key, Tool: k.first.Tool, ErrorCode: k.final.code,
				Retryable: k.final.retryable, Seq: k.final.seq})
		}
	case "succeeded":
		if b.dups != nil && k.first.InputHash != "" && (b.tool == "" || k.first.Tool == b.tool) {
			id := [2]string{k.first.Tool, k.first.InputHash}
			d := b.dups[id]
			if d == nil {
				d = &DuplicateEffect{Tool: id[0], InputHash: id[1]}
				b.dups[id] = d
			}
			d.Keys = append(d.Keys, k.key)
			d.Seqs = append(d.Seqs, k.final.seq)
		}
	}
}

// build returns the audit with every list sorted by key and seq. dups,
// when not nil, are the duplicate effects a DuplicateSource found.
func (b *auditBuilder) build(dups []DuplicateEffect) *Audit {
	a := b.a
	a.DuplicateEffects = append(a.DuplicateEffects, dups...)
	for _, byExec := range b.retries {
		for _, rr := range byExec {
			a.RuntimeRetries = append(a.RuntimeRetries, *rr)
		}
	}
	for _, d := range b.dups {
		if len(d.Keys) < 2 || !anyAfter(d.Seqs, b.from) {
			continue
		}
		a.DuplicateEffects = append(a.DuplicateEffects, *d)
	}
	slices.SortFunc(a.RuntimeRetries, func(x, y RuntimeRetry) int {
		return cmp.Or(cmp.Compare(x.Key, y.Key), cmp.Compare(x.Seqs[0], y.Seqs[0]))
	})
	slices.SortFunc(a.ReInvocations, func(x, y ReInvocation) int { return cmp.Compare(x.Seq, y.Seq) })
	slices.SortFunc(a.DuplicateEffects, func(x, y DuplicateEffect) int {
		return cmp.Or(cmp.Compare(x.Tool, y.Tool), cmp.Compare(x.InputHash, y.InputHash))
	})
	slices.SortFunc(a.Interrupted, func(x, y InterruptedKey) int { return cmp.Compare(x.ReserveSeq, y.ReserveSeq) })
	slices.SortFunc(a.Failed, func(x, y FailedKey) int { return cmp.Compare(x.Seq, y.Seq) })
	slices.SortFunc(a.Resolutions, func(x, y Resolution) int { return cmp.Compare(x.Seq, y.Seq) })
	ensure(&a.RuntimeRetries)
	ensure(&a.ReInvocations)
	ensure(&a.DuplicateEffects)
	ensure(&a.Interrupted)
	ensure(&a.Failed)
	ensure(&a.Resolutions)
	return &a
}

func anyAfter(seqs []uint64, from uint64) bool {
	return slices.ContainsFunc(seqs, func(s uint64) bool { return s > from })
}

// ensure makes a nil list an empty one, so JSON shows [] not null.
func ensure[T any](l *[]T) {
	if *l == nil {
		*l = []T{}
	}
}
