package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"slices"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Erasure of payloads (SPEC §14): POST /v1/ns/{ns}/erasures (admin), GET
// /v1/ns/{ns}/erasures (admin: the export for a restored backup) and GET
// /v1/ns/{ns}/erasures/{seq}.

// strings reads an optional member that must be an array of strings.
func (o *object) strings(name string) ([]string, bool) {
	raw := o.get(name)
	if raw == nil {
		return nil, false
	}
	var out []string
	switch {
	case raw[0] != '[' || json.Unmarshal(raw, &out) != nil:
		o.fail(name, "must be an array of strings")
	case bytes.Contains(raw, []byte(`\u`)) && ledger.CheckIJSON(raw) != nil:
		// A lone surrogate would be read as U+FFFD: two such subjects
		// would be one person.
		o.fail(name, "must be an array of I-JSON strings (RFC 7493): no lone surrogate escapes")
	}
	return out, true
}

type erasedBody struct {
	Status  string      `json:"status"`
	Receipt *receiptRef `json:"receipt,omitempty"`
	Count   uint64      `json:"count"`
	Keys    int         `json:"keys"`
	Inline  int         `json:"inline"`
	Pending []string    `json:"pending"`
	Purged  *bool       `json:"purged"`
}

// handleErase is POST /v1/ns/{ns}/erasures: exactly one selector, keys or
// subject.
func (s *Server) handleErase(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	var req ledger.EraseRequest
	var hasKeys, hasSubject, hasReason bool
	var fieldErr error
	if !s.decodeBody(w, r, func(o *object) {
		req.Keys, hasKeys = o.strings("keys")
		hasSubject = o.has("subject")
		req.Subject = o.str("subject")
		fields, hasFields := o.strings("fields")
		req.Fields, fieldErr = chain.ParseFieldSet(fields)
		switch {
		case hasFields && len(fields) == 0:
			fieldErr = errors.New("fields must name at least one payload field; leave it out for all four")
		case len(slices.Compact(slices.Sorted(slices.Values(fields)))) != len(fields):
			fieldErr = errors.New("fields names a field twice")
		}
		hasReason = o.has("reason")
		req.Reason = o.str("reason")
	}) {
		return
	}
	switch {
	case hasReason && req.Reason == "":
		s.Error(w, r, ledger.Invalid("reason", "reason must be 1–%d characters; leave it out for none", ledger.MaxEraseReason))
		return
	case hasKeys == hasSubject:
		s.Error(w, r, ledger.Invalid("keys", "give exactly one selector: keys or subject"))
		return
	case hasSubject && req.Subject == "":
		s.Error(w, r, ledger.Invalid("subject", "subject must be 1–%d bytes of UTF-8", ledger.MaxSubjectLen))
		return
	case fieldErr != nil:
		s.Error(w, r, ledger.Invalid("fields", "%v", fieldErr))
		return
	}
	req.Actor = ActorFromContext(r.Context())
	res, err := n.Erase(r.Context(), req)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	body := erasedBody{Status: res.Status, Count: res.Count, Keys: res.Keys, Inline: res.Inline, Pending: append([]string{}, res.Pending...),
		Purged: n.PurgedAnswer(false)}
	status := http.StatusOK
	if res.Receipt != nil {
		ref := refJSON(*res.Receipt)
		body.Receipt, status = &ref, http.StatusCreated
	}
	s.writeJSON(w, status, body)
}

type erasureBody struct {
	Seq       uint64      `json:"seq"`
	Count     uint64      `json:"count"`
	Fields    []string    `json:"fields"`
	Retention bool        `json:"retention"`
	Purged    *bool       `json:"purged"`
	Ranges    [][2]uint64 `json:"ranges,omitempty"`
	Salt      string      `json:"salt,omitempty"`
}

// handleGetErasure is GET /v1/ns/{ns}/erasures/{seq}; admins also see the
// ranges and their salt (which say which receipts were erased together).
func (s *Server) handleGetErasure(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	seq, err := pathSeq(r, ledger.ECodeUnknownErasure)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	e, res, err := n.Erasure(r.Context(), seq)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	body := erasureBody{Seq: seq, Count: res.Count, Fields: res.Fields, Retention: res.Retention,
		Purged: n.PurgedAnswer(e.PurgedAt > 0)}
	if actsAsAdmin(r.Context()) {
		for _, rg := range e.Ranges {
			body.Ranges = append(body.Ranges, [2]uint64(rg))
		}
		body.Salt = e.Salt.String()
	}
	s.writeJSON(w, http.StatusOK, body)
}

// handleListErasures is GET /v1/ns/{ns}/erasures (admin): the namespace's
// part of an erasures file (ledgerctl erasures export, docs/privacy.md).
func (s *Server) handleListErasures(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	body, err := n.ExportErasures(r.Context())
	if err != nil {
		s.Error(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, body)
}
