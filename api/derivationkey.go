package api

import (
	"encoding/hex"
	"net/http"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// derivationKeyRoute gives the clients and ledger-mcp the namespace's
// fingerprint key (SPEC §14), from which they derive the dk2_ keys of
// calls in a committed namespace.
const derivationKeyRoute = "/v1/derivation-key"

// derivationKeyJSON is the answer of GET /v1/derivation-key: the payload
// mode in force and the key (hex, 32 bytes), which a namespace that is
// inline has too (the one a switch to committed will use).
type derivationKeyJSON struct {
	Payloads string `json:"payloads"`
	Key      string `json:"key"`
}

// handleDerivationKey answers the namespace's fingerprint key.
func (s *Server) handleDerivationKey(w http.ResponseWriter, r *http.Request, n *ledger.Namespace) {
	mode, _, err := n.PayloadsNow(r.Context()) // another replica may have switched it
	if err != nil {
		s.Error(w, r, err)
		return
	}
	key, err := n.FingerprintKey(r.Context())
	if err != nil {
		s.Error(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, derivationKeyJSON{Payloads: string(mode), Key: hex.EncodeToString(key)})
}
