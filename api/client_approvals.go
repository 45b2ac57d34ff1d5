package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// The client side of SPEC §13 that ledgerctl uses: a namespace's policy
// and the approvals of its asks.

// PolicyView is a namespace's policy as GET and PUT
// /v1/namespaces/{ns}/policy answer it.
type PolicyView struct {
	Namespace string          `json:"namespace"`
	Policy    json.RawMessage `json:"policy"` // {} when none
	Seq       uint64          `json:"seq"`    // the policy receipt in force; 0 when none
	// PUT only: whether a policy receipt was appended (a policy equal to
	// the one in force appends nothing), and which.
	Changed *bool            `json:"changed,omitempty"`
	Receipt *ApprovalReceipt `json:"receipt,omitempty"`
}

// ApprovalReceipt names a receipt in the approval answers.
type ApprovalReceipt struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

// ApprovalView is an ask and what became of it, as /v1/approvals answers.
type ApprovalView struct {
	Seq            uint64            `json:"seq"`
	IdempotencyKey string            `json:"idempotency_key"`
	ExecutionID    string            `json:"execution_id"`
	Attempt        uint64            `json:"attempt"`
	Tool           string            `json:"tool"`
	Effect         string            `json:"effect"`
	Idempotent     bool              `json:"idempotent"`
	InputHash      string            `json:"input_hash"`
	Summary        string            `json:"summary"`
	Actor          string            `json:"actor"`
	AskedAt        uint64            `json:"asked_at"`
	ExpiresAt      uint64            `json:"expires_at"`
	State          string            `json:"state"` // pending, approved, rejected, expired or consumed
	Answer         *ApprovalAnswer   `json:"answer"`
	ConsumedBy     *ApprovalConsumer `json:"consumed_by"`
	// One ask's view only: the asked input (for approver and admin
	// tokens; null once deleted) and whether it matches InputHash.
	Input         json.RawMessage `json:"input,omitempty"`
	InputVerified *bool           `json:"input_verified,omitempty"`
}

// ApprovalConsumer is the reserve that consumed an approval.
type ApprovalConsumer struct {
	Seq         uint64 `json:"seq"`
	ExecutionID string `json:"execution_id"`
	Attempt     uint64 `json:"attempt"`
}

// ApprovalAnswer is an approver's recorded answer.
type ApprovalAnswer struct {
	Seq        uint64 `json:"seq"`
	Decision   string `json:"decision"` // approve or reject
	Actor      string `json:"actor"`
	Role       string `json:"role"`
	Note       string `json:"note"`
	RecordedAt uint64 `json:"recorded_at"`
}

// policyPath is the policy route of namespace ns, which is not served
// under /v1/ns/{ns}.
func policyPath(ns string) string {
	if ns == "" {
		ns = ledger.DefaultNamespace
	}
	return "/v1/namespaces/" + url.PathEscape(ns) + "/policy"
}

// unprefixed returns a copy of c whose paths no namespace prefixes.
func (c *Client) unprefixed() *Client {
	root := *c
	root.Namespace = ""
	return &root
}

// Policy returns the policy in force in namespace ns (a reader token).
func (c *Client) Policy(ctx context.Context, ns string) (*PolicyView, error) {
	var b PolicyView
	if err := c.unprefixed().do(ctx, http.MethodGet, policyPath(ns), nil, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// SetPolicy sets the policy of namespace ns to the JSON object policy (an
// admin token).
func (c *Client) SetPolicy(ctx context.Context, ns string, policy json.RawMessage) (*PolicyView, error) {
	var b PolicyView
	if err := c.unprefixed().do(ctx, http.MethodPut, policyPath(ns), policy, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// Approvals lists one page of the asks of the client's namespace by seq:
// those in state (all when empty) after the ask seq after, at most limit
// (0: the server's default). next is the after of the next page, nil on
// the last.
func (c *Client) Approvals(ctx context.Context, state string, after uint64, limit int) (list []ApprovalView, next *uint64, err error) {
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
		Approvals []ApprovalView `json:"approvals"`
		NextAfter *uint64        `json:"next_after"`
	}
	if err := c.do(ctx, http.MethodGet, path, nil, &b); err != nil {
		return nil, nil, err
	}
	return b.Approvals, b.NextAfter, nil
}

// Approval returns the ask at seq, with its input when the token may see
// it.
func (c *Client) Approval(ctx context.Context, seq uint64) (*ApprovalView, error) {
	var b ApprovalView
	if err := c.do(ctx, http.MethodGet, "/v1/approvals/"+strconv.FormatUint(seq, 10), nil, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// AnswerApproval records decision ("approve" or "reject") and note about
// the ask at seq (an approver or admin token) and returns the ask with its
// answer.
func (c *Client) AnswerApproval(ctx context.Context, seq uint64, decision, note string) (*ApprovalView, error) {
	if decision != "approve" && decision != "reject" {
		return nil, fmt.Errorf("answer ask %d: decision %q is not approve or reject", seq, decision)
	}
	body := struct {
		Decision string `json:"decision"`
		Note     string `json:"note,omitempty"`
	}{decision, note}
	var b ApprovalView
	if err := c.do(ctx, http.MethodPost, "/v1/approvals/"+strconv.FormatUint(seq, 10), body, &b); err != nil {
		return nil, err
	}
	return &b, nil
}
