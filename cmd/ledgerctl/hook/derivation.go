package hook

import (
	"context"
	"encoding/hex"

	"github.com/effect-ledger/effect-ledger/client"
)

// derivationKey is the namespace's derivation key (SPEC §14), which
// derives the keys of deduped calls. Every hook run is a new process, so
// a committed namespace's key is kept in the state directory, per server
// and namespace, and asked of the ledger when missing. An inline
// namespace's answer is not kept: a namespace switches to committed one
// way, and from then on the hook derives dk2_ keys.
func (h *Hook) derivationKey(ctx context.Context) (*client.DerivationKey, error) {
	file := h.State.derivationKey()
	var kept derivation
	ok, err := h.State.read(file, &kept)
	if err != nil {
		h.Logger.WarnContext(ctx, "hook: the kept derivation key is unreadable; asking the ledger", "err", err)
	}
	if key, herr := hex.DecodeString(kept.Key); ok && err == nil && herr == nil && len(key) > 0 &&
		kept.Payloads == client.PayloadsCommitted {
		return &client.DerivationKey{Payloads: kept.Payloads, Key: key}, nil
	}
	dk, err := h.Client.DerivationKey(ctx)
	if err != nil || dk.Payloads != client.PayloadsCommitted {
		return dk, err
	}
	if err := h.State.write(file, derivation{Payloads: dk.Payloads, Key: hex.EncodeToString(dk.Key)}); err != nil {
		h.Logger.WarnContext(ctx, "hook: the derivation key is not kept", "err", err)
	}
	return dk, nil
}
