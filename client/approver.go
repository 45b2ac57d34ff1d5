package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// This file is the approver's and the admin's side of SPEC §13: the
// namespace's policy, and the asks that await an answer.

// Policy is a namespace's gate policy. Each member of a rule is taken
// from the first rule matching the call's tool (and effect) that sets it;
// see SPEC §13. A zero Policy is the empty one, which gates nothing.
type Policy struct {
	Rules []PolicyRule `json:"rules,omitempty"`
	// SelfApproval is "deny" (the default) or "allow": whether the actor
	// that asked may answer its own ask.
	SelfApproval string `json:"self_approval,omitempty"`
}

// PolicyRule is one rule of a Policy.
type PolicyRule struct {
	Tool   string `json:"tool"`             // a glob: * matches any bytes, ? one
	Effect Class  `json:"effect,omitempty"` // matches only calls of this class
	// Approval "required" sends matching calls to approval.
	Approval string `json:"approval,omitempty"`
	// Approvers who may answer: "role:<role>", a token name, or
	// "mcp-client"; none means any approver or admin token.
	Approvers   []string `json:"approvers,omitempty"`
	ExpiresInMS int64    `json:"expires_in_ms,omitempty"` // how long an ask waits (default 1 h)
	// Deny refuses matching calls (ErrDeniedByPolicy); false set here
	// overrides a later rule's true.
	Deny *bool `json:"deny,omitempty"`
	// RepeatFailure "refuse" refuses an unchanged retry of a call that
	// failed within RepeatWindowMS (default 24 h).
	RepeatFailure  string `json:"repeat_failure,omitempty"`
	RepeatWindowMS int64  `json:"repeat_window_ms,omitempty"`
}

// PolicyState is a namespace's policy in force.
type PolicyState struct {
	Namespace string
	// Policy is the policy's JSON as the ledger holds it ({} when none);
	// json.Unmarshal it into a Policy.
	Policy json.RawMessage
	Seq    uint64 // the policy receipt that set it; 0 when none
	// Changed and Receipt are SetPolicy's: whether a policy receipt was
	// appended (a policy equal to the one in force appends nothing), and
	// which.
	Changed bool
	Receipt *ReceiptRef
}

type policyReply struct {
	Namespace string          `json:"namespace"`
	Policy    json.RawMessage `json:"policy"`
	Seq       uint64          `json:"seq"`
	Changed   bool            `json:"changed"`
	Receipt   *ReceiptRef     `json:"receipt"`
}

// policyPath is the policy route of the client's namespace, which is
// served under /v1/namespaces/{ns}, not /v1/ns/{ns}.
func (c *Client) policyPath() string {
	return "/v1/namespaces/" + url.PathEscape(c.Namespace()) + "/policy"
}

// Policy returns the policy in force in the client's namespace (a reader
// token suffices).
func (c *Client) Policy(ctx context.Context) (*PolicyState, error) {
	return c.policy(ctx, http.MethodGet, nil)
}

// SetPolicy sets the policy of the client's namespace (an admin token):
// policy is a Policy, a json.RawMessage, or anything that marshals to the
// policy's JSON. A policy that is not valid is ErrInvalidRequest with
// details.field naming the member.
func (c *Client) SetPolicy(ctx context.Context, policy any) (*PolicyState, error) {
	if raw, ok := policy.(json.RawMessage); ok && !json.Valid(raw) {
		return nil, errors.New("set policy: not valid JSON")
	}
	return c.policy(ctx, http.MethodPut, policy)
}

// policy gets (GET) or sets (PUT, body) the namespace's policy.
func (c *Client) policy(ctx context.Context, method string, body any) (*PolicyState, error) {
	var b policyReply
	if _, err := c.exchange(ctx, "policy", method, c.policyPath(), body, &b); err != nil {
		return nil, err
	}
	return &PolicyState{Namespace: b.Namespace, Policy: b.Policy, Seq: b.Seq, Changed: b.Changed, Receipt: b.Receipt}, nil
}

