package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// OpenKeys counts the store's open keys (ledger.Store.OpenKeys) as
// "namespace/state/idempotent" → keys, zero rows left out.
func OpenKeys(t *testing.T, s ledger.Store) map[string]int {
	t.Helper()
	rows, err := s.OpenKeys(context.Background())
	require.NoError(t, err)
	out := map[string]int{}
	for _, r := range rows {
		if r.Keys == 0 {
			continue
		}
		k := r.Namespace + "/" + string(r.State) + "/"
		if r.Idempotent {
			k += "idempotent"
		} else {
			k += "not-idempotent"
		}
		out[k] += r.Keys
	}
	return out
}

// testOpenKeys follows the count of open keys through reserve, lease end,
// takeover, commit, failure and retry, resolve, and a second namespace.
func testOpenKeys(t *testing.T, f Factory) {
	ctx := context.Background()
	l, clock := open(t, f)
	s := l.Store()
	n := ns(t, l, ledger.DefaultNamespace)
	require.Empty(t, OpenKeys(t, s), "a new ledger has no open key")

	idem := testkit.ReserveReq("idem-key-1", "exec-1")
	idem.Idempotent, idem.LeaseMS = true, i64(1000)
	r1 := testkit.MustReserve(t, n, idem)
	testkit.MustReserve(t, n, leased("pay-key-01", "exec-1", 1000))
	require.Equal(t, map[string]int{"default/reserved/idempotent": 1, "default/reserved/not-idempotent": 1},
		OpenKeys(t, s), "reserved while the leases run")

	clock.Advance(1500 * time.Millisecond)
	require.Equal(t, map[string]int{"default/interrupted/idempotent": 1, "default/interrupted/not-idempotent": 1},
		OpenKeys(t, s), "interrupted once the leases have ended, with nothing appended")

	take := testkit.ReserveReq("idem-key-1", "exec-2")
	take.Idempotent = true
	r2 := testkit.MustReserve(t, n, take)
	require.True(t, r2.Takeover)
	require.Equal(t, map[string]int{"default/reserved/idempotent": 1, "default/interrupted/not-idempotent": 1},
		OpenKeys(t, s), "a takeover reserves the key again")
	require.Equal(t, ledger.ECodeStaleReservation, commitCode(n, testkit.Succeed("idem-key-1", r1.Reservation)))
	require.Equal(t, map[string]int{"default/reserved/idempotent": 1, "default/interrupted/not-idempotent": 1},
		OpenKeys(t, s), "a refused commit changes nothing")
	testkit.MustCommit(t, n, testkit.Fail("idem-key-1", r2.Reservation, true))
	require.Equal(t, map[string]int{"default/interrupted/not-idempotent": 1}, OpenKeys(t, s), "a commit closes the key")
	retry := testkit.ReserveReq("idem-key-1", "exec-2")
	retry.Idempotent, retry.Attempt = true, i64(2)
	r3 := testkit.MustReserve(t, n, retry)
	require.True(t, r3.Retry)
	require.Equal(t, map[string]int{"default/reserved/idempotent": 1, "default/interrupted/not-idempotent": 1},
		OpenKeys(t, s), "a retry after a failure reserves the key again")
	testkit.MustCommit(t, n, testkit.Succeed("idem-key-1", r3.Reservation))
	_, err := n.Reserve(ctx, retry)
	require.NoError(t, err, "a replay")
	require.Equal(t, map[string]int{"default/interrupted/not-idempotent": 1}, OpenKeys(t, s), "a replay opens nothing")

	require.NoError(t, l.CreateNamespace(ctx, "payments", ledger.NamespaceSettings{}))
	p := ns(t, l, "payments")
	rl := testkit.MustReserve(t, p, leased("pay-key-02", "exec-1", 1000))
	require.Equal(t, map[string]int{"default/interrupted/not-idempotent": 1, "payments/reserved/not-idempotent": 1},
		OpenKeys(t, s), "counted by namespace")
	clock.Advance(2 * time.Second)
	require.Equal(t, map[string]int{"default/interrupted/not-idempotent": 1, "payments/interrupted/not-idempotent": 1},
		OpenKeys(t, s))
	_, err = p.Commit(ctx, testkit.Succeed("pay-key-02", rl.Reservation))
	require.NoError(t, err, "a late commit of the current reservation")
	_, err = n.Resolve(ctx, ledger.ResolveRequest{IdempotencyKey: "pay-key-01", Outcome: chain.OutcomeSucceeded,
		ExternalRef: "bank-1", Note: "checked the bank", Actor: "ops"})
	require.NoError(t, err)
	require.Empty(t, OpenKeys(t, s), "a resolve closes the key a person waited on")
}
