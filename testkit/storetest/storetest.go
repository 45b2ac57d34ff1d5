// Package storetest is the conformance suite every storage driver runs:
// the SPEC §4 state machine, namespaces, races, reads, proofs, tokens and
// waits, through the domain service (ledger.New) over the driver, so that
// the domain decides and the driver only stores.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/tlog"
	"github.com/effect-ledger/effect-ledger/verify"
)

// Factory opens a new, empty store whose decisions use the clock now (the
// driver's test clock option). The store is closed by the suite.
type Factory func(t *testing.T, now func() time.Time) ledger.Store

// ReplicaFactory opens two stores on one new, empty database, as two
// ledgerd replicas would (drivers that allow several writers).
type ReplicaFactory func(t *testing.T, now func() time.Time) (a, b ledger.Store)

func open(t *testing.T, f Factory) (*ledger.Ledger, *testkit.Clock) {
	t.Helper()
	clock := testkit.NewClock()
	l := ledger.New(f(t, clock.Now), ledger.Config{Now: clock.Now})
	t.Cleanup(func() { _ = l.Close() })
	return l, clock
}

func ns(t *testing.T, l *ledger.Ledger, name string) *ledger.Namespace {
	t.Helper()
	n, err := l.NS(context.Background(), name)
	require.NoError(t, err)
	return n
}

// openDefault is open and the ledger's default namespace.
func openDefault(t *testing.T, f Factory) (*ledger.Ledger, *testkit.Clock, *ledger.Namespace) {
	t.Helper()
	l, clock := open(t, f)
	return l, clock, ns(t, l, ledger.DefaultNamespace)
}

// keyView is the key's view with the current generation's receipts.
func keyView(t *testing.T, n *ledger.Namespace, key string) *ledger.KeyView {
	t.Helper()
	v, err := n.Key(context.Background(), key, false)
	require.NoError(t, err)
	return v
}

// receipt is the receipt at seq.
func receipt(t *testing.T, n *ledger.Namespace, seq uint64) *chain.Receipt {
	t.Helper()
	r, err := n.GetReceipt(context.Background(), seq)
	require.NoError(t, err)
	return r
}

// headSeq is the seq of the namespace's head.
func headSeq(t *testing.T, n *ledger.Namespace) uint64 {
	t.Helper()
	h, err := n.Head(context.Background())
	require.NoError(t, err)
	return h.Seq
}

// audit runs the verifier over the namespace at the time now and returns
// its report, violations or not.
func audit(t *testing.T, n *ledger.Namespace, now func() time.Time) *verify.Report {
	t.Helper()
	rep, err := verify.New(auditDB(t, n), verify.Opts{Now: now}).Check(context.Background())
	require.NoError(t, err)
	return rep
}

// reserveWaiting sends r with a wait of waitMS on a goroutine of its own
// and returns the channel its result comes on.
func reserveWaiting(t *testing.T, n *ledger.Namespace, r ledger.ReserveRequest, waitMS int64) <-chan *ledger.ReserveResult {
	done := make(chan *ledger.ReserveResult, 1)
	r.WaitMS = i64(waitMS)
	go func() {
		res, err := n.Reserve(context.Background(), r)
		assert.NoError(t, err)
		done <- res
	}()
	return done
}

// woken is the result of a waiting reserve (reserveWaiting); t fails if
// it has not come within timeout, the wait not being woken by what by
// names.
func woken(t *testing.T, done <-chan *ledger.ReserveResult, timeout time.Duration, by string) *ledger.ReserveResult {
	t.Helper()
	select {
	case res := <-done:
		require.NotNil(t, res)
		return res
	case <-time.After(timeout):
		t.Fatalf("the waiting reserve was not woken by %s", by)
		return nil
	}
}

func i64(v int64) *int64 { return &v }

