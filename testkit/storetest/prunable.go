package storetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// testPrunable checks the prunable watermark of SPEC §16 as keys are
// reserved, finished, replayed and outlive their lifetime, with the clock
// moved, never waited for.
func testPrunable(t *testing.T, f Factory) {
	ctx := context.Background()
	l, clock := open(t, f)
	_, err := ns(t, l, ledger.DefaultNamespace).Prunable(ctx, 0, 0)
	var e *ledger.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, ledger.ECodeNotPrunable, e.Code, "no key TTL: never")
	n := ttlNS(t, l)
	watermark := func(minKeep time.Duration) *ledger.Watermark {
		t.Helper()
		w, err := n.Prunable(ctx, 0, uint64(minKeep.Milliseconds()))
		require.NoError(t, err)
		return w
	}
	require.Equal(t, &ledger.Watermark{}, watermark(0), "an empty chain")

	a := testkit.MustReserve(t, n, testkit.ReserveReq("prune-a1", "e1"))    // 1
	testkit.MustCommit(t, n, testkit.Succeed("prune-a1", a.Reservation))    // 2
	b := testkit.MustReserve(t, n, testkit.ReserveReq("prune-b1", "e1"))    // 3
	c := testkit.MustReserve(t, n, testkit.ReserveReq("prune-c1", "e1"))    // 4
	testkit.MustCommit(t, n, testkit.Fail("prune-c1", c.Reservation, true)) // 5
	testkit.MustReserve(t, n, testkit.ReserveReq("prune-a1", "e2"))         // 6: a replay of a
	w := watermark(0)
	require.Equal(t, uint64(0), w.Through, "a finished just now")
	require.Equal(t, &ledger.Pin{Key: "prune-a1", State: ledger.StateSucceeded, Seq: 1, Until: testkit.T0 + uint64(ttl.Milliseconds())}, w.Pin)

	clock.Advance(ttl)
	w = watermark(0)
	require.Equal(t, uint64(0), w.Through, "a's replay at 6 is in the same generation, which b's open reserve at 3 splits")
	require.Equal(t, "prune-b1", w.Pin.Key)
	require.Equal(t, ledger.StateInterrupted, w.Pin.State, "its lease has passed")
	require.Equal(t, uint64(6), w.Head)

	testkit.MustCommit(t, n, testkit.Succeed("prune-b1", b.Reservation)) // 7, an hour later
	w = watermark(0)
	require.Equal(t, uint64(0), w.Through)
	require.Equal(t, &ledger.Pin{Key: "prune-b1", State: ledger.StateSucceeded, Seq: 3, Until: uint64(clock.Now().UnixMilli()) + uint64(ttl.Milliseconds())}, w.Pin)

	clock.Advance(ttl)
	w = watermark(0)
	require.Equal(t, &ledger.Watermark{Through: 7, Floor: 7, Head: 7}, w, "every generation finished an hour ago")
	w = watermark(90 * time.Minute) // the floor: receipts at T0 (1…6) only
	require.Equal(t, uint64(6), w.Floor)
	require.Equal(t, uint64(0), w.Through, "b starts before the floor and ends after it, and a's generation (1…6) overlaps it")
	require.Equal(t, "prune-b1", w.Pin.Key)

	// A refusing repeat rule keeps c's failure for its window.
	_, err = n.SetPolicy(ctx, json.RawMessage(`{"rules":[{"tool":"payments.*","repeat_failure":"refuse","repeat_window_ms":86400000}]}`), "ops")
	require.NoError(t, err) // 8: a policy receipt never pins
	w = watermark(0)
	require.Equal(t, uint64(0), w.Through, "c's failure is within the repeat window")
	require.Equal(t, &ledger.Pin{Key: "prune-c1", State: ledger.StateFailed, Seq: 4, Until: testkit.T0 + 86_400_001}, w.Pin)
	clock.Set(time.UnixMilli(int64(testkit.T0) + 86_400_000))
	require.Equal(t, "prune-c1", watermark(0).Pin.Key, "the guard still counts a failure a window old")
	clock.Advance(time.Millisecond)
	require.Equal(t, uint64(8), watermark(0).Through)

	// A new generation of a: its old one no longer pins, the new one does.
	r := testkit.MustReserve(t, n, testkit.ReserveReq("prune-a1", "e3")) // 9: renewed
	require.Equal(t, ledger.StatusReserved, r.Status)
	w = watermark(0)
	require.Equal(t, uint64(8), w.Through)
	require.Equal(t, &ledger.Pin{Key: "prune-a1", State: ledger.StateReserved, Seq: 9}, w.Pin)
	testkit.MustCommit(t, n, testkit.Succeed("prune-a1", r.Reservation)) // 10

	// A pending ask pins until it expires; then it is finished when it
	// expired, and kept for the key's lifetime.
	setPolicy(t, n, `{"rules":[{"tool":"mail.*","approval":"required","expires_in_ms":60000}]}`) // 11
	req := testkit.ReserveReq("prune-d1", "e1")
	req.Tool = "mail.send"
	require.Equal(t, ledger.StatusApprovalRequired, testkit.MustReserve(t, n, req).Status) // 12: the ask
	clock.Advance(ttl)
	w = watermark(0)
	require.Equal(t, uint64(11), w.Through)
	require.Equal(t, &ledger.Pin{Key: "prune-d1", State: ledger.StateApprovalExpired, Seq: 12,
		Until: uint64(clock.Now().Add(-ttl).UnixMilli()) + 60_000 + uint64(ttl.Milliseconds())}, w.Pin)
	clock.Advance(time.Minute)
	require.Equal(t, &ledger.Watermark{Through: 12, Floor: 12, Head: 12}, watermark(0))
}
