package api

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/verify"
)

// The routes of SPEC §13: a namespace's policy, its asks and their
// answers. Shapes: docs/design/approvals.md.

// approvalRequiredBody is the 202 of a reserve the policy holds for a
// person.
type approvalRequiredBody struct {
	Status         string     `json:"status"`
	IdempotencyKey string     `json:"idempotency_key"`
	KeyGenerated   bool       `json:"key_generated"`
	Approval       askJSON    `json:"approval"`
	Receipt        receiptRef `json:"receipt"`
}

// askJSON names a pending ask.
type askJSON struct {
	Seq       uint64 `json:"seq"`
	ExpiresAt uint64 `json:"expires_at"`
	State     string `json:"state"`
}

// consumedJSON names the approval a 201 reserve consumed.
type consumedJSON struct {
	Seq    uint64 `json:"seq"`
	AskSeq uint64 `json:"ask_seq"`
}

// changedOf reads a reserve's "changed" member (SPEC §13).
func changedOf(o *object) *ledger.Changed {
	return member(o, "changed", func(c *object) *ledger.Changed {
		return &ledger.Changed{ContextHash: c.str("context_hash"), Component: c.str("component"), Strategy: c.str("strategy")}
	})
}

// ApprovalView is an ask and what became of it, as /v1/approvals answers.
type ApprovalView struct {
	Seq            uint64 `json:"seq"`
	IdempotencyKey string `json:"idempotency_key"`
	ExecutionID    string `json:"execution_id"`
	Attempt        uint64 `json:"attempt"`
	Tool           string `json:"tool"`
	Effect         string `json:"effect"`
	Idempotent     bool   `json:"idempotent"`
	InputHash      string `json:"input_hash"`
	Summary        string `json:"summary"`
	// Erased: {"summary": seq of the erase receipt} once the ask's
	// summary is erased (SPEC §14's one shape).
	Erased     map[string]uint64 `json:"erased,omitempty"`
	Actor      string            `json:"actor"`
	AskedAt    uint64            `json:"asked_at"`
	ExpiresAt  uint64            `json:"expires_at"`
	State      string            `json:"state"` // pending, approved, rejected, expired or consumed
	Answer     *ApprovalAnswer   `json:"answer"`
	ConsumedBy *ApprovalConsumer `json:"consumed_by"`
	// One ask's view only: the asked input (for approver and admin
	// tokens; null once deleted) and whether it matches InputHash.
	Input         json.RawMessage `json:"input,omitempty"`
	InputVerified *bool           `json:"input_verified,omitempty"`
}

// ApprovalConsumer is the reserve that consumed an approval, and
// ApprovalAnswer an approver's recorded answer: the shapes the verifier's
// audit lists them in.
type (
	ApprovalConsumer = verify.ApprovalConsumer
	ApprovalAnswer   = verify.ApprovalAnswer
)

// policyJSON is the answer of GET and PUT /v1/namespaces/{ns}/policy.
type policyJSON struct {
	Namespace string          `json:"namespace"`
	Policy    json.RawMessage `json:"policy"`
	Seq       uint64          `json:"seq"`
	Changed   *bool           `json:"changed,omitempty"`
	Receipt   *receiptRef     `json:"receipt"`
	Warnings  []string        `json:"warnings,omitempty"`
}

