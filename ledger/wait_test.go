package ledger_test

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

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// waitResult is what a waiting Reserve returned and how long it took.
type waitResult struct {
	res     *ledger.ReserveResult
	err     error
	elapsed time.Duration
}

// startWaiter reserves req with wait_ms in a goroutine and returns once
// the request has subscribed to its key's end: a commit from then on
// reaches it, whether it comes before or after its decision to wait.
func startWaiter(tb testing.TB, ctx context.Context, db *ledgertest.DB, req ledger.ReserveRequest, waitMS int64) <-chan waitResult {
	tb.Helper()
	before := db.Ledger.Waiting()
	req.WaitMS = i64(waitMS)
	out := make(chan waitResult, 1)
	go func() {
		start := time.Now()
		res, err := db.Reserve(ctx, req)
		out <- waitResult{res, err, time.Since(start)}
	}()
	// A short lease may end and answer the waiter before the test sees
	// it parked: an answer counts as having parked.
	require.Eventually(tb, func() bool { return db.Ledger.Waiting() > before || len(out) > 0 }, 5*time.Second, time.Millisecond, "waiter parked")
	return out
}

// receive returns the waiter's result, failing after d.
func receive(tb testing.TB, ch <-chan waitResult, d time.Duration) waitResult {
	tb.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		tb.Fatalf("waiter did not answer within %s", d)
		return waitResult{}
	}
}

