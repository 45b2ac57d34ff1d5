package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/gowebpki/jcs"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/internal/metrics"
)

// Reconciling an unknown outcome (SPEC §15): the actor of an interrupted
// reserve asks the downstream whether the effect happened and records the
// answer, with the evidence, as a reconcile receipt. A reconcile
// finalizes a key wherever a resolve does.

// Evidence bounds (SPEC §15).
const (
	// MaxEvidenceAnswer bounds the lookup's answer, as compact JSON.
	MaxEvidenceAnswer = 16 << 10
	// MaxEvidenceLookup bounds the name of the lookup, in characters.
	MaxEvidenceLookup = 256
)

// StatusReconciled is the body status of a 201 reconcile.
const StatusReconciled = "reconciled"

var reconciliations = metrics.CounterVec("ledger_reconciliations_total",
	"Reconcile requests (SPEC §15) by outcome: succeeded, not_applied, or the error code of a refusal.", "outcome")

// ReconcileRequest ends an interrupted key from a downstream's answer.
type ReconcileRequest struct {
	IdempotencyKey string
	Outcome        string // succeeded or not_applied
	ExternalRef    string // required with succeeded
	Result         json.RawMessage
	Error          *FailureDetail // required with not_applied
	// Evidence is {"lookup": "<what was asked>", "answer": <its answer>}.
	Evidence json.RawMessage
	Actor    string
	// Admin is true when the caller holds an admin token, or the ledger
	// has no tokens: it may reconcile another actor's reserve.
	Admin bool
}

// ReconcileResult is the outcome of a successful Reconcile.
type ReconcileResult struct {
	IdempotencyKey string
	State          State
	Receipt        ReceiptRef
}

// ReconciledRef names the reconcile receipt a late commit follows.
type ReconciledRef struct {
	Seq         uint64
	Hash        chain.Hash
	Outcome     string
	ExternalRef string
}

// Reconcile records a downstream's answer about an interrupted key
// (SPEC §15). Errors: *Error with ECodeInvalidRequest, ECodeUnknownKey,
// ECodeReconcileNotAllowed, ECodeNotInterrupted or ECodeReconcileTooEarly;
// ErrUnavailable.
func (n *Namespace) Reconcile(ctx context.Context, req ReconcileRequest) (*ReconcileResult, error) {
	res, err := n.reconcile(ctx, req)
	label := ErrorCode(err)
	if err == nil {
		label = req.Outcome
	}
	reconciliations.WithLabelValues(label).Inc()
	return res, err
}

