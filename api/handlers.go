package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/gorilla/mux"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// receiptRef is {seq, hash} in responses.
type receiptRef struct {
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
}

func refJSON(r ledger.ReceiptRef) receiptRef { return receiptRef{Seq: r.Seq, Hash: r.Hash.String()} }

// storedResult is a stored result as a response carries it: verbatim JSON
// (null when empty), or, when the stored text is not what a ledger writes
// (an edited file), a JSON string and the result_encoding that marks it
// (chain.ResultJSON). A response is valid JSON either way.
func storedResult(s string) (json.RawMessage, string) {
	b, enc := chain.ResultJSON(nil, s)
	return json.RawMessage(b), enc
}

type reservedBody struct {
	Status         string       `json:"status"`
	IdempotencyKey string       `json:"idempotency_key"`
	KeyGenerated   bool         `json:"key_generated"`
	Reservation    string       `json:"reservation"`
	Attempt        uint64       `json:"attempt"`
	LeaseExpiresAt uint64       `json:"lease_expires_at"`
	Takeover       bool         `json:"takeover"`
	Retry          bool         `json:"retry"`
	Renewed        *renewedJSON `json:"renewed,omitempty"`
	// AfterNotApplied is set when the key's last outcome was not_applied
	// (SPEC §4.1): this reserve runs the effect again.
	AfterNotApplied *afterNotAppliedJSON `json:"after_not_applied,omitempty"`
	// Approval is the approval this reserve consumed (SPEC §13).
	Approval *consumedJSON `json:"approval,omitempty"`
	Receipt  receiptRef    `json:"receipt"`
}

// afterNotAppliedJSON names the not_applied outcome a 201 reserve follows.
type afterNotAppliedJSON struct {
	Seq       uint64 `json:"seq"`
	ErrorCode string `json:"error_code"`
}

// renewedJSON is the "renewed" member of a 201 reserve of an expired key
// (SPEC §12): the latest receipt of the key's previous generation.
type renewedJSON struct {
	Seq        uint64 `json:"seq"`
	RecordedAt uint64 `json:"recorded_at"`
}

type replayedBody struct {
	Status         string          `json:"status"`
	IdempotencyKey string          `json:"idempotency_key"`
	KeyGenerated   bool            `json:"key_generated"`
	Outcome        string          `json:"outcome"`
	ExternalRef    string          `json:"external_ref"`
	Result         json.RawMessage `json:"result"`
	ResultEncoding string          `json:"result_encoding,omitempty"`
	Original       receiptRef      `json:"original"`
	Receipt        receiptRef      `json:"receipt"`
	// Erased names the recorded fields an erasure removed (SPEC §14):
	// field → the erase receipt's seq.
	Erased map[string]uint64 `json:"erased,omitempty"`
}

type notRecordedBody struct {
	Status         string `json:"status"`
	IdempotencyKey string `json:"idempotency_key"`
	KeyGenerated   bool   `json:"key_generated"`
}