// leased is testkit.ReserveReq with a lease of ms milliseconds.
func leased(key, exec string, ms int64) ledger.ReserveRequest {
	r := testkit.ReserveReq(key, exec)
	r.LeaseMS = i64(ms)
	return r
}

func code(err error) string { return ledger.ErrorCode(err) }

// reserveCode is the error code of reserving r ("" when it succeeds).
func reserveCode(n *ledger.Namespace, r ledger.ReserveRequest) string {
	_, err := n.Reserve(context.Background(), r)
	return code(err)
}

// commitCode is the error code of committing c ("" when it succeeds).
func commitCode(n *ledger.Namespace, c ledger.CommitRequest) string {
	_, err := n.Commit(context.Background(), c)
	return code(err)
}

// verifyClean runs the verifier over a namespace and fails on any
// violation.
func verifyClean(t *testing.T, n *ledger.Namespace, wantReceipts uint64) {
	t.Helper()
	rep, err := verify.New(auditDB(t, n), verify.Opts{}).Check(context.Background())
	require.NoError(t, err)
	require.True(t, rep.OK, "violations: %+v", rep.Violations)
	require.Equal(t, wantReceipts, rep.Receipts)
	h, err := n.Head(context.Background())
	require.NoError(t, err)
	require.Equal(t, wantReceipts, h.Seq)
	require.Equal(t, rep.Head.Hash, h.Hash.String())
	size, err := n.TreeSize(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(wantReceipts), size, "the Merkle tree has exactly the chain's receipts")
	if size > 0 {
		root, err := sumdb.TreeHash(size, n.HashReader(context.Background()))
		require.NoError(t, err)
		hs, err := n.Reader().ReceiptHashes(context.Background(), 0, int(size))
		require.NoError(t, err)
		require.Len(t, hs, int(size))
		require.Equal(t, tlog.Hash(rfc6962Root(hs)), root, "stored tree hashes give the RFC 6962 root of the chain hashes")
	}
}

// verifyHead is verifyClean up to the namespace's head, however many
// receipts the case appended.
func verifyHead(t *testing.T, n *ledger.Namespace) {
	t.Helper()
	verifyClean(t, n, headSeq(t, n))
}

// rfc6962Root computes the Merkle root of the leaves' chain hashes
// directly (RFC 6962 §2.1), independently of the stored hashes.
func rfc6962Root(hs []chain.Hash) sumdb.Hash {
	if len(hs) == 1 {
		return tlog.LeafHash(hs[0])
	}
	k := 1
	for k*2 < len(hs) {
		k *= 2
	}
	return sumdb.NodeHash(rfc6962Root(hs[:k]), rfc6962Root(hs[k:]))
}

