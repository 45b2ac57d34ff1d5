package api

import (
	"net/http"
	"strings"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// Rotating the log's signing key (SPEC §9.2): POST /v1/ns/{ns}/signing-keys
// (admin) appends a key receipt; GET lists the chain's rotations and the
// keys that signed the latest checkpoint.

type rotationBody struct {
	Seq        uint64 `json:"seq"`
	VKey       string `json:"vkey"`
	KeyID      string `json:"key_id"`
	Retires    string `json:"retires"`
	Actor      string `json:"actor"`
	RecordedAt uint64 `json:"recorded_at"`
}

func rotationJSON(r ledger.KeyRotation) rotationBody {
	return rotationBody{Seq: r.Seq, VKey: r.VKey, KeyID: r.ID, Retires: r.Retires, Actor: r.Actor, RecordedAt: r.RecordedAt}
}

// handleRotateKey is POST /v1/ns/{ns}/signing-keys {"vkey", "retires"?}.
func (s *Server) handleRotateKey(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	var req ledger.RotateRequest
	if !s.decodeBody(w, r, func(o *object) {
		req.VKey = o.str("vkey")
		req.Retires = o.str("retires")
	}) {
		return
	}
	if req.VKey == "" {
		s.Error(w, r, ledger.Invalid("vkey", "vkey (the new verifier key) is required"))
		return
	}
	req.Actor = ActorFromContext(r.Context())
	res, err := n.RotateKey(r.Context(), req)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusCreated, struct {
		Receipt receiptRef `json:"receipt"`
		rotationBody
	}{refJSON(res.Receipt), rotationJSON(res.Rotation)})
}

type signingKeysBody struct {
	// Current is the key the chain announced last; null when it
	// announced none.
	Current   *string        `json:"current"`
	Rotations []rotationBody `json:"rotations"`
	// CheckpointKeys are the ids of the log's keys that signed the
	// latest checkpoint (empty before the first).
	CheckpointKeys []string `json:"checkpoint_keys"`
	CheckpointSize int64    `json:"checkpoint_size"`
}

// handleSigningKeys is GET /v1/ns/{ns}/signing-keys.
func (s *Server) handleSigningKeys(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	h, err := n.KeyHistory(r.Context())
	if err != nil {
		s.Error(w, r, err)
		return
	}
	body := signingKeysBody{Rotations: []rotationBody{}, CheckpointKeys: []string{}}
	if c := h.Current(); c != "" {
		body.Current = &c
	}
	for _, rot := range h {
		body.Rotations = append(body.Rotations, rotationJSON(rot))
	}
	cp, err := n.LatestCheckpoint(r.Context())
	if err != nil {
		s.Error(w, r, err)
		return
	}
	if cp != nil {
		body.CheckpointSize = cp.Size
		if c, err := tlog.ParseCheckpoint(tlog.NoteText([]byte(cp.Note))); err == nil {
			prefix := c.Origin[:max(strings.LastIndex(c.Origin, "/"), 0)]
			body.CheckpointKeys = append(body.CheckpointKeys, tlog.SignatureKeys([]byte(cp.Note), prefix)...)
		}
	}
	s.writeJSON(w, http.StatusOK, body)
}
