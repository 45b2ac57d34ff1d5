package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
	"github.com/effect-ledger/effect-ledger/verify"
)

// server is a ledgerd reached with the client module, answering in the
// ledger's own types: ledgerctl's one adapter to the API. Its chain reads
// are verify.Server's, so the verifier and the read commands decode the
// same receipts; errors the server answers are *verify.ServerError
// ("server: 404 unknown_key: …").
type server struct {
	verify.Server
	base, token string // to reach the same server in another namespace
}

// newServer returns the server at base in namespace ns.
func newServer(base, token, ns string) (*server, error) {
	c, err := client.New(base, client.WithToken(token), client.WithNamespace(ns))
	if err != nil {
		return nil, err
	}
	return &server{Server: verify.Server{Client: c}, base: base, token: token}, nil
}

// in returns the same server in namespace ns.
func (s *server) in(ns string) (*server, error) { return newServer(s.base, s.token, ns) }

// Close does nothing: a server holds no resources.
func (*server) Close() error { return nil }

// verifier of a server: the server does not say which tokens are admins,
// so a reconcile by another actor than its reserve's is not reported.
func (s *server) verifier(_ context.Context, opts verify.Opts) (*verify.Verifier, error) {
	return verify.NewRemote(s.Server, opts), nil
}

// Head returns the chain head.
func (s *server) Head(ctx context.Context) (ledger.Head, error) {
	ref, err := s.Client.Head(ctx)
	if err != nil {
		return ledger.Head{}, verify.ServerErr(err)
	}
	h, err := chain.ParseHash(ref.Hash)
	if err != nil {
		return ledger.Head{}, fmt.Errorf("head: %w", err)
	}
	return ledger.Head{Seq: ref.Seq, Hash: h}, nil
}

// Key returns a key's state, its expiry and the current generation's
// receipts (with history, every receipt of the key).
func (s *server) Key(ctx context.Context, key string, history bool) (*ledger.KeyView, error) {
	v, err := s.Client.Key(ctx, key, history)
	if err != nil {
		return nil, verify.ServerErr(err)
	}
	out := &ledger.KeyView{IdempotencyKey: v.Key, State: ledger.State(v.State), Tool: v.Tool, Effect: string(v.Class),
		Idempotent: v.Idempotent, InputHash: v.InputHash, ExpiresAt: unixMS(v.ExpiresAt)}
	if v.Receipts != nil {
		out.Receipts = make([]chain.Receipt, len(v.Receipts))
	}
	for i := range v.Receipts {
		if err := json.Unmarshal(v.Receipts[i].JSON, &out.Receipts[i]); err != nil {
			return nil, fmt.Errorf("key %s: decode receipt: %w", key, err)
		}
	}
	return out, nil
}

// key is the current generation of a key, for prove.
func (s *server) key(ctx context.Context, key string) (*ledger.KeyView, error) {
	return s.Key(ctx, key, false)
}

// checkpoint returns the latest signed checkpoint note.
func (s *server) checkpoint(ctx context.Context) ([]byte, error) {
	note, err := s.Client.Checkpoint(ctx)
	return note, verify.ServerErr(err)
}

// portable returns receipt seq with its inclusion proof; with erasedBy,
// and the proof of its fields' erasure (an admin token's request).
func (s *server) portable(ctx context.Context, seq uint64, erasedBy bool) (*tlog.PortableReceipt, error) {
	proof := s.Client.ReceiptProof
	if erasedBy {
		proof = s.Client.ReceiptProofErasedBy
	}
	raw, err := proof(ctx, seq)
	if err != nil {
		return nil, verify.ServerErr(err)
	}
	var p tlog.PortableReceipt
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("receipt proof %d: decode response: %w", seq, err)
	}
	return &p, nil
}

// firstCheckpointCovering returns the checkpoint a key receipt at seq is
// proven under in the server's portable receipts (the first that covers
// it: SPEC §9.2), nil if none (verify.Covering).
func (s *server) firstCheckpointCovering(ctx context.Context, seq int64) (*tlog.Signed, error) {
	p, err := s.portable(ctx, uint64(seq), false)
	if err != nil {
		return nil, err
	}
	for _, k := range p.Keys {
		if k.Receipt.Seq == uint64(seq) {
			c, err := tlog.ParseCheckpoint(tlog.NoteText([]byte(k.Checkpoint)))
			if err != nil {
				return nil, fmt.Errorf("receipt proof %d: %w", seq, err)
			}
			return &tlog.Signed{Size: c.Size, Root: c.Root, Note: k.Checkpoint}, nil
		}
	}
	return nil, nil
}

// ConsistencyProof returns the proof between two checkpointed sizes
// (verify.ConsistencyProver).
func (s *server) ConsistencyProof(ctx context.Context, from, to int64) ([]tlog.Hash, error) {
	raw, err := s.Client.ConsistencyProof(ctx, from, to)
	if err != nil {
		return nil, verify.ServerErr(err)
	}
	var c tlog.ConsistencyProof
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("consistency proof: decode response: %w", err)
	}
	if c.From != from || c.To != to {
		return nil, errors.New("the server answered a different consistency proof")
	}
	return tlog.FromHex(c.Hashes), nil
}

// resolve records an operator's decision about an interrupted key.
func (s *server) resolve(ctx context.Context, key string, r client.Resolution) (*ledger.ResolveResult, error) {
	res, err := s.Client.Resolve(ctx, key, r)
	if err != nil {
		return nil, verify.ServerErr(err)
	}
	h, err := chain.ParseHash(res.Receipt.Hash)
	if err != nil {
		return nil, fmt.Errorf("resolve: %w", err)
	}
	return &ledger.ResolveResult{IdempotencyKey: res.Key, State: ledger.State(res.State),
		Receipt: ledger.ReceiptRef{Seq: res.Receipt.Seq, Hash: h}}, nil
}

