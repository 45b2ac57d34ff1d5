package api

import (
	"encoding/hex"
	"net/http"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// stateKeyRoute gives ledger-mcp the key of its requestState envelopes
// (SPEC §11.1): the gateways of one token behind one ledger share it, so
// a call's next round may reach any of them.
const stateKeyRoute = "/v1/mcp/state-key"

// stateKeyJSON is the answer of GET /v1/mcp/state-key.
type stateKeyJSON struct {
	Key string `json:"key"` // hex, 32 bytes
}

// handleStateKey answers the namespace's secret derived for the
// request's token (ledger.MCPStateKey): each token its own key, "" as
// the name without tokens. The secret itself never leaves the ledger.
func (s *Server) handleStateKey(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	secret, err := n.StateKey(r.Context())
	if err != nil {
		s.Error(w, r, err)
		return
	}
	var name string
	if p, authed := PrincipalFromContext(r.Context()); authed {
		name = p.Name
	}
	key, err := ledger.MCPStateKey(secret, name)
	if err != nil {
		s.Error(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, stateKeyJSON{Key: hex.EncodeToString(key)})
}
