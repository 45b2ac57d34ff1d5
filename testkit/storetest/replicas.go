package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// openPair opens two ledgers on one database (two replicas) with one
// test clock.
type openPair func(t *testing.T) (*ledger.Ledger, *ledger.Ledger, *testkit.Clock)

// RunReplicas runs the cases that need two writers on one database.
func RunReplicas(t *testing.T, f ReplicaFactory) {
	open2 := func(t *testing.T) (*ledger.Ledger, *ledger.Ledger, *testkit.Clock) {
		clock := testkit.NewClock()
		sa, sb := f(t, clock.Now)
		a := ledger.New(sa, ledger.Config{Now: clock.Now})
		b := ledger.New(sb, ledger.Config{Now: clock.Now})
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		return a, b, clock
	}
	for _, c := range []struct {
		name string
		run  func(*testing.T, openPair)
	}{
		{"OneWinnerAcrossReplicas", replicasOneWinnerAcrossReplicas},
		{"NoForkUnderMixedLoad", replicasNoForkUnderMixedLoad},
		{"TakeoverOnTheOtherReplica", replicasTakeoverOnTheOtherReplica},
		{"WaitWakesAcrossReplicas", replicasWaitWakesAcrossReplicas},
		{"RevocationAcrossReplicas", replicasRevocationAcrossReplicas},
		{"OpenKeysAcrossReplicas", replicasOpenKeysAcrossReplicas},
		{"StateKeyAcrossReplicas", replicasStateKey},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, open2) })
	}
}

func replicasOneWinnerAcrossReplicas(t *testing.T, open2 openPair) {
	a, b, _ := open2(t)
	na, nb := ns(t, a, ledger.DefaultNamespace), ns(t, b, ledger.DefaultNamespace)
	var won atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		n := na
		if i%2 == 1 {
			n = nb
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := n.Reserve(context.Background(), testkit.ReserveReq("contended-key", fmt.Sprintf("exec-%d", i)))
			if err == nil {
				won.Add(1)
			} else if code(err) != ledger.ECodeInProgress {
				t.Errorf("reserve: %v", err)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int64(1), won.Load())
	verifyClean(t, na, 1)
}

func replicasNoForkUnderMixedLoad(t *testing.T, open2 openPair) {
	a, b, _ := open2(t)
	require.NoError(t, a.CreateNamespace(context.Background(), "other", ledger.NamespaceSettings{}))
	var total, other uint64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, l := range []*ledger.Ledger{a, b} {
		for _, name := range []string{ledger.DefaultNamespace, "other"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				k := load(t, ns(t, l, name), 6, 20, fmt.Sprintf("r%d-%s", i, name))
				mu.Lock()
				defer mu.Unlock()
				if name == "other" {
					other += k
				} else {
					total += k
				}
			}()
		}
	}
	wg.Wait()
	verifyClean(t, ns(t, a, ledger.DefaultNamespace), total)
	verifyClean(t, ns(t, b, "other"), other)
}

func replicasTakeoverOnTheOtherReplica(t *testing.T, open2 openPair) {
	a, b, clock := open2(t)
	r := testkit.ReserveReq("lease-key-1", "exec-1")
	r.Idempotent, r.LeaseMS = true, i64(1000)
	_, err := ns(t, a, ledger.DefaultNamespace).Reserve(context.Background(), r)
	require.NoError(t, err)
	take := testkit.ReserveReq("lease-key-1", "exec-2")
	take.Idempotent = true
	_, err = ns(t, b, ledger.DefaultNamespace).Reserve(context.Background(), take)
	require.Equal(t, ledger.ECodeInProgress, code(err))
	clock.Advance(2 * time.Second)
	res, err := ns(t, b, ledger.DefaultNamespace).Reserve(context.Background(), take)
	require.NoError(t, err)
	require.True(t, res.Takeover)
}

func replicasWaitWakesAcrossReplicas(t *testing.T, open2 openPair) {
	a, b, _ := open2(t)
	r, err := ns(t, a, ledger.DefaultNamespace).Reserve(context.Background(), testkit.ReserveReq("wait-key-2", "e1"))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		w := testkit.ReserveReq("wait-key-2", "e2")
		w.WaitMS = i64(20_000)
		_, err := ns(t, b, ledger.DefaultNamespace).Reserve(context.Background(), w)
		done <- err
	}()
	require.Eventually(t, func() bool { return b.Waiting() == 1 }, 5*time.Second, 5*time.Millisecond)
	start := time.Now()
	_, err = ns(t, a, ledger.DefaultNamespace).Commit(context.Background(), testkit.Succeed("wait-key-2", r.Reservation))
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err)
		require.Less(t, time.Since(start), 2*time.Second, "woken by the other replica's commit, not by polling")
	case <-time.After(15 * time.Second):
		t.Fatal("not woken")
	}
}

func replicasRevocationAcrossReplicas(t *testing.T, open2 openPair) {
	a, b, _ := open2(t)
	tok, err := ledger.NewTokens(a.Store().Tokens()).Create(context.Background(), "gw", ledger.RoleWriter)
	require.NoError(t, err)
	_, err = b.Authenticate(context.Background(), tok)
	require.NoError(t, err)
	require.NoError(t, ledger.NewTokens(a.Store().Tokens()).Revoke(context.Background(), "gw"))
	_, err = b.Authenticate(context.Background(), tok)
	require.ErrorIs(t, err, ledger.ErrBadToken)
}

// replicasOpenKeysAcrossReplicas: a replica counts the open keys that
// another replica reserved and ended.
func replicasOpenKeysAcrossReplicas(t *testing.T, open2 openPair) {
	a, b, clock := open2(t)
	na := ns(t, a, ledger.DefaultNamespace)
	testkit.MustReserve(t, na, leased("pay-key-01", "exec-1", 1000))
	require.Equal(t, map[string]int{"default/reserved/not-idempotent": 1}, OpenKeys(t, b.Store()))
	clock.Advance(2 * time.Second)
	require.Equal(t, map[string]int{"default/interrupted/not-idempotent": 1}, OpenKeys(t, b.Store()))
	_, err := na.Resolve(context.Background(), ledger.ResolveRequest{
		IdempotencyKey: "pay-key-01", Outcome: chain.OutcomeFailed, Note: "never sent",
		Error: &ledger.FailureDetail{Code: "NOT_SENT", Message: "never sent"}})
	require.NoError(t, err)
	require.Empty(t, OpenKeys(t, b.Store()))
}