// Run runs the conformance suite against a driver.
func Run(t *testing.T, f Factory) {
	t.Run("ReserveCommitReplay", func(t *testing.T) { testReserveCommitReplay(t, f) })
	t.Run("LeasesAndTakeovers", func(t *testing.T) { testLeases(t, f) })
	t.Run("FailuresAndRetries", func(t *testing.T) { testFailures(t, f) })
	t.Run("Resolve", func(t *testing.T) { testResolve(t, f) })
	t.Run("Namespaces", func(t *testing.T) { testNamespaces(t, f) })
	t.Run("OneWinner", func(t *testing.T) { testOneWinner(t, f) })
	t.Run("MixedLoadVerifies", func(t *testing.T) { testMixedLoad(t, f) })
	t.Run("ContextCancelled", func(t *testing.T) { testCancelled(t, f) })
	t.Run("Reads", func(t *testing.T) { testReads(t, f) })
	t.Run("PayloadBytes", func(t *testing.T) { testPayloadBytes(t, f) })
	t.Run("Checkpoints", func(t *testing.T) { testCheckpoints(t, f) })
	t.Run("Tokens", func(t *testing.T) { testTokens(t, f) })
	t.Run("WaitWakesOnCommit", func(t *testing.T) { testWait(t, f) })
	t.Run("KeyLifetime", func(t *testing.T) { RunKeyLifetime(t, f) })
	t.Run("PrunableWatermark", func(t *testing.T) { testPrunable(t, f) })
	t.Run("Prune", func(t *testing.T) { testPrune(t, f) })
	t.Run("PruneErasure", func(t *testing.T) { testPruneErasure(t, f) })
	t.Run("PruneKeyReceipt", func(t *testing.T) { testPruneKeyReceipt(t, f) })
	t.Run("PruneRaces", func(t *testing.T) { testPruneRaces(t, f) })
	t.Run("NotApplied", func(t *testing.T) { RunNotApplied(t, f) })
	t.Run("Reconcile", func(t *testing.T) { RunReconcile(t, f) })
	t.Run("VerifyBesideWriter", func(t *testing.T) { testVerifyBesideWriter(t, f) })
	t.Run("ClockStepsBack", func(t *testing.T) { testClockStepsBack(t, f) })
	t.Run("OpenKeys", func(t *testing.T) { testOpenKeys(t, f) })
	t.Run("Approvals", func(t *testing.T) { RunApprovals(t, f) })
	t.Run("StateKey", func(t *testing.T) { testStateKey(t, f) })
	t.Run("PayloadSwitch", func(t *testing.T) { RunPayloadSwitch(t, f) })
	t.Run("OverlappingErasures", func(t *testing.T) { RunOverlappingErasures(t, f) })
	t.Run("SubjectErasesApprovals", func(t *testing.T) { RunSubjectErasesApprovals(t, f) })
	t.Run("RetentionSparesPendingAsks", func(t *testing.T) { RunRetentionSparesPendingAsks(t, f) })
	t.Run("EraseAwaitingApproval", func(t *testing.T) { RunEraseAwaitingApproval(t, f) })
	t.Run("RetentionPagesPastKept", func(t *testing.T) { RunRetentionPagesPastKept(t, f) })
	t.Run("PendingMarksMerge", func(t *testing.T) { RunPendingMarksMerge(t, f) })
}

// testClockStepsBack: a clock that steps back is held at the chain's last
// recorded_at, so recorded times never decrease within the chain and the
// leases run from the held time (ledger.Tx.Now).
func testClockStepsBack(t *testing.T, f Factory) {
	ctx := context.Background()
	_, clock, n := openDefault(t, f)
	r1 := testkit.MustReserve(t, n, testkit.ReserveReq("back-key-1", "exec-1"))
	clock.Advance(time.Minute)
	testkit.MustCommit(t, n, testkit.Succeed("back-key-1", r1.Reservation))
	held := uint64(clock.Now().UnixMilli())

	clock.Advance(-time.Hour)
	r2 := testkit.MustReserve(t, n, leased("back-key-2", "exec-2", 1000))
	assert.Equal(t, held+1000, r2.LeaseExpiresAt, "the lease runs from the held time, not from the clock an hour back")
	v, err := n.GetKey(ctx, "back-key-2")
	require.NoError(t, err)
	assert.Equal(t, ledger.StateReserved, v.State, "the lease has not ended at the held time")

	clock.Advance(time.Hour + 2*time.Second) // past the lease: the clock runs on again
	require.Equal(t, ledger.ECodeUnsafeResume, reserveCode(n, testkit.ReserveReq("back-key-2", "exec-3")), "the lease ended")

	rs, _, err := n.Reader().ListReceipts(ctx, ledger.ReceiptFilter{Limit: 100})
	require.NoError(t, err)
	require.Len(t, rs, 3)
	assert.Equal(t, held, rs[2].RecordedAt, "recorded at the held time")
	for i := 1; i < len(rs); i++ {
		assert.GreaterOrEqual(t, rs[i].RecordedAt, rs[i-1].RecordedAt, "seq %d recorded before seq %d", rs[i].Seq, rs[i-1].Seq)
	}
	verifyClean(t, n, 3)
}