func (s *Server) handleGetPolicy(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	p, seq, err := n.Policy(r.Context())
	if err != nil {
		s.Error(w, r, err)
		return
	}
	text, err := p.Canonical()
	if err != nil {
		s.Error(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, struct {
		Namespace string          `json:"namespace"`
		Policy    json.RawMessage `json:"policy"`
		Seq       uint64          `json:"seq"`
	}{n.Name(), json.RawMessage(text), seq})
}

func (s *Server) handlePutPolicy(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	raw, err := readRawBody(w, r)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	res, err := n.SetPolicy(r.Context(), raw, ActorFromContext(r.Context()))
	if err != nil {
		s.Error(w, r, err)
		return
	}
	body := policyJSON{Namespace: n.Name(), Policy: res.Policy, Seq: res.Seq, Changed: &res.Changed, Warnings: res.Warnings}
	if res.Receipt != nil {
		ref := refJSON(*res.Receipt)
		body.Receipt = &ref
	}
	s.writeJSON(w, http.StatusOK, body)
}

// mcpClientRoute names the route by which ledger-mcp relays its client's
// answer (a writer token: the gateway's own).
const mcpClientRoute = "/v1/approvals/{seq}/mcp-client"

// readRawBody reads a JSON body whole (a policy is checked by its own
// decoder, which names the member at fault).
func readRawBody(w http.ResponseWriter, r *http.Request) (json.RawMessage, error) {
	var data []byte
	if pb, ok := r.Body.(*prereadBody); ok {
		data = pb.data
	} else {
		var err error
		if data, err = readRequestBody(w, r); err != nil {
			return nil, err
		}
	}
	if _, err := decodeObject(data); err != nil { // JSON syntax, duplicate members: as every route
		return nil, err
	}
	return data, nil
}

// approvalOf renders v; withInput adds the kept input (or null) and
// whether its hash is the ask's input_hash.
func approvalOf(v *ledger.ApprovalView, withInput bool) ApprovalView {
	a := &v.Ask
	out := ApprovalView{Seq: a.Seq, IdempotencyKey: a.IdempotencyKey, ExecutionID: a.ExecutionID,
		Attempt: a.Attempt, Tool: a.Tool, Effect: a.Effect, Idempotent: a.Idempotent, InputHash: a.InputHash,
		Summary: v.Summary, Actor: a.Actor, AskedAt: a.RecordedAt, ExpiresAt: a.LeaseExpiresAt, State: v.State}
	if seq := a.Open.Get(chain.FieldResult); seq != nil && seq.ErasedBy > 0 {
		out.Erased = verify.Erased{"summary": seq.ErasedBy}
	}
	if ans := v.Answer; ans != nil {
		d := ledger.DecisionApprove
		if ans.Outcome != "approved" {
			d = ledger.DecisionReject
		}
		out.Answer = &ApprovalAnswer{Seq: ans.Seq, Decision: d, Actor: ans.Actor, Role: v.AnswerRole,
			Note: ans.Value(chain.FieldNote), RecordedAt: ans.RecordedAt}
		if p := ans.Open.Get(chain.FieldNote); p != nil && p.ErasedBy > 0 {
			out.Answer.Erased = verify.Erased{"note": p.ErasedBy}
		}
	}
	if c := v.Consumer; c != nil {
		out.ConsumedBy = &ApprovalConsumer{Seq: c.Seq, ExecutionID: c.ExecutionID, Attempt: c.Attempt}
	}
	if withInput {
		out.Input = json.RawMessage("null") // deleted: nothing to verify either
		if v.Input != "" {
			out.Input = json.RawMessage(v.Input)
			out.InputVerified = v.InputVerified
		}
	}
	return out
}

// mayReadInput reports whether the request may see asked inputs: an
// approver or admin token, or a ledger without tokens.
func mayReadInput(r *http.Request) bool {
	p, authed := PrincipalFromContext(r.Context())
	return !authed || p.Role == ledger.RoleApprover || p.Role == ledger.RoleAdmin
}

func (s *Server) handleListApprovals(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	q := r.URL.Query()
	var after uint64
	var limit int
	if v := q.Get("after"); v != "" {
		a, err := strconv.ParseUint(v, 10, 63)
		if err != nil {
			s.Error(w, r, ledger.Invalid("after", "after must be a non-negative integer"))
			return
		}
		after = a
	}
	if v := q.Get("limit"); v != "" {
		l, err := strconv.Atoi(v)
		if err != nil {
			s.Error(w, r, ledger.Invalid("limit", "limit must be an integer"))
			return
		}
		limit = l
	}
	views, next, err := n.Approvals(r.Context(), q.Get("state"), after, limit)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	out := make([]ApprovalView, 0, len(views))
	for i := range views {
		out = append(out, approvalOf(&views[i], false))
	}
	s.writeJSON(w, http.StatusOK, map[string]any{"approvals": out, "next_after": next})
}

func (s *Server) handleGetApproval(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	seq, err := pathSeq(r, ledger.ECodeUnknownApproval)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	withInput := mayReadInput(r)
	v, err := n.Approval(r.Context(), seq, withInput)
	if ledger.ErrorCode(err) == ledger.ECodeUnknownApproval {
		// An ask pruned (SPEC §16) is 410 pruned, as its receipt is.
		if _, rerr := n.GetReceipt(r.Context(), seq); ledger.ErrorCode(rerr) == ledger.ECodePruned {
			err = rerr
		}
	}
	if err != nil {
		s.Error(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, approvalOf(v, withInput))
}

// handleAnswer answers an approval as a person (POST /v1/approvals/{seq}).
func (s *Server) handleAnswer(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	s.answer(w, r, n, false)
}

// handleMCPClientAnswer answers an approval relayed by ledger-mcp from
// its client (mcpClientRoute): the body names the client.
func (s *Server) handleMCPClientAnswer(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	s.answer(w, r, n, true)
}

func (s *Server) answer(w http.ResponseWriter, r *http.Request, n *ledger.Namespace, viaClient bool) {
	seq, err := pathSeq(r, ledger.ECodeUnknownApproval)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	req := ledger.AnswerRequest{Seq: seq, Actor: ActorFromContext(r.Context())}
	if !s.decodeBody(w, r, func(o *object) {
		req.Decision, req.Note = o.required("decision"), o.str("note")
		if viaClient {
			if req.MCPClient = o.required("client"); req.MCPClient == "" && o.err == nil {
				o.fail("client", "must name the MCP client (1–128 visible ASCII)")
			}
		}
	}) {
		return
	}
	if p, authed := PrincipalFromContext(r.Context()); authed {
		req.Role, req.Authenticated = p.Role, true
	}
	v, replayed, err := n.Answer(r.Context(), req)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	status := http.StatusCreated
	if replayed {
		status = http.StatusOK
	}
	s.writeJSON(w, status, approvalOf(v, false))
}