// Approval states.
const (
	ApprovalPending  = "pending"
	ApprovalApproved = "approved"
	ApprovalRejected = "rejected"
	ApprovalExpired  = "expired"
	ApprovalConsumed = "consumed"
)

// Decision is an approver's answer.
type Decision string

// Decisions.
const (
	Approve Decision = "approve"
	Reject  Decision = "reject"
)

// Approval is an ask and what became of it.
type Approval struct {
	Seq            uint64 // the ask's seq
	IdempotencyKey string
	ExecutionID    string
	Attempt        uint64
	Tool           string
	Class          Class
	Idempotent     bool
	InputHash      string
	Summary        string // the requester's approval_summary
	Actor          string // who asked
	AskedAt        time.Time
	ExpiresAt      time.Time
	State          string // ApprovalPending, ApprovalApproved, …
	Answer         *Answer
	ConsumedBy     *Consumption
	// Input is the asked input, shown by Client.Approval to approver and
	// admin tokens (nil otherwise, and once the ledger deleted it);
	// InputVerified says its fingerprint equals InputHash. InputShown
	// says the ledger answered with the input, even a deleted one: the
	// token may see it.
	Input         json.RawMessage
	InputVerified bool
	InputShown    bool
	// Repeat is set by Client.Answer when the same decision had been
	// recorded before: nothing was appended now.
	Repeat bool
}

// Answer is an approver's recorded answer to an ask.
type Answer struct {
	Seq        uint64 // the approval receipt
	Decision   Decision
	Actor      string
	Role       string // the approver's token role
	Note       string
	RecordedAt time.Time
}

// Consumption names the reserve that consumed an approval.
type Consumption struct {
	Seq         uint64
	ExecutionID string
	Attempt     uint64
}

type approvalJSON struct {
	Seq            uint64 `json:"seq"`
	IdempotencyKey string `json:"idempotency_key"`
	ExecutionID    string `json:"execution_id"`
	Attempt        uint64 `json:"attempt"`
	Tool           string `json:"tool"`
	Effect         Class  `json:"effect"`
	Idempotent     bool   `json:"idempotent"`
	InputHash      string `json:"input_hash"`
	Summary        string `json:"summary"`
	Actor          string `json:"actor"`
	AskedAt        int64  `json:"asked_at"`
	ExpiresAt      int64  `json:"expires_at"`
	State          string `json:"state"`
	Answer         *struct {
		Seq        uint64   `json:"seq"`
		Decision   Decision `json:"decision"`
		Actor      string   `json:"actor"`
		Role       string   `json:"role"`
		Note       string   `json:"note"`
		RecordedAt int64    `json:"recorded_at"`
	} `json:"answer"`
	ConsumedBy *struct {
		Seq         uint64 `json:"seq"`
		ExecutionID string `json:"execution_id"`
		Attempt     uint64 `json:"attempt"`
	} `json:"consumed_by"`
	Input         json.RawMessage `json:"input"`
	InputVerified bool            `json:"input_verified"`
}

func (j *approvalJSON) approval() Approval {
	a := Approval{Seq: j.Seq, IdempotencyKey: j.IdempotencyKey, ExecutionID: j.ExecutionID, Attempt: j.Attempt,
		Tool: j.Tool, Class: j.Effect, Idempotent: j.Idempotent, InputHash: j.InputHash, Summary: j.Summary,
		Actor: j.Actor, AskedAt: unixMilli(j.AskedAt), ExpiresAt: unixMilli(j.ExpiresAt), State: j.State,
		InputVerified: j.InputVerified, InputShown: j.Input != nil}
	if len(j.Input) > 0 && string(j.Input) != "null" {
		a.Input = j.Input
	}
	if an := j.Answer; an != nil {
		a.Answer = &Answer{Seq: an.Seq, Decision: an.Decision, Actor: an.Actor, Role: an.Role, Note: an.Note,
			RecordedAt: unixMilli(an.RecordedAt)}
	}
	if cb := j.ConsumedBy; cb != nil {
		a.ConsumedBy = &Consumption{Seq: cb.Seq, ExecutionID: cb.ExecutionID, Attempt: cb.Attempt}
	}
	return a
}

