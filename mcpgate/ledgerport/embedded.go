package ledgerport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// embedded is the Ledger port over a ledger in this process: the same
// service the REST API calls, answered in the Go client's terms so that
// one decision path serves it and a ledgerd (the *client.Client itself).
type embedded struct{ ns *ledger.Namespace }

// NewLocal returns the Ledger port over one namespace of an in-process
// ledger.
func NewLocal(ns *ledger.Namespace) Ledger { return embedded{ns: ns} }

// Reserve answers as the client does: a reservation or a replay, an
// *client.ApprovalRequiredError for a call sent to approval, an
// *client.Error for a refusal.
func (l embedded) Reserve(ctx context.Context, r client.ReserveRequest) (*client.Reservation, error) {
	lease, wait, attempt := r.Lease.Milliseconds(), r.Wait.Milliseconds(), int64(max(r.Attempt, 1))
	req := ledger.ReserveRequest{IdempotencyKey: r.Key, ExecutionID: r.ExecutionID, Attempt: &attempt,
		Tool: r.Tool, Effect: string(r.Class), Idempotent: r.Idempotent, InputHash: r.InputHash, LeaseMS: &lease,
		WaitMS: &wait, ApprovalSummary: r.ApprovalSummary, Subjects: r.Subjects}
	if len(r.Input) > 0 {
		req.Input, req.InputHash = r.Input, ""
	}
	res, err := l.ns.Reserve(ctx, req)
	if err != nil {
		return nil, embeddedError("reserve", err)
	}
	receipt := client.ReceiptRef{Seq: res.Receipt.Seq, Hash: res.Receipt.Hash.String()}
	if res.Status == ledger.StatusApprovalRequired && res.Ask != nil {
		return nil, &client.ApprovalRequiredError{IdempotencyKey: res.IdempotencyKey, Seq: res.Ask.Seq,
			ExpiresAt: time.UnixMilli(int64(res.Ask.ExpiresAt)).UTC(), State: "pending", Receipt: receipt}
	}
	out := &client.Reservation{Status: res.Status, Key: res.IdempotencyKey, KeyGenerated: res.KeyGenerated,
		Token: res.Reservation, Attempt: res.Attempt, Takeover: res.Takeover, Retry: res.Retry,
		Outcome: res.Outcome, ExternalRef: res.ExternalRef, Receipt: receipt,
		Original: client.ReceiptRef{Seq: res.Original.Seq, Hash: res.Original.Hash.String()}, Erased: res.Erased}
	if res.LeaseExpiresAt > 0 {
		out.LeaseExpiresAt = time.UnixMilli(int64(res.LeaseExpiresAt))
	}
	if res.Result != "" {
		out.Result = json.RawMessage(res.Result)
	}
	if res.Approval != nil {
		out.Approval = &client.ApprovalUse{Seq: res.Approval.Seq, AskSeq: res.Approval.AskSeq}
	}
	return out, nil
}

func (l embedded) Commit(ctx context.Context, key, token string, cm client.Commit) (*client.CommitResult, error) {
	req := ledger.CommitRequest{IdempotencyKey: key, Reservation: token, Outcome: cm.Outcome, ExternalRef: cm.ExternalRef,
		Result: cm.Result}
	if cm.Failure != nil {
		req.Error = &ledger.FailureDetail{Code: cm.Failure.Code, Message: cm.Failure.Message, Retryable: cm.Failure.Retryable}
	}
	res, err := l.ns.Commit(ctx, req)
	if err != nil {
		return nil, embeddedError("commit", err)
	}
	return &client.CommitResult{Key: res.IdempotencyKey, Outcome: res.Outcome, Late: res.Late, Repeat: res.Replayed,
		Receipt: client.ReceiptRef{Seq: res.Receipt.Seq, Hash: res.Receipt.Hash.String()}}, nil
}