func (n *Namespace) reconcile(ctx context.Context, req ReconcileRequest) (*ReconcileResult, error) {
	if err := checkKeyPath(req.IdempotencyKey); err != nil {
		return nil, err
	}
	o, note, err := validateReconcile(&req)
	if err != nil {
		return nil, err
	}
	var res *ReconcileResult
	err = n.submit(ctx, req.IdempotencyKey, func(ctx context.Context, t *batchTx) error {
		var err error
		res, err = decideReconcile(ctx, t, t.Now(), &req, note, &o)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// validateReconcile checks a reconcile's outcome and evidence and returns
// the outcome and the receipt's note: the evidence in RFC 8785 form.
func validateReconcile(req *ReconcileRequest) (outcomeArgs, string, error) {
	switch req.Outcome {
	case chain.OutcomeSucceeded:
		if req.ExternalRef == "" {
			return outcomeArgs{}, "", Invalid("external_ref", "external_ref is required with outcome succeeded: it is what the lookup found")
		}
	case chain.OutcomeNotApplied:
	default:
		return outcomeArgs{}, "", Invalid("outcome",
			"outcome must be succeeded or not_applied: any other answer records nothing and the key waits for a person")
	}
	o, err := validateOutcome(req.Outcome, req.ExternalRef, req.Result, req.Error)
	if err != nil {
		return o, "", err
	}
	note, err := evidenceNote(req.Evidence)
	return o, note, err
}

// evidenceNote checks the evidence object and returns its RFC 8785 text.
func evidenceNote(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", Invalid("evidence", "evidence is required: {\"lookup\", \"answer\"}")
	}
	var ev struct {
		Lookup *string          `json:"lookup"`
		Answer *json.RawMessage `json:"answer"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return "", Invalid("evidence."+strings.Trim(name, `"`), "evidence has only lookup and answer")
		}
		return "", Invalid("evidence", "evidence must be an object {\"lookup\": string, \"answer\": any JSON}")
	}
	switch {
	case ev.Lookup == nil || *ev.Lookup == "" || !utf8.ValidString(*ev.Lookup) ||
		utf8.RuneCountInString(*ev.Lookup) > MaxEvidenceLookup:
		return "", Invalid("evidence.lookup", "evidence.lookup is required: 1–%d characters naming what was asked", MaxEvidenceLookup)
	case ev.Answer == nil:
		return "", Invalid("evidence.answer", "evidence.answer is required: the lookup's answer")
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, *ev.Answer); err != nil || !utf8.Valid(buf.Bytes()) {
		return "", Invalid("evidence.answer", "evidence.answer is not valid JSON")
	}
	if buf.Len() > MaxEvidenceAnswer {
		return "", Invalid("evidence.answer", "evidence.answer must be at most %d bytes as compact JSON", MaxEvidenceAnswer)
	}
	if err := CheckIJSON(buf.Bytes()); err != nil {
		return "", Invalid("evidence.answer", "evidence.answer must be I-JSON (RFC 7493): %v", err)
	}
	lookup, _ := json.Marshal(*ev.Lookup) // a valid string: cannot fail
	obj := append(append(append([]byte(`{"lookup":`), lookup...), `,"answer":`...), buf.Bytes()...)
	c, err := jcs.Transform(append(obj, '}'))
	if err != nil {
		return "", Invalid("evidence", "evidence does not canonicalize: %v", err)
	}
	return string(c), nil
}

// decideReconcile applies SPEC §15 to an interrupted key at time now.
func decideReconcile(ctx context.Context, s *batchTx, now uint64, req *ReconcileRequest, note string, o *outcomeArgs) (*ReconcileResult, error) {
	k, found, err := s.Key(ctx, req.IdempotencyKey)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, Errorf(ECodeUnknownKey, "no such idempotency key")
	}
	p, _, err := s.policy(ctx)
	if err != nil {
		return nil, err
	}
	g := p.GateFor(k.Tool, k.Effect)
	if !g.Reconcile {
		return nil, &Error{Code: ECodeReconcileNotAllowed,
			Message: "no rule of the namespace's policy allows reconciling this tool",
			Details: map[string]any{"tool": k.Tool}}
	}
	var final chain.Receipt
	if k.finalized() {
		if final, err = s.Receipt(ctx, k.FinalSeq); err != nil {
			return nil, err
		}
	}
	if st := StateOf(&k, &final, now); st != StateInterrupted {
		return nil, &Error{Code: ECodeNotInterrupted, Message: fmt.Sprintf("key is %s, not interrupted", st),
			Details: map[string]any{"state": string(st)}}
	}
	reserve, err := s.Receipt(ctx, k.ReserveSeq)
	if err != nil {
		return nil, err
	}
	if reserve.Actor != req.Actor && !req.Admin {
		return nil, &Error{Code: ECodeReconcileNotAllowed,
			Message: "only the actor of the interrupted reserve (or an admin) may reconcile it",
			Details: map[string]any{"reservation": map[string]any{"seq": reserve.Seq}}}
	}
	if o.outcome == chain.OutcomeNotApplied {
		if notBefore := reserve.LeaseExpiresAt + g.SettleMS; now < notBefore {
			wait := notBefore - now
			return nil, &Error{Code: ECodeReconcileTooEarly,
				Message:    "the original call may still land: not_applied is accepted only settle_ms after the lease ended",
				Details:    map[string]any{"not_before": notBefore, "settle_ms": g.SettleMS},
				RetryAfter: MsDuration((wait + 999) / 1000 * 1000)}
		}
	}
	r, err := appendOutcome(ctx, s, now, &k, &reserve, reserve.Seq, chain.KindReconcile, req.Actor, note, o)
	if err != nil {
		return nil, err
	}
	return &ReconcileResult{IdempotencyKey: k.Key, State: outcomeState(r.Outcome), Receipt: refOf(&r)}, nil
}

// lateCommit records the original call's commit of a reservation that a
// reconcile finalized (SPEC §15): appended, the key's state unchanged. A
// repeat of the same late commit appends nothing; another one is refused.
func lateCommit(ctx context.Context, s *batchTx, now uint64, k *KeyRecord, reserve, reconciled *chain.Receipt,
	actor string, o *outcomeArgs) (*CommitResult, error) {
	shown := *reconciled
	if err := s.shown(ctx, &shown); err != nil {
		return nil, err
	}
	earlier := &ReconciledRef{Seq: reconciled.Seq, Hash: reconciled.Hash, Outcome: reconciled.Outcome,
		ExternalRef: shown.Value(chain.FieldExternalRef)}
	hist, err := s.KeyHistory(ctx, k.Key, reconciled.Seq+1)
	if err != nil {
		return nil, err
	}
	for i := range hist {
		if c := &hist[i]; c.Kind == chain.KindCommit && c.RefSeq == reserve.Seq {
			if err := s.shown(ctx, c); err != nil {
				return nil, err
			}
			if !sameOutcome(c, o) {
				return nil, &Error{Code: ECodeAlreadyFinalized,
					Message: "this reservation already has a different recorded late commit",
					Details: map[string]any{"final": map[string]any{"seq": c.Seq, "kind": c.Kind, "outcome": c.Outcome}}}
			}
			return &CommitResult{IdempotencyKey: k.Key, Outcome: c.Outcome, Receipt: refOf(c), Late: true,
				Replayed: true, ReconciledEarlier: earlier}, nil
		}
	}
	r, err := s.append(ctx, outcomeReceipt(now, k, reserve, reserve.Seq, chain.KindCommit, actor, "", o))
	if err != nil {
		return nil, err
	}
	return &CommitResult{IdempotencyKey: k.Key, Outcome: r.Outcome, Receipt: refOf(&r),
		Late: now >= reserve.LeaseExpiresAt, ReconciledEarlier: earlier}, nil
}