// unixMilli is the time of unix milliseconds, zero for 0.
func unixMilli(ms int64) time.Time {
	if ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// Approvals lists the asks of the client's namespace in seq order, after
// the ask seq after, at most limit (0: the ledger's default), in the
// given state ("" for every state). nextAfter is the after of the next
// page, 0 when there is none.
func (c *Client) Approvals(ctx context.Context, state string, after uint64, limit int) (list []Approval, nextAfter uint64, err error) {
	q := url.Values{}
	if state != "" {
		q.Set("state", state)
	}
	if after > 0 {
		q.Set("after", strconv.FormatUint(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/v1/approvals"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var b struct {
		Approvals []approvalJSON `json:"approvals"`
		NextAfter *uint64        `json:"next_after"`
	}
	if _, err := c.exchange(ctx, "approvals", http.MethodGet, c.route(path), nil, &b); err != nil {
		return nil, 0, err
	}
	list = make([]Approval, 0, len(b.Approvals))
	for i := range b.Approvals {
		list = append(list, b.Approvals[i].approval())
	}
	if b.NextAfter != nil {
		nextAfter = *b.NextAfter
	}
	return list, nextAfter, nil
}

// Approval returns the ask at seq, with its input when the token may see
// it. Errors: ErrUnknownApproval.
func (c *Client) Approval(ctx context.Context, seq uint64) (*Approval, error) {
	a, _, err := c.approval(ctx, http.MethodGet, seq, "", nil)
	return a, err
}

// Answer records decision about the ask at seq, with an optional note
// (at most 1024 bytes), with an approver or admin token the policy's rule
// lists. The same decision again returns the recorded answer with Repeat
// set. Errors: ErrAlreadyAnswered, ErrApprovalExpired, ErrSelfApproval,
// ErrForbidden, ErrUnknownApproval.
func (c *Client) Answer(ctx context.Context, seq uint64, decision Decision, note string) (*Approval, error) {
	return c.answer(ctx, seq, decision, "", answerBody{Decision: decision, Note: note})
}

// answerBody is the body of an answer to an ask; Client names the
// relaying MCP client (AnswerAsMCPClient).
type answerBody struct {
	Decision Decision `json:"decision"`
	Client   string   `json:"client,omitempty"`
	Note     string   `json:"note,omitempty"`
}

// answer posts body to the ask at seq's route, suffix appended.
func (c *Client) answer(ctx context.Context, seq uint64, decision Decision, suffix string, body answerBody) (*Approval, error) {
	if decision != Approve && decision != Reject {
		return nil, fmt.Errorf("answer ask %d: decision %q is not approve or reject", seq, decision)
	}
	a, res, err := c.approval(ctx, http.MethodPost, seq, suffix, body)
	if err != nil {
		return nil, err
	}
	a.Repeat = res.status == http.StatusOK
	return a, nil
}

// approval sends a request to the ask at seq's route, suffix appended,
// and decodes the ask it answers with.
func (c *Client) approval(ctx context.Context, method string, seq uint64, suffix string, body any) (*Approval, *response, error) {
	var b approvalJSON
	res, err := c.exchange(ctx, "approval", method, c.route("/v1/approvals/"+strconv.FormatUint(seq, 10)+suffix), body, &b)
	if err != nil {
		return nil, nil, err
	}
	a := b.approval()
	return &a, res, nil
}

// AnswerAsMCPClient relays the answer of an agent's own MCP client to the
// ask at seq (POST /v1/approvals/{seq}/mcp-client, SPEC §13 "On the MCP
// path"): ledger-mcp asked its client, and clientName is the client's
// clientInfo.name. The ledger accepts it only from the token that asked
// (the gateway's own), when the rule's approvers list "mcp-client" and
// the policy allows self-approval, and records it with actor
// "<asker>/mcp-client:<clientName>". Errors: as Answer's.
func (c *Client) AnswerAsMCPClient(ctx context.Context, seq uint64, decision Decision, clientName, note string) (*Approval, error) {
	return c.answer(ctx, seq, decision, "/mcp-client", answerBody{Decision: decision, Client: clientName, Note: note})
}