func (s *Server) handleReserve(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	o, err := readBody(w, r)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	req := ledger.ReserveRequest{
		IdempotencyKey: o.key(),
		ExecutionID:    o.required("execution_id"),
		Attempt:        o.integer("attempt"),
		Tool:           o.required("tool"),
		Effect:         o.required("effect"),
		Idempotent:     o.boolean("idempotent"),
		InputHash:      o.str("input_hash"),
		Input:          o.json("input"),
		LeaseMS:        o.integer("lease_ms"),
		WaitMS:         o.integer("wait_ms"),
		Actor:          ActorFromContext(r.Context()),
	}
	req.ApprovalSummary = o.str("approval_summary")
	req.Changed = changedOf(o)
	req.Subjects, _ = o.strings("subjects")
	if err := o.done(); err != nil {
		s.Error(w, r, err)
		return
	}
	hk, ok, err := headerKey(r)
	switch {
	case err != nil:
		s.Error(w, r, err)
		return
	case ok && o.has("idempotency_key") && hk != req.IdempotencyKey:
		s.Error(w, r, &ledger.Error{Code: ledger.ECodeInvalidRequest,
			Message: "the Idempotency-Key header and the body's idempotency_key differ",
			Details: map[string]any{"field": "idempotency_key"}})
		return
	case ok:
		req.IdempotencyKey = hk
	}
	if req.WaitMS != nil && *req.WaitMS > 0 && *req.WaitMS <= ledger.MaxWaitMS {
		s.extendDeadlines(w, r, time.Duration(*req.WaitMS)*time.Millisecond)
	}
	res, err := n.Reserve(r.Context(), req)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	switch res.Status {
	case ledger.StatusReplayed:
		w.Header().Set("Idempotent-Replayed", "true")
		result, enc := storedResult(res.Result)
		s.writeJSON(w, http.StatusOK, replayedBody{Status: res.Status, IdempotencyKey: res.IdempotencyKey,
			KeyGenerated: res.KeyGenerated, Outcome: res.Outcome, ExternalRef: res.ExternalRef,
			Result: result, ResultEncoding: enc, Original: refJSON(res.Original), Receipt: refJSON(res.Receipt),
			Erased: res.Erased})
	case ledger.StatusNotRecorded:
		s.writeJSON(w, http.StatusOK, notRecordedBody{Status: res.Status, IdempotencyKey: res.IdempotencyKey,
			KeyGenerated: res.KeyGenerated})
	case ledger.StatusApprovalRequired:
		s.writeJSON(w, http.StatusAccepted, approvalRequiredBody{Status: res.Status, IdempotencyKey: res.IdempotencyKey,
			Approval: askJSON{Seq: res.Ask.Seq, ExpiresAt: res.Ask.ExpiresAt, State: ledger.ApprovalPending},
			Receipt:  refJSON(res.Receipt)})
	default:
		body := reservedBody{Status: res.Status, IdempotencyKey: res.IdempotencyKey,
			KeyGenerated: res.KeyGenerated, Reservation: res.Reservation, Attempt: res.Attempt,
			LeaseExpiresAt: res.LeaseExpiresAt, Takeover: res.Takeover, Retry: res.Retry,
			Receipt: refJSON(res.Receipt)}
		if res.Renewed != nil {
			body.Renewed = &renewedJSON{Seq: res.Renewed.Seq, RecordedAt: res.Renewed.RecordedAt}
		}
		if a := res.AfterNotApplied; a != nil {
			body.AfterNotApplied = &afterNotAppliedJSON{Seq: a.Seq, ErrorCode: a.ErrorCode}
		}
		if a := res.Approval; a != nil {
			body.Approval = &consumedJSON{Seq: a.Seq, AskSeq: a.AskSeq}
		}
		s.writeJSON(w, http.StatusCreated, body)
	}
}

// pathKey returns the {key} route variable, percent-decoded.
func pathKey(r *http.Request) (string, error) {
	k, err := url.PathUnescape(mux.Vars(r)["key"])
	if err != nil {
		return "", &ledger.Error{Code: ledger.ECodeInvalidKey, Message: "idempotency key in the path is not validly percent-encoded",
			Details: map[string]any{"field": "idempotency_key"}}
	}
	return k, nil
}

// decodeBody reads the JSON body and passes it to read, answering the
// error itself (and returning false) when the body is bad, a member read
// took is bad or the body holds a member read did not take.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, read func(o *object)) bool {
	o, err := readBody(w, r)
	if err == nil {
		read(o)
		err = o.done()
	}
	if err != nil {
		s.Error(w, r, err)
		return false
	}
	return true
}

// keyedWrite runs a write on a {key} route: the request build reads from
// the key and the body, passed to run. A bad request or run's error is
// answered as the contract's error, and ok is false.
func keyedWrite[Req, Res any](s *Server, w http.ResponseWriter, r *http.Request,
	build func(key string, o *object) Req, run func(context.Context, Req) (Res, error)) (res Res, ok bool) {
	key, err := pathKey(r)
	if err != nil {
		s.Error(w, r, err)
		return res, false
	}
	var req Req
	if !s.decodeBody(w, r, func(o *object) { req = build(key, o) }) {
		return res, false
	}
	if res, err = run(r.Context(), req); err != nil {
		s.Error(w, r, err)
		return res, false
	}
	return res, true
}

type committedBody struct {
	Status         string     `json:"status"`
	IdempotencyKey string     `json:"idempotency_key"`
	Outcome        string     `json:"outcome"`
	Late           bool       `json:"late"`
	Receipt        receiptRef `json:"receipt"`
	// ReconciledEarlier names the reconcile that finalized the
	// reservation before this, its original call's commit (SPEC §15).
	ReconciledEarlier *reconciledJSON `json:"reconciled_earlier,omitempty"`
}

func (s *Server) handleCommit(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	res, ok := keyedWrite(s, w, r, func(key string, o *object) ledger.CommitRequest {
		return ledger.CommitRequest{
			IdempotencyKey: key,
			Reservation:    o.required("reservation"),
			Outcome:        o.required("outcome"),
			ExternalRef:    o.str("external_ref"),
			Result:         o.json("result"),
			Error:          o.failure(),
			Actor:          ActorFromContext(r.Context()),
		}
	}, n.Commit)
	if !ok {
		return
	}
	status := http.StatusCreated
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
		status = http.StatusOK
	}
	body := committedBody{Status: ledger.StatusCommitted, IdempotencyKey: res.IdempotencyKey,
		Outcome: res.Outcome, Late: res.Late, Receipt: refJSON(res.Receipt)}
	if e := res.ReconciledEarlier; e != nil {
		body.ReconciledEarlier = &reconciledJSON{Seq: e.Seq, Hash: e.Hash.String(), Outcome: e.Outcome, ExternalRef: e.ExternalRef}
	}
	s.writeJSON(w, status, body)
}

