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
	res, ok := keyedWrite(s, w, r, func(key string, o *object) ledger.ReconcileRequest {
		return ledger.ReconcileRequest{
			IdempotencyKey: key,
			Outcome:        o.required("outcome"),
			ExternalRef:    o.str("external_ref"),
			Result:         o.json("result"),
			Error:          o.failure(),
			Evidence:       o.json("evidence"),
			Actor:          ActorFromContext(r.Context()),
			Admin:          actsAsAdmin(r.Context()),
		}
	}, n.Reconcile)
	if !ok {
		return
	}
	s.writeJSON(w, http.StatusCreated, reconcileBody{Status: ledger.StatusReconciled, IdempotencyKey: res.IdempotencyKey,
		State: string(res.State), Receipt: refJSON(res.Receipt)})
}