func testReserveCommitReplay(t *testing.T, f Factory) {
	ctx := context.Background()
	_, _, n := openDefault(t, f)
	r := testkit.MustReserve(t, n, testkit.ReserveReq("order-7-refund", "exec-1"))
	require.Equal(t, ledger.StatusReserved, r.Status)
	require.Equal(t, uint64(1), r.Receipt.Seq)

	require.Equal(t, ledger.ECodeInProgress, reserveCode(n, testkit.ReserveReq("order-7-refund", "exec-2")))

	other := testkit.ReserveReq("order-7-refund", "exec-2")
	other.Tool = "payments.charge"
	require.Equal(t, ledger.ECodeFingerprintMismatch, reserveCode(n, other))

	c := testkit.MustCommit(t, n, testkit.Succeed("order-7-refund", r.Reservation))
	require.Equal(t, uint64(2), c.Receipt.Seq)
	again := testkit.MustCommit(t, n, testkit.Succeed("order-7-refund", r.Reservation))
	require.True(t, again.Replayed, "an identical commit appends nothing")

	_, err := n.Commit(ctx, testkit.Succeed("order-7-refund", "rsv_"+fmt.Sprintf("%064x", 1)))
	require.Error(t, err)

	rp := testkit.MustReserve(t, n, testkit.ReserveReq("order-7-refund", "exec-3"))
	require.Equal(t, ledger.StatusReplayed, rp.Status)
	require.Equal(t, "re_1", rp.ExternalRef)
	require.JSONEq(t, `{"amount":1200}`, string(rp.Result))
	require.Equal(t, uint64(2), rp.Original.Seq)

	_, err = n.Commit(ctx, ledger.CommitRequest{IdempotencyKey: "never-reserved", Reservation: r.Reservation,
		Outcome: chain.OutcomeSucceeded})
	require.Equal(t, ledger.ECodeUnknownKey, code(err))

	short := testkit.ReserveReq("abc", "exec-9") // shorter than 8 bytes: replaced by a generated key
	g := testkit.MustReserve(t, n, short)
	require.True(t, g.KeyGenerated)
	verifyClean(t, n, 4)
}

func testLeases(t *testing.T, f Factory) {
	ctx := context.Background()
	_, clock, n := openDefault(t, f)
	idem := testkit.ReserveReq("idem-key-1", "exec-1")
	idem.Idempotent, idem.LeaseMS = true, i64(1000)
	r1 := testkit.MustReserve(t, n, idem)
	clock.Advance(1500 * time.Millisecond)
	take := testkit.ReserveReq("idem-key-1", "exec-2")
	take.Idempotent = true
	r2 := testkit.MustReserve(t, n, take)
	require.True(t, r2.Takeover)
	require.Equal(t, ledger.ECodeStaleReservation, commitCode(n, testkit.Succeed("idem-key-1", r1.Reservation)),
		"the taken-over reservation is stale")

	// An attempt not after the recorded one of the same execution.
	clock.Advance(time.Hour)
	same := testkit.ReserveReq("idem-key-1", "exec-2")
	same.Idempotent = true
	require.Equal(t, ledger.ECodeAttemptConflict, reserveCode(n, same))

	testkit.MustReserve(t, n, leased("pay-key-01", "exec-1", 1000))
	clock.Advance(2 * time.Second)
	require.Equal(t, ledger.ECodeUnsafeResume, reserveCode(n, testkit.ReserveReq("pay-key-01", "exec-2")),
		"an interrupted non-idempotent effect waits for a person")
	v, err := n.GetKey(ctx, "pay-key-01")
	require.NoError(t, err)
	require.Equal(t, ledger.StateInterrupted, v.State)
	verifyClean(t, n, 3)
}