type resolvedBody struct {
	Status         string     `json:"status"`
	IdempotencyKey string     `json:"idempotency_key"`
	State          string     `json:"state"`
	Receipt        receiptRef `json:"receipt"`
}

func (s *Server) handleResolve(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	res, ok := keyedWrite(s, w, r, func(key string, o *object) ledger.ResolveRequest {
		return ledger.ResolveRequest{
			IdempotencyKey: key,
			Outcome:        o.required("outcome"),
			ExternalRef:    o.str("external_ref"),
			Result:         o.json("result"),
			Note:           o.required("note"),
			Error:          o.failure(),
			Actor:          ActorFromContext(r.Context()),
			MayCorrect:     actsAsAdmin(r.Context()),
		}
	}, n.Resolve)
	if ok {
		s.writeJSON(w, http.StatusCreated, resolvedBody{Status: ledger.StatusResolved, IdempotencyKey: res.IdempotencyKey,
			State: string(res.State), Receipt: refJSON(res.Receipt)})
	}
}

// actsAsAdmin reports whether the request may do what only an admin may
// beside the route's role — correct a failed key to not_applied (SPEC
// §4.1), reconcile another actor's reserve (§15): its token is an
// admin's, or the ledger serves without tokens (no principal), where
// every caller is one.
func actsAsAdmin(ctx context.Context) bool {
	p, ok := PrincipalFromContext(ctx)
	return !ok || p.Role == ledger.RoleAdmin
}

// keyQuery is the set of query parameters GET /v1/effects/{key} accepts.
var keyQuery = map[string]bool{"history": true}

func (s *Server) handleGetKey(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	key, err := pathKey(r)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	q, err := parseQuery(r, keyQuery)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	history, err := boolParam(q.Get("history"), "history")
	if err != nil {
		s.Error(w, r, err)
		return
	}
	v, err := n.Key(r.Context(), key, history)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	s.writeRaw(w, http.StatusOK, append(AppendKeyView(nil, v), '\n'))
}

// boolParam parses an optional boolean query parameter ("true" or
// "false"; absent is false).
func boolParam(v, field string) (bool, error) {
	switch v {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	}
	return false, &ledger.Error{Code: ledger.ECodeInvalidRequest, Message: field + " must be true or false",
		Details: map[string]any{"field": field}}
}

// receiptQuery is the set of query parameters GET /v1/receipts accepts.
var receiptQuery = map[string]bool{"after": true, "limit": true, "key": true, "execution_id": true, "tool": true, "kind": true}

