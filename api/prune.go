package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// Archive, then prune (SPEC §16): POST /v1/ns/{ns}/prune (admin) prunes,
// GET /v1/ns/{ns}/prune (admin: it scans the chain) says what could be
// pruned and what was.

// pruneBody is the answer of POST …/prune.
type pruneBody struct {
	Status   string      `json:"status"`
	Receipt  *receiptRef `json:"receipt,omitempty"`
	From     uint64      `json:"from,omitempty"`
	Through  uint64      `json:"through"`
	Segment  string      `json:"segment,omitempty"`
	Digest   string      `json:"digest,omitempty"`
	Deleting bool        `json:"deleting"`
}

// handlePrune is POST /v1/ns/{ns}/prune: {"through": SEQ}, or {} for as
// far as the policy's archive.keep_ms, the watermark and the latest
// checkpoint allow. 201 with the prune receipt; 200 already_pruned (with
// the prune that covers through) or nothing_to_prune.
func (s *Server) handlePrune(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	var through *int64
	if !s.decodeBody(w, r, func(o *object) { through = o.integer("through") }) {
		return
	}
	req := ledger.PruneRequest{Actor: ActorFromContext(r.Context())}
	if through != nil {
		if *through < 1 {
			s.Error(w, r, ledger.Invalid("through", "through must be the seq of a receipt (1 or more); leave it out to prune as far as the policy allows"))
			return
		}
		req.Through = uint64(*through)
	}
	res, err := n.Prune(r.Context(), req)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	body := pruneBody{Status: res.Status, From: res.From, Through: res.Through, Segment: res.Segment, Digest: res.Digest,
		Deleting: res.Deleting}
	if res.Receipt != nil {
		ref := refJSON(*res.Receipt)
		body.Receipt = &ref
	}
	status := http.StatusOK
	if res.Status == ledger.PruneStatusPruned {
		status = http.StatusCreated
	}
	s.writeJSON(w, status, body)
}

// handlePruneStatus is GET /v1/ns/{ns}/prune: the archive member, the
// prunable watermark above the pruned prefix (under the policy's
// min_keep_ms, ledger.MinArchiveKeepMS without one), and the prunes.
func (s *Server) handlePruneStatus(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	body, err := n.PruneStatus(r.Context())
	if err != nil {
		s.Error(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, body)
}

// prunedHead is what GET /v1/head says of the pruned prefix: its last
// seq, that receipt's kept chain hash (from which the live chain goes on)
// and the latest prune receipt.
type prunedHead struct {
	Through uint64 `json:"through"`
	Hash    string `json:"hash"`
	Prune   uint64 `json:"prune"`
}

// prunedOf reads n's pruned prefix for GET /v1/head; nil when nothing is
// pruned.
func prunedOf(ctx context.Context, n *ledger.Namespace) (*prunedHead, error) {
	m, err := n.Reader().Pruned(ctx)
	if err != nil || m.Seq == 0 {
		return nil, err
	}
	hs, err := n.Reader().ReceiptHashes(ctx, m.Through-1, 1)
	if err != nil {
		return nil, err
	}
	if len(hs) != 1 {
		return nil, fmt.Errorf("no kept chain hash of pruned receipt %d: %w", m.Through, ledger.ErrStorageCorrupt)
	}
	return &prunedHead{Through: m.Through, Hash: hs[0].String(), Prune: m.Seq}, nil
}