func testFailures(t *testing.T, f Factory) {
	_, _, n := openDefault(t, f)
	a := testkit.ReserveReq("retry-key-1", "exec-1")
	a.Idempotent = true
	r := testkit.MustReserve(t, n, a)
	testkit.MustCommit(t, n, testkit.Fail("retry-key-1", r.Reservation, true))
	a.ExecutionID, a.Attempt = "exec-1", i64(2)
	r2 := testkit.MustReserve(t, n, a)
	require.True(t, r2.Retry)

	b := testkit.ReserveReq("noretry-key", "exec-1")
	rb := testkit.MustReserve(t, n, b)
	testkit.MustCommit(t, n, testkit.Fail("noretry-key", rb.Reservation, false))
	require.Equal(t, ledger.ECodeRetryNotAllowed, reserveCode(n, testkit.ReserveReq("noretry-key", "exec-2")))
	verifyClean(t, n, 5)
}

func testResolve(t *testing.T, f Factory) {
	ctx := context.Background()
	_, clock, n := openDefault(t, f)
	testkit.MustReserve(t, n, leased("resolve-key", "exec-1", 100))
	_, err := n.Resolve(ctx, ledger.ResolveRequest{IdempotencyKey: "resolve-key", Outcome: chain.OutcomeSucceeded,
		Note: "checked the bank"})
	require.Equal(t, ledger.ECodeNotInterrupted, code(err))
	clock.Advance(time.Second)
	res, err := n.Resolve(ctx, ledger.ResolveRequest{IdempotencyKey: "resolve-key", Outcome: chain.OutcomeSucceeded,
		ExternalRef: "bank-1", Note: "checked the bank", Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, ledger.StateSucceeded, res.State)
	rp := testkit.MustReserve(t, n, testkit.ReserveReq("resolve-key", "exec-2"))
	require.Equal(t, ledger.StatusReplayed, rp.Status)
	verifyClean(t, n, 3)
}

func testNamespaces(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	_, err := l.NS(ctx, "payments")
	require.Equal(t, ledger.ECodeUnknownNamespace, code(err))
	_, err = l.NS(ctx, "A!")
	require.Equal(t, ledger.ECodeInvalidRequest, code(err))
	require.Equal(t, ledger.ECodeInvalidRequest, code(l.CreateNamespace(ctx, "", ledger.NamespaceSettings{})))
	require.Equal(t, ledger.ECodeNamespaceExists, code(l.CreateNamespace(ctx, ledger.DefaultNamespace, ledger.NamespaceSettings{})))
	require.NoError(t, l.CreateNamespace(ctx, "payments", ledger.NamespaceSettings{}))
	require.NoError(t, l.CreateNamespace(ctx, "mail.v2_x-1", ledger.NamespaceSettings{}))
	require.Equal(t, ledger.ECodeNamespaceExists, code(l.CreateNamespace(ctx, "payments", ledger.NamespaceSettings{})))

	def, pay := ns(t, l, ledger.DefaultNamespace), ns(t, l, "payments")
	for i, n := range []*ledger.Namespace{def, pay, def} {
		testkit.MustReserve(t, n, testkit.ReserveReq(fmt.Sprintf("ns-key-%d", i), "e"))
	}
	// One key in two namespaces names two effects.
	r1 := testkit.MustReserve(t, def, testkit.ReserveReq("shared-key", "e"))
	r2 := testkit.MustReserve(t, pay, testkit.ReserveReq("shared-key", "e"))
	require.Equal(t, ledger.StatusReserved, r2.Status)
	require.Equal(t, uint64(2), r2.Receipt.Seq, "each namespace has its own seq 1, 2, …")
	require.Equal(t, uint64(3), r1.Receipt.Seq)

	list, err := l.Namespaces(ctx)
	require.NoError(t, err)
	names := []string{}
	for _, i := range list {
		names = append(names, i.Name)
	}
	require.Equal(t, []string{"default", "mail.v2_x-1", "payments"}, names)
	require.Equal(t, uint64(2), list[2].Head.Seq)
	verifyClean(t, def, 3)
	verifyClean(t, pay, 2)
	verifyClean(t, ns(t, l, "mail.v2_x-1"), 0)
}

func testOneWinner(t *testing.T, f Factory) {
	ctx := context.Background()
	_, _, n := openDefault(t, f)
	var won, inProgress atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := n.Reserve(ctx, testkit.ReserveReq("contended-key", fmt.Sprintf("exec-%d", i)))
			switch {
			case err == nil:
				won.Add(1)
			case code(err) == ledger.ECodeInProgress:
				inProgress.Add(1)
			default:
				t.Errorf("reserve: %v", err)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int64(1), won.Load())
	require.Equal(t, int64(63), inProgress.Load())
	verifyClean(t, n, 1)
}

// load runs workers goroutines that each reserve and commit pairs on n,
// and returns how many receipts they appended.
func load(t *testing.T, n *ledger.Namespace, workers, pairs int, prefix string) uint64 {
	ctx := context.Background()
	var appended atomic.Uint64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range pairs {
				key := fmt.Sprintf("%s-load-key-%d-%d", prefix, w, i)
				r, err := n.Reserve(ctx, testkit.ReserveReq(key, "exec"))
				if !assert.NoError(t, err) {
					return
				}
				_, err = n.Commit(ctx, testkit.Succeed(key, r.Reservation))
				if !assert.NoError(t, err) {
					return
				}
				appended.Add(2)
			}
		}()
	}
	wg.Wait()
	return appended.Load()
}