func (s *Server) handleListReceipts(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	q, err := parseQuery(r, receiptQuery)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	f := ledger.ReceiptFilter{Key: q.Get("key"), ExecutionID: q.Get("execution_id"), Tool: q.Get("tool"), Kind: q.Get("kind")}
	if v := q.Get("after"); v != "" {
		if f.After, err = strconv.ParseUint(v, 10, 63); err != nil {
			s.Error(w, r, &ledger.Error{Code: ledger.ECodeInvalidRequest, Message: "after must be a non-negative integer",
				Details: map[string]any{"field": "after"}})
			return
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > ledger.MaxPageLimit {
			s.Error(w, r, &ledger.Error{Code: ledger.ECodeInvalidRequest, Message: "limit must be an integer from 1 to 1000",
				Details: map[string]any{"field": "limit"}})
			return
		}
		f.Limit = n
	}
	rs, next, err := n.ListReceipts(r.Context(), f)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	s.writeRaw(w, http.StatusOK, append(AppendReceiptPage(nil, rs, next), '\n'))
}

// pathSeq reads the {seq} of a route that names a receipt or an approval,
// percent-decoded the same way for every such route (the router keeps
// paths encoded so that keys may hold '/'); one that is not a seq is an
// error with code (unknown_receipt, or unknown_approval for an approval).
func pathSeq(r *http.Request, code string) (uint64, error) {
	raw, err := url.PathUnescape(mux.Vars(r)["seq"])
	var seq uint64
	if err == nil {
		seq, err = strconv.ParseUint(raw, 10, 63)
	}
	if err != nil {
		return 0, &ledger.Error{Code: code, Message: "seq must be a positive integer",
			Details: map[string]any{"field": "seq"}}
	}
	return seq, nil
}

func (s *Server) handleGetReceipt(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	seq, err := pathSeq(r, ledger.ECodeUnknownReceipt)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	rc, err := n.GetReceipt(r.Context(), seq)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	s.writeRaw(w, http.StatusOK, append(rc.AppendJSON(nil), '\n'))
}

func (s *Server) handleHead(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	h, err := n.Head(r.Context())
	if err != nil {
		s.Error(w, r, err)
		return
	}
	p, err := prunedOf(r.Context(), n)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	if p == nil {
		s.writeJSON(w, http.StatusOK, headRef(h))
		return
	}
	s.writeJSON(w, http.StatusOK, struct {
		receiptRef
		Pruned *prunedHead `json:"pruned"`
	}{headRef(h), p})
}

// headRef is a chain head in the form of a receipt reference.
func headRef(h ledger.Head) receiptRef { return receiptRef{Seq: h.Seq, Hash: h.Hash.String()} }

// namespaceJSON is one namespace in GET /v1/namespaces and the answer of
// POST /v1/namespaces.
type namespaceJSON struct {
	Name     string     `json:"name"`
	Head     receiptRef `json:"head"`
	KeyTTLMS uint64     `json:"key_ttl_ms"`
	Payloads string     `json:"payloads"`
	// CommittedAfter is the seq of the policy receipt that switched an
	// inline namespace to committed payloads (SPEC §14); omitted when none.
	CommittedAfter uint64 `json:"committed_after,omitempty"`
	// PrunedThrough is the namespace's pruned prefix (SPEC §16): receipts
	// 1…PrunedThrough are pruned, 0 when none.
	PrunedThrough uint64 `json:"pruned_through"`
}

func (s *Server) handleCreateNamespace(w http.ResponseWriter, r *http.Request) {
	var name, payloads string
	var ttl *int64
	if !s.decodeBody(w, r, func(o *object) {
		name, ttl, payloads = o.required("name"), o.integer("key_ttl_ms"), o.str("payloads")
	}) {
		return
	}
	mode, err := ledger.ParsePayloadMode(payloads, ledger.DefaultPayloads)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	var keyTTL uint64
	if ttl != nil {
		if *ttl < 0 || *ttl > ledger.MaxKeyTTL {
			s.Error(w, r, ledger.Invalid("key_ttl_ms", "key_ttl_ms must be an integer from 0 to %d", int64(ledger.MaxKeyTTL)))
			return
		}
		keyTTL = uint64(*ttl)
	}
	if p, authed := PrincipalFromContext(r.Context()); authed && !p.AllowsNamespace(name) {
		// A token limited to namespaces creates only those it names.
		s.Error(w, r, &ledger.Error{Code: ledger.ECodeForbidden, Message: "this token may not use namespace " + truncate(name, 64),
			Details: map[string]any{"namespace": truncate(name, 64)}})
		return
	}
	if err := s.l.CreateNamespace(r.Context(), name, ledger.NamespaceSettings{KeyTTL: keyTTL, Payloads: mode}); err != nil {
		s.Error(w, r, err)
		return
	}
	n, err := s.l.NS(r.Context(), name)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	h, err := n.Head(r.Context())
	if err != nil {
		s.Error(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusCreated, namespaceJSON{Name: n.Name(), Head: headRef(h), KeyTTLMS: n.KeyTTL(),
		Payloads: string(n.Payloads())})
}

func (s *Server) handleListNamespaces(w http.ResponseWriter, r *http.Request) {
	list, err := s.l.Namespaces(r.Context())
	if err != nil {
		s.Error(w, r, err)
		return
	}
	p, authed := PrincipalFromContext(r.Context())
	out := make([]namespaceJSON, 0, len(list))
	for _, ns := range list {
		if authed && !p.AllowsNamespace(ns.Name) {
			continue // a token limited to namespaces sees only those
		}
		n, err := s.l.NS(r.Context(), ns.Name)
		var m ledger.PruneMark
		if err == nil {
			m, err = n.Reader().Pruned(r.Context())
		}
		if err != nil {
			s.Error(w, r, fmt.Errorf("namespace %s: the pruned prefix: %w", ns.Name, err))
			return
		}
		out = append(out, namespaceJSON{Name: ns.Name, Head: headRef(ns.Head), KeyTTLMS: ns.KeyTTL, Payloads: string(ns.Payloads),
			CommittedAfter: ns.SwitchedAt, PrunedThrough: m.Through})
	}
	s.writeJSON(w, http.StatusOK, map[string]any{"namespaces": out})
}
