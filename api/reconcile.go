package api

import (
	"net/http"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// reconciledJSON names the reconcile receipt a late commit follows (SPEC
// §15): the outcome and external_ref the lookup found.
type reconciledJSON struct {
	Seq         uint64 `json:"seq"`
	Hash        string `json:"hash"`
	Outcome     string `json:"outcome"`
	ExternalRef string `json:"external_ref"`
}

type reconcileBody struct {
	Status         string     `json:"status"`
	IdempotencyKey string     `json:"idempotency_key"`
	State          string     `json:"state"`
	Receipt        receiptRef `json:"receipt"`
}

// handleReconcile is POST /v1/effects/{key}/reconcile (SPEC §15).
func (s *Server) handleReconcile(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	var req ledger.ReconcileRequest
	if !s.decodeKeyed(w, r, func(key string, o *object) {
		req = ledger.ReconcileRequest{
			IdempotencyKey: key,
			Outcome:        o.required("outcome"),
			ExternalRef:    o.str("external_ref"),
			Result:         o.json("result"),
			Error:          o.failure(),
			Evidence:       o.json("evidence"),
			Actor:          ActorFromContext(r.Context()),
			Admin:          actsAsAdmin(r.Context()),
		}
	}) {
		return
	}
	res, err := n.Reconcile(r.Context(), req)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusCreated, reconcileBody{Status: ledger.StatusReconciled, IdempotencyKey: res.IdempotencyKey,
		State: string(res.State), Receipt: refJSON(res.Receipt)})
}