func (l embedded) Key(ctx context.Context, key string, history bool) (*client.KeyView, error) {
	v, err := l.ns.Key(ctx, key, history)
	if err != nil {
		return nil, embeddedError("read key", err)
	}
	out := &client.KeyView{Key: v.IdempotencyKey, State: string(v.State), Tool: v.Tool, Class: client.Class(v.Effect),
		Idempotent: v.Idempotent, InputHash: v.InputHash}
	if v.ExpiresAt != 0 {
		out.ExpiresAt = time.UnixMilli(int64(v.ExpiresAt)).UTC()
	}
	for i := range v.Receipts {
		r := &v.Receipts[i]
		out.Receipts = append(out.Receipts, client.KeyReceipt{Seq: r.Seq, Kind: r.Kind, ExecutionID: r.ExecutionID,
			Attempt: r.Attempt, Outcome: r.Outcome, ExternalRef: r.Value(chain.FieldExternalRef), ErrorCode: r.ErrorCode,
			Retryable: r.Retryable, LeaseExpiresAt: int64(r.LeaseExpiresAt), RefSeq: r.RefSeq,
			RecordedAt: int64(r.RecordedAt), Hash: r.Hash.String(), JSON: r.AppendJSON(nil)})
	}
	return out, nil
}

func (l embedded) Policy(ctx context.Context) (*client.PolicyState, error) {
	p, seq, err := l.ns.Policy(ctx)
	if err != nil {
		return nil, embeddedError("read the policy", err)
	}
	text, err := p.Canonical()
	if err != nil {
		return nil, fmt.Errorf("read the policy: %w", err)
	}
	return &client.PolicyState{Namespace: l.ns.Name(), Policy: json.RawMessage(text), Seq: seq}, nil
}

// AnswerAsMCPClient records the client's answer in-process: the embedded
// ledger has no tokens, so the asker's actor is empty and the answer's
// is "/mcp-client:<name>".
func (l embedded) AnswerAsMCPClient(ctx context.Context, seq uint64, decision client.Decision, clientName, note string) (*client.Approval, error) {
	_, _, err := l.ns.Answer(ctx, ledger.AnswerRequest{Seq: seq, Decision: string(decision), Note: note, MCPClient: clientName})
	if err != nil {
		return nil, embeddedError("answer", err)
	}
	return &client.Approval{Seq: seq}, nil
}

// Reconcile records a lookup's finding in-process, as the actor of the
// gateway's own reserves (the embedded ledger has no tokens: "").
func (l embedded) Reconcile(ctx context.Context, key string, r client.Reconciled) (*client.Reconciliation, error) {
	evidence, err := json.Marshal(map[string]any{"lookup": r.Lookup, "answer": r.Answer})
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	req := ledger.ReconcileRequest{IdempotencyKey: key, Outcome: r.Outcome, ExternalRef: r.ExternalRef, Result: r.Result,
		Evidence: evidence}
	if r.Failure != nil {
		req.Error = &ledger.FailureDetail{Code: r.Failure.Code, Message: r.Failure.Message}
	}
	res, err := l.ns.Reconcile(ctx, req)
	if err != nil {
		return nil, embeddedError("reconcile", err)
	}
	return &client.Reconciliation{Key: res.IdempotencyKey, State: string(res.State),
		Receipt: client.ReceiptRef{Seq: res.Receipt.Seq, Hash: res.Receipt.Hash.String()}}, nil
}

// DerivationKey answers from the namespace: its payload mode and its
// fingerprint key, which it keeps once read.
func (l embedded) DerivationKey(ctx context.Context) (*client.DerivationKey, error) {
	mode, _, err := l.ns.PayloadsNow(ctx)
	if err != nil {
		return nil, embeddedError("read the payload mode", err)
	}
	key, err := l.ns.FingerprintKey(ctx)
	if err != nil {
		return nil, embeddedError("read the derivation key", err)
	}
	return &client.DerivationKey{Payloads: string(mode), Key: key}, nil
}

// embeddedError turns the domain's errors into the client's: a contract
// refusal is an *client.Error with its code (Status 0: no HTTP went
// between), everything else means the ledger cannot be written.
func embeddedError(op string, err error) error {
	var e *ledger.Error
	if errors.As(err, &e) && e.Code != ledger.ECodeUnavailable && e.Code != ledger.ECodeInternal {
		return &client.Error{Code: e.Code, Message: e.Message, Details: e.Details}
	}
	return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
}