func testMixedLoad(t *testing.T, f Factory) {
	l, _ := open(t, f)
	require.NoError(t, l.CreateNamespace(context.Background(), "b", ledger.NamespaceSettings{}))
	a, b := ns(t, l, ledger.DefaultNamespace), ns(t, l, "b")
	var na, nb uint64
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); na = load(t, a, 8, 25, "a") }()
	go func() { defer wg.Done(); nb = load(t, b, 8, 25, "b") }()
	wg.Wait()
	verifyClean(t, a, na)
	verifyClean(t, b, nb)
}

func testCancelled(t *testing.T, f Factory) {
	_, _, n := openDefault(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := n.Reserve(ctx, testkit.ReserveReq("cancelled-key", "e"))
	require.ErrorIs(t, err, context.Canceled)
	// Cancelled requests spread through batches of live ones: each live
	// one commits, no cancelled one leaves anything half-written.
	var wg sync.WaitGroup
	var ok atomic.Int64
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, cancel := context.WithCancel(context.Background())
			if i%2 == 0 {
				cancel()
			} else {
				defer cancel()
			}
			_, err := n.Reserve(c, testkit.ReserveReq(fmt.Sprintf("mixed-%d", i), "e"))
			if err == nil {
				ok.Add(1)
			} else if !errors.Is(err, context.Canceled) {
				t.Errorf("reserve %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	verifyClean(t, n, uint64(ok.Load()))
	_, err = n.GetKey(context.Background(), "cancelled-key")
	require.Equal(t, ledger.ECodeUnknownKey, code(err))
}

func testWait(t *testing.T, f Factory) {
	l, _, n := openDefault(t, f)
	r := testkit.MustReserve(t, n, testkit.ReserveReq("wait-key-1", "e1"))
	done := reserveWaiting(t, n, testkit.ReserveReq("wait-key-1", "e2"), 20_000)
	require.Eventually(t, func() bool { return l.Waiting() == 1 }, 5*time.Second, 5*time.Millisecond)
	start := time.Now()
	testkit.MustCommit(t, n, testkit.Succeed("wait-key-1", r.Reservation))
	res := woken(t, done, 10*time.Second, "the commit")
	require.Equal(t, ledger.StatusReplayed, res.Status)
	require.Less(t, time.Since(start), 5*time.Second)
}

// auditDB is the namespace as the verifier reads it.
func auditDB(t *testing.T, n *ledger.Namespace) verify.DB {
	t.Helper()
	return n.Audit()
}
