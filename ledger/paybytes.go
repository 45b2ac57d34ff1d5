package ledger

import (
	"context"
	"fmt"

	"github.com/effect-ledger/effect-ledger/internal/metrics"
)

// payloadBytes is the ledger_payload_bytes gauge (SPEC §14): what a
// namespace still keeps of its payload values beside its chain. It is a
// gauge of stored state, read with one query (PayloadReader.PayloadBytes)
// by the namespace's background services (RefreshPayloadBytes), so any
// replica of a shared database may report it. Its only label is the
// namespace's name: no value, erased or kept, is ever a label.
var payloadBytes = metrics.GaugeVec("ledger_payload_bytes",
	"Bytes of payload values (external_ref, result, error_message, note of committed receipts; values only, not their salts) the namespace still keeps beside its chain: falls when an erase or a retention sweep deletes values, 0 for an inline namespace. Refreshed periodically, not on every write.",
	"namespace")

// RefreshPayloadBytes reads how many bytes of payload values the
// namespace keeps beside its chain and sets its ledger_payload_bytes
// gauge to it (an inline namespace keeps none: 0).
func (n *Namespace) RefreshPayloadBytes(ctx context.Context) (uint64, error) {
	b, err := n.chain.PayloadBytes(ctx)
	if err != nil {
		return 0, fmt.Errorf("namespace %s: payload bytes: %w", n.name, err)
	}
	payloadBytes.WithLabelValues(n.name).Set(float64(b))
	return b, nil
}
