package storetest

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// testPayloadBytes: PayloadBytes (ledger_payload_bytes, SPEC §14) counts
// the UTF-8 bytes of the values a committed namespace keeps beside its
// chain, not their salts; it rises with commits, falls by what an erase
// deletes (plus the erase receipt's own committed reason), and stays 0 in
// an inline namespace.
func testPayloadBytes(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _, n := openDefault(t, f)
	c, err := l.Store().Chain(ctx, ledger.DefaultNamespace)
	require.NoError(t, err)
	bytesOf := func(c ledger.Chain) uint64 {
		t.Helper()
		b, err := c.PayloadBytes(ctx)
		require.NoError(t, err)
		return b
	}
	assert.Zero(t, bytesOf(c), "an empty namespace keeps nothing")

	// Multi-byte characters: bytes, not characters, are counted.
	const ref, result, msg = "réf-ü1", `{"name":"Zoë"}`, "délai dépassé"
	r := testkit.MustReserve(t, n, testkit.ReserveReq("pay-bytes-0001", "exec-1"))
	testkit.MustCommit(t, n, ledger.CommitRequest{IdempotencyKey: "pay-bytes-0001", Reservation: r.Reservation,
		Outcome: chain.OutcomeSucceeded, ExternalRef: ref, Result: json.RawMessage(result)})
	first := uint64(len(ref) + len(result))
	require.Equal(t, first, bytesOf(c), "the committed values' bytes (%d characters)", len([]rune(ref+result)))

	r = testkit.MustReserve(t, n, testkit.ReserveReq("pay-bytes-0002", "exec-1"))
	testkit.MustCommit(t, n, ledger.CommitRequest{IdempotencyKey: "pay-bytes-0002", Reservation: r.Reservation,
		Outcome: chain.OutcomeFailed, Error: &ledger.FailureDetail{Code: "TIMEOUT", Message: msg}})
	require.Equal(t, first+uint64(len(msg)), bytesOf(c), "a commit adds its values")

	const reason = "erasure request"
	res, err := n.Erase(ctx, ledger.EraseRequest{Keys: []string{"pay-bytes-0001"}, Reason: reason, Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, ledger.StatusErased, res.Status)
	assert.Equal(t, uint64(len(msg)+len(reason)), bytesOf(c),
		"the erased values are gone; the erase receipt's reason is a kept value")

	require.NoError(t, l.CreateNamespace(ctx, "inline-bytes", ledger.NamespaceSettings{Payloads: ledger.PayloadsInline}))
	in := ns(t, l, "inline-bytes")
	r = testkit.MustReserve(t, in, testkit.ReserveReq("pay-bytes-0001", "exec-1"))
	testkit.MustCommit(t, in, testkit.Succeed("pay-bytes-0001", r.Reservation))
	ic, err := l.Store().Chain(ctx, "inline-bytes")
	require.NoError(t, err)
	assert.Zero(t, bytesOf(ic), "an inline namespace keeps its values in the chain")
	assert.Equal(t, uint64(len(msg)+len(reason)), bytesOf(c), "one namespace's values are not another's")

	got, err := n.RefreshPayloadBytes(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(len(msg)+len(reason)), got)
}