// TestNamespace_Reserve_wait walks the outcomes of SPEC §8: the waiter decides
// again as soon as the holder's reservation ends, by commit or by lease.
func TestNamespace_Reserve_wait(t *testing.T) {
	ctx := context.Background()
	t.Run("OK commit succeeded replays", func(t *testing.T) {
		db := ledgertest.Open(t)
		held := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		w := startWaiter(t, ctx, db, testkit.ReserveReq(key, "exec-2"), 30_000)
		ledgertest.MustCommit(t, db, testkit.Succeed(key, held.Reservation))
		r := receive(t, w, 5*time.Second)
		require.NoError(t, r.err)
		assert.Equal(t, ledger.StatusReplayed, r.res.Status)
		assert.Equal(t, "re_1", r.res.ExternalRef)
		assert.JSONEq(t, `{"amount":1200}`, r.res.Result)
		assert.Equal(t, uint64(2), r.res.Original.Seq)
		assert.Equal(t, uint64(3), r.res.Receipt.Seq)
		assert.Less(t, r.elapsed, 5*time.Second)
		assert.Zero(t, db.Ledger.Waiting())
		all := ledgertest.VerifyChain(t, db)
		assert.Equal(t, chain.KindReplay, all[2].Kind)
		assert.Equal(t, "exec-2", all[2].ExecutionID)
	})
	t.Run("OK failed retryable and idempotent retries", func(t *testing.T) {
		db := ledgertest.Open(t)
		req := testkit.ReserveReq(key, "exec-1")
		req.Idempotent = true
		held := ledgertest.MustReserve(t, db, req)
		req.ExecutionID = "exec-2"
		w := startWaiter(t, ctx, db, req, 30_000)
		ledgertest.MustCommit(t, db, testkit.Fail(key, held.Reservation, true))
		r := receive(t, w, 5*time.Second)
		require.NoError(t, r.err)
		assert.Equal(t, ledger.StatusReserved, r.res.Status)
		assert.True(t, r.res.Retry)
		assert.NotEmpty(t, r.res.Reservation)
		assert.Equal(t, uint64(3), r.res.Receipt.Seq)
	})
	t.Run("ErrRetryNotAllowed failed otherwise", func(t *testing.T) {
		db := ledgertest.Open(t)
		held := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		w := startWaiter(t, ctx, db, testkit.ReserveReq(key, "exec-2"), 30_000)
		ledgertest.MustCommit(t, db, testkit.Fail(key, held.Reservation, true)) // retryable, but not idempotent
		r := receive(t, w, 5*time.Second)
		assert.Equal(t, ledger.ECodeRetryNotAllowed, ledger.ErrorCode(r.err))
		assert.Equal(t, uint64(2), db.Head().Seq, "nothing appended")
	})
	t.Run("OK lease ends, idempotent takes over", func(t *testing.T) {
		db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
		req := testkit.ReserveReq(key, "exec-1")
		req.Idempotent, req.LeaseMS = true, i64(300)
		ledgertest.MustReserve(t, db, req)
		req.ExecutionID, req.LeaseMS = "exec-2", nil
		w := startWaiter(t, ctx, db, req, 30_000)
		r := receive(t, w, 5*time.Second)
		require.NoError(t, r.err)
		assert.True(t, r.res.Takeover)
		assert.Equal(t, uint64(2), db.Head().Seq)
		assert.Less(t, r.elapsed, 3*time.Second, "woken at the lease's end, not at wait_ms")
	})
	t.Run("ErrUnsafeResume lease ends, not idempotent", func(t *testing.T) {
		db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
		req := testkit.ReserveReq(key, "exec-1")
		req.LeaseMS = i64(300)
		ledgertest.MustReserve(t, db, req)
		w := startWaiter(t, ctx, db, testkit.ReserveReq(key, "exec-2"), 30_000)
		r := receive(t, w, 5*time.Second)
		assert.Equal(t, ledger.ECodeUnsafeResume, ledger.ErrorCode(r.err))
		assert.Less(t, r.elapsed, 3*time.Second)
		assert.Equal(t, uint64(1), db.Head().Seq)
	})
	t.Run("ErrInProgress still reserved when the wait ends", func(t *testing.T) {
		db := ledgertest.Open(t)
		ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		w := startWaiter(t, ctx, db, testkit.ReserveReq(key, "exec-2"), 300)
		r := receive(t, w, 5*time.Second)
		var de *ledger.Error
		require.ErrorAs(t, r.err, &de)
		assert.Equal(t, ledger.ECodeInProgress, de.Code)
		assert.Positive(t, de.RetryAfter)
		assert.GreaterOrEqual(t, r.elapsed, 300*time.Millisecond)
		assert.Less(t, r.elapsed, 3*time.Second)
		assert.Zero(t, db.Ledger.Waiting())
		assert.Equal(t, uint64(1), db.Head().Seq)
	})
	t.Run("OK a takeover by another waiter is waited on in turn", func(t *testing.T) {
		db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
		req := testkit.ReserveReq(key, "exec-1")
		req.Idempotent, req.LeaseMS = true, i64(200)
		ledgertest.MustReserve(t, db, req)
		// exec-2 takes over at the lease's end; exec-3, waiting too,
		// then finds exec-2's reservation and waits for its commit.
		req.ExecutionID, req.LeaseMS = "exec-2", i64(30_000)
		w2 := startWaiter(t, ctx, db, req, 30_000)
		req.ExecutionID = "exec-3"
		w3 := startWaiter(t, ctx, db, req, 30_000)
		var first waitResult
		var other <-chan waitResult
		select { // one takes over, the other waits on
		case first = <-w2:
			other = w3
		case first = <-w3:
			other = w2
		case <-time.After(5 * time.Second):
			t.Fatal("no takeover at the lease's end")
		}
		require.NoError(t, first.err)
		require.True(t, first.res.Takeover)
		require.Eventually(t, func() bool { return db.Ledger.Waiting() == 1 }, 5*time.Second, time.Millisecond)
		ledgertest.MustCommit(t, db, testkit.Succeed(key, first.res.Reservation))
		r := receive(t, other, 5*time.Second)
		require.NoError(t, r.err)
		assert.Equal(t, ledger.StatusReplayed, r.res.Status)
	})
	t.Run("OK without wait_ms nothing waits", func(t *testing.T) {
		db := ledgertest.Open(t)
		ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		req := testkit.ReserveReq(key, "exec-2")
		req.WaitMS = i64(0)
		_, err := db.Reserve(ctx, req)
		assert.Equal(t, ledger.ECodeInProgress, ledger.ErrorCode(err))
	})
}

// TestNamespace_Reserve_waitCancel: a waiter whose context ends stops waiting at
// once, leaves no trace in the registry and appends nothing, even when
// the key succeeds afterwards.
func TestNamespace_Reserve_waitCancel(t *testing.T) {
	db := ledgertest.Open(t)
	held := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
	ctx, cancel := context.WithCancel(context.Background())
	w := startWaiter(t, ctx, db, testkit.ReserveReq(key, "exec-2"), 60_000)
	cancel()
	r := receive(t, w, 2*time.Second)
	assert.ErrorIs(t, r.err, context.Canceled)
	assert.Zero(t, db.Ledger.Waiting())
	ledgertest.MustCommit(t, db, testkit.Succeed(key, held.Reservation))
	all := ledgertest.VerifyChain(t, db)
	require.Len(t, all, 2)
	assert.Equal(t, []string{chain.KindReserve, chain.KindCommit}, []string{all[0].Kind, all[1].Kind})
}