// createNamespace creates namespace name with settings st and returns it
// with its empty head.
func (s *server) createNamespace(ctx context.Context, name string, st ledger.NamespaceSettings) (ledger.NamespaceInfo, error) {
	var opts []client.NamespaceOption
	if st.Payloads != "" {
		opts = append(opts, client.WithPayloads(string(st.Payloads)))
	}
	n, err := s.Client.CreateNamespace(ctx, name, st.KeyTTL, opts...)
	if err != nil {
		return ledger.NamespaceInfo{}, verify.ServerErr(err)
	}
	return namespaceInfo(*n)
}

// namespaces lists the namespaces the token may see, with their heads.
func (s *server) namespaces(ctx context.Context) ([]ledger.NamespaceInfo, error) {
	list, err := s.Client.Namespaces(ctx)
	if err != nil {
		return nil, verify.ServerErr(err)
	}
	out := make([]ledger.NamespaceInfo, 0, len(list))
	for _, n := range list {
		info, err := namespaceInfo(n)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

func namespaceInfo(n client.NamespaceInfo) (ledger.NamespaceInfo, error) {
	h, err := chain.ParseHash(n.Head.Hash)
	if err != nil {
		return ledger.NamespaceInfo{}, fmt.Errorf("namespace %s: head: %w", n.Name, err)
	}
	return ledger.NamespaceInfo{Name: n.Name, Head: ledger.Head{Seq: n.Head.Seq, Hash: h}, KeyTTL: n.KeyTTLMS,
		Payloads: ledger.PayloadMode(n.Payloads), SwitchedAt: n.CommittedAfter}, nil
}

// unixMS is t in unix milliseconds, 0 for the zero time.
func unixMS(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(t.UnixMilli())
}

// approvalView is an ask as the API sends it, which --json prints.
func approvalView(a *client.Approval) api.ApprovalView {
	v := api.ApprovalView{Seq: a.Seq, IdempotencyKey: a.IdempotencyKey, ExecutionID: a.ExecutionID, Attempt: a.Attempt,
		Tool: a.Tool, Effect: string(a.Class), Idempotent: a.Idempotent, InputHash: a.InputHash, Summary: a.Summary,
		Actor: a.Actor, AskedAt: unixMS(a.AskedAt), ExpiresAt: unixMS(a.ExpiresAt), State: a.State}
	if an := a.Answer; an != nil {
		v.Answer = &api.ApprovalAnswer{Seq: an.Seq, Decision: string(an.Decision), Actor: an.Actor, Role: an.Role,
			Note: an.Note, RecordedAt: unixMS(an.RecordedAt)}
	}
	if cb := a.ConsumedBy; cb != nil {
		v.ConsumedBy = &api.ApprovalConsumer{Seq: cb.Seq, ExecutionID: cb.ExecutionID, Attempt: cb.Attempt}
	}
	if a.InputShown {
		v.Input = a.Input
		if v.Input == nil {
			v.Input = json.RawMessage("null")
		}
		ok := a.InputVerified
		v.InputVerified = &ok
	}
	return v
}

// approvals lists one page of the asks by seq; next is nil on the last.
func (s *server) approvals(ctx context.Context, state string, after uint64, limit int) ([]api.ApprovalView, *uint64, error) {
	list, next, err := s.Client.Approvals(ctx, state, after, limit)
	if err != nil {
		return nil, nil, verify.ServerErr(err)
	}
	out := make([]api.ApprovalView, 0, len(list))
	for i := range list {
		out = append(out, approvalView(&list[i]))
	}
	if next == 0 {
		return out, nil, nil
	}
	return out, &next, nil
}

// approval returns the ask at seq, with its input when the token may
// see it.
func (s *server) approval(ctx context.Context, seq uint64) (*api.ApprovalView, error) {
	a, err := s.Client.Approval(ctx, seq)
	if err != nil {
		return nil, verify.ServerErr(err)
	}
	v := approvalView(a)
	return &v, nil
}

// answer records decision ("approve" or "reject") and note about the
// ask at seq.
func (s *server) answer(ctx context.Context, seq uint64, decision, note string) (*api.ApprovalView, error) {
	a, err := s.Client.Answer(ctx, seq, client.Decision(decision), note)
	if err != nil {
		return nil, verify.ServerErr(err)
	}
	v := approvalView(a)
	return &v, nil
}

// policyJSON is a namespace's policy as --json prints it: GET's answer,
// and PUT's with whether a policy receipt was appended, and which.
type policyJSON struct {
	Namespace string             `json:"namespace"`
	Policy    json.RawMessage    `json:"policy"` // {} when none
	Seq       uint64             `json:"seq"`    // the policy receipt in force; 0 when none
	Changed   *bool              `json:"changed,omitempty"`
	Receipt   *client.ReceiptRef `json:"receipt,omitempty"`
}

// policy returns the policy in force in the server's namespace.
func (s *server) policy(ctx context.Context) (*policyJSON, error) {
	p, err := s.Client.Policy(ctx)
	if err != nil {
		return nil, verify.ServerErr(err)
	}
	return &policyJSON{Namespace: p.Namespace, Policy: p.Policy, Seq: p.Seq}, nil
}

// setPolicy sets the policy of the server's namespace to the JSON object
// policy.
func (s *server) setPolicy(ctx context.Context, policy json.RawMessage) (*policyJSON, error) {
	p, err := s.Client.SetPolicy(ctx, policy)
	if err != nil {
		return nil, verify.ServerErr(err)
	}
	changed := p.Changed
	return &policyJSON{Namespace: p.Namespace, Policy: p.Policy, Seq: p.Seq, Changed: &changed, Receipt: p.Receipt}, nil
}
