package mcpgate

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/downstream"
)

// Keys of _meta the gateway reads and writes (SPEC §11).
const (
	MetaIdempotencyKey = "io.effect-ledger/idempotency-key"
	MetaStatus         = "io.effect-ledger/status"
	MetaKey            = "io.effect-ledger/key"
	MetaReplayed       = "io.effect-ledger/replayed"
	MetaReceipt        = "io.effect-ledger/receipt"
	// MetaSubjects, read from a call: the people it concerns (SPEC §14,
	// subjects.go); MetaErased, on a replay: the recorded fields an
	// erasure removed, field → the erase receipt's seq.
	MetaSubjects = "io.effect-ledger/subjects"
	MetaErased   = "io.effect-ledger/erased"
)

// metaParamsKey carries a call's params.idempotencyKey from the transport
// (package downstream lifts it) to the decision.
const metaParamsKey = downstream.MetaParamsKey

// explicitKey returns the idempotency key a tools/call names (SPEC
// §11), in this order: _meta["io.effect-ledger/idempotency-key"], then
// params.idempotencyKey; "" when it names none (the gateway then derives
// one, DeriveKey).
func explicitKey(meta mcp.Meta) (string, error) {
	for _, name := range []string{MetaIdempotencyKey, metaParamsKey} {
		v, ok := meta[name]
		if !ok || v == nil {
			continue
		}
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("the idempotency key must be a string, not %T", v)
		}
		// The ledger replaces a key too short to dedupe with a generated
		// one, so every identical call would run: an explicit key must be
		// one the ledger keeps (SPEC §1), or the call is refused.
		if len(s) < ledger.MinKeyLen {
			return "", fmt.Errorf("the idempotency key %q is shorter than %d bytes, so it could not deduplicate "+
				"(leave it out and the gateway derives one from the call)", s, ledger.MinKeyLen)
		}
		if err := ledger.ValidateKey(s); err != nil {
			return "", fmt.Errorf("the idempotency key must be %d–%d bytes of visible ASCII (0x21–0x7E)", ledger.MinKeyLen, ledger.MaxKeyLen)
		}
		if strings.HasPrefix(s, ledger.GeneratedKeyPrefix) {
			return "", fmt.Errorf("the idempotency key may not start with %q, which the ledger keeps for keys it generates", ledger.GeneratedKeyPrefix)
		}
		return s, nil
	}
	return "", nil
}

// DeriveKey is the key of a call that names none: the clients' derived
// key in the namespace dk describes (client.DerivationKey.DeriveKey:
// "dk2_" + hex HMAC-SHA-256(the namespace's key, tool ‖ 0x00 ‖
// JCS(input)) in a namespace that commits its payloads, "dk_" + hex
// SHA-256(tool ‖ 0x00 ‖ JCS(input)) in an inline one or with dk nil)
// over the ledger's tool name and {"arguments": args, "scope": scope}, so
// the same call with the same arguments in the same scope is the same
// effect across retries, restarts and gateways.
func DeriveKey(dk *client.DerivationKey, ledgerTool string, args json.RawMessage, scope string) (string, error) {
	return dk.DeriveKey(ledgerTool, map[string]any{"arguments": args, "scope": scope})
}

// forwardMeta is the _meta a forwarded call carries upstream: the
// client's own, without what only the gateway reads, and the call's
// idempotency key as MetaKey when it has one (SPEC §15), so that a tool
// can store it where a lookup finds it. The gateway's key replaces any
// MetaKey the client sent.
func forwardMeta(meta mcp.Meta, key string) mcp.Meta {
	if len(meta) == 0 && key == "" {
		return nil
	}
	out := mcp.Meta{}
	for k, v := range meta {
		if k != MetaIdempotencyKey && k != metaParamsKey && k != MetaKey && k != MetaSubjects {
			out[k] = v
		}
	}
	if key != "" {
		out[MetaKey] = key
	}
	return out
}