// TestNamespace_Reserve_waitNoLostWakeup races commits against waiters that are
// just starting: a commit that lands between a waiter's decision and its
// wait must still wake it.
func TestNamespace_Reserve_waitNoLostWakeup(t *testing.T) {
	db := ledgertest.Open(t)
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		k := fmt.Sprintf("race-key-%04d", i)
		held := ledgertest.MustReserve(t, db, testkit.ReserveReq(k, "exec-1"))
		wg.Add(2)
		go func() {
			defer wg.Done()
			req := testkit.ReserveReq(k, "exec-2")
			req.WaitMS = i64(60_000)
			start := time.Now()
			res, err := db.Reserve(context.Background(), req)
			if assert.NoError(t, err, k) {
				assert.Equal(t, ledger.StatusReplayed, res.Status, k)
			}
			assert.Less(t, time.Since(start), 20*time.Second, "%s: woken by the commit", k)
		}()
		go func() {
			defer wg.Done()
			_, err := db.Commit(context.Background(), testkit.Succeed(k, held.Reservation))
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	assert.Zero(t, db.Ledger.Waiting())
	ledgertest.VerifyChain(t, db)
}

// TestNamespace_Reserve_waitLimit: beyond MaxWaiters a reserve is answered at
// once, as without wait_ms.
func TestNamespace_Reserve_waitLimit(t *testing.T) {
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now), ledgertest.WithConfig(ledger.Config{MaxWaiters: 1}))
	ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := startWaiter(t, ctx, db, testkit.ReserveReq(key, "exec-2"), 60_000)
	req := testkit.ReserveReq(key, "exec-3")
	req.WaitMS = i64(60_000)
	start := time.Now()
	_, err := db.Reserve(context.Background(), req)
	assert.Equal(t, ledger.ECodeInProgress, ledger.ErrorCode(err))
	assert.Less(t, time.Since(start), 2*time.Second)
	cancel()
	receive(t, w, 2*time.Second)
}

// TestLedger_EndWaits: parked reserves answer at once when the server begins
// to stop, and later ones do not wait.
func TestLedger_EndWaits(t *testing.T) {
	db := ledgertest.Open(t)
	ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
	w := startWaiter(t, context.Background(), db, testkit.ReserveReq(key, "exec-2"), 60_000)
	db.Ledger.EndWaits()
	r := receive(t, w, 2*time.Second)
	assert.Equal(t, ledger.ECodeInProgress, ledger.ErrorCode(r.err))
	req := testkit.ReserveReq(key, "exec-3")
	req.WaitMS = i64(60_000)
	start := time.Now()
	_, err := db.Reserve(context.Background(), req)
	assert.Equal(t, ledger.ECodeInProgress, ledger.ErrorCode(err))
	assert.Less(t, time.Since(start), time.Second)
	assert.Zero(t, db.Ledger.Waiting())
}

// parker counts Park and Resume calls; resumeErr fails Resume.
type parker struct {
	parks, resumes atomic.Int32
	resumeErr      error
}

func (p *parker) Park() { p.parks.Add(1) }

// parked waits until the request has parked: startWaiter sees it subscribed to its key, which
// comes before its decision, and a commit before the decision is answered without a wait.
func (p *parker) parked(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool { return p.parks.Load() > 0 }, 5*time.Second, time.Millisecond, "parked")
}

func (p *parker) Resume(context.Context) error {
	p.resumes.Add(1)
	return p.resumeErr
}

// TestNamespace_Reserve_waitParker: the request's Parker is told around each
// wait, and an error from Resume ends the request without a decision.
func TestNamespace_Reserve_waitParker(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		db := ledgertest.Open(t)
		held := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		p := &parker{}
		ctx := ledger.NewContextWithParker(context.Background(), p)
		w := startWaiter(t, ctx, db, testkit.ReserveReq(key, "exec-2"), 30_000)
		p.parked(t) // the commit must come after the decision to wait
		ledgertest.MustCommit(t, db, testkit.Succeed(key, held.Reservation))
		r := receive(t, w, 5*time.Second)
		require.NoError(t, r.err)
		assert.Equal(t, int32(1), p.parks.Load())
		assert.Equal(t, int32(1), p.resumes.Load())
	})
	t.Run("ErrResume", func(t *testing.T) {
		db := ledgertest.Open(t)
		held := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		boom := errors.New("no slot")
		p := &parker{resumeErr: boom}
		ctx := ledger.NewContextWithParker(context.Background(), p)
		w := startWaiter(t, ctx, db, testkit.ReserveReq(key, "exec-2"), 30_000)
		p.parked(t)
		ledgertest.MustCommit(t, db, testkit.Succeed(key, held.Reservation))
		r := receive(t, w, 5*time.Second)
		assert.ErrorIs(t, r.err, boom)
		assert.Equal(t, uint64(2), db.Head().Seq, "no replay appended")
	})
}
