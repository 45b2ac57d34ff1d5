package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// waitReply is a reply to a waiting reserve.
type waitReply struct {
	status  int
	header  http.Header
	body    map[string]any
	err     error
	elapsed time.Duration
}

func (r waitReply) code() string { return response{body: r.body}.code() }

// postWait posts body to the reserve route with ctx and returns the reply
// on a channel.
// waitCtx is a context that ends with the test. Called after the server
// is set up, its cleanup runs before the server's: a failed assertion
// ends the waits instead of leaving srv.Close to wait them out.
func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

func postWait(ctx context.Context, hc *http.Client, url, body string) <-chan waitReply {
	out := make(chan waitReply, 1)
	go func() {
		start := time.Now()
		var r waitReply
		defer func() { r.elapsed = time.Since(start); out <- r }()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/effects/reserve", strings.NewReader(body))
		if err != nil {
			r.err = err
			return
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := hc.Do(req)
		if err != nil {
			r.err = err
			return
		}
		defer res.Body.Close()
		raw, err := io.ReadAll(res.Body)
		r.status, r.header, r.err = res.StatusCode, res.Header, err
		if err == nil {
			r.err = json.Unmarshal(raw, &r.body)
		}
	}()
	return out
}

// waitBody is a reserve body for exec with wait_ms.
func waitBody(exec string, waitMS int, extra string) string {
	return fmt.Sprintf(`{"idempotency_key":"refund-order-1234","execution_id":%q,"tool":"payments.refund","effect":"write","input":{"order":7},"wait_ms":%d%s}`,
		exec, waitMS, extra)
}

// reserveToken reserves body and returns the reservation token.
func reserveToken(t *testing.T, srv *httptest.Server, body string) string {
	t.Helper()
	r := do(t, srv, "POST", "/v1/effects/reserve", body)
	require.Equal(t, 201, r.status, r.raw)
	return r.body["reservation"].(string)
}

func awaitReply(t *testing.T, ch <-chan waitReply, d time.Duration) waitReply {
	t.Helper()
	select {
	case r := <-ch:
		require.NoError(t, r.err)
		return r
	case <-time.After(d):
		t.Fatalf("no reply within %s", d)
		return waitReply{}
	}
}

// awaitParked waits until n reserves are parked, or one has answered.
func awaitParked(t *testing.T, db *ledgertest.DB, n int, ch <-chan waitReply) {
	t.Helper()
	require.Eventually(t, func() bool { return db.Ledger.Waiting() >= n || len(ch) > 0 }, 60*time.Second, time.Millisecond)
}

// TestServer_Reserve_wait drives each outcome of SPEC §8 over HTTP.
func TestServer_Reserve_wait(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		desc       string
		idempotent bool
		leaseMS    int
		waitMS     int
		commit     string // outcome and extra commit fields; "" commits nothing
		wantStatus int
		wantErr    string
		check      func(t *testing.T, r waitReply)
	}{
		{desc: "OK replayed after success", commit: `succeeded","external_ref":"re_9"`, waitMS: 30_000, wantStatus: 200,
			check: func(t *testing.T, r waitReply) {
				assert.Equal(t, "replayed", r.body["status"])
				assert.Equal(t, "re_9", r.body["external_ref"])
				assert.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
			}},
		{desc: "OK retry after a retryable failure", idempotent: true, commit: `failed","error":{"code":"TIMEOUT","retryable":true}`,
			waitMS: 30_000, wantStatus: 201, check: func(t *testing.T, r waitReply) {
				assert.Equal(t, true, r.body["retry"])
				assert.NotEmpty(t, r.body["reservation"])
			}},
		{desc: "ErrRetryNotAllowed after a final failure", idempotent: true, commit: `failed","error":{"code":"DECLINED"}`,
			waitMS: 30_000, wantStatus: 409, wantErr: "retry_not_allowed"},
		{desc: "OK takeover at the lease's end", idempotent: true, leaseMS: 300, waitMS: 30_000, wantStatus: 201,
			check: func(t *testing.T, r waitReply) {
				assert.Equal(t, true, r.body["takeover"])
				assert.Less(t, r.elapsed, 25*time.Second, "at the lease's end, not the wait's")
			}},
		{desc: "ErrUnsafeResume at the lease's end", leaseMS: 300, waitMS: 30_000, wantStatus: 409, wantErr: "unsafe_resume",
			check: func(t *testing.T, r waitReply) {
				assert.Less(t, r.elapsed, 25*time.Second, "at the lease's end, not the wait's")
			}},
		{desc: "ErrInProgress when the wait runs out", waitMS: 400, wantStatus: 409, wantErr: "in_progress",
			check: func(t *testing.T, r waitReply) {
				assert.GreaterOrEqual(t, r.elapsed, 400*time.Millisecond)
				assert.NotEmpty(t, r.header.Get("Retry-After"))
			}},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			srv, db := MustOpenServer(t)
			extra := fmt.Sprintf(`,"idempotent":%t`, tt.idempotent)
			if tt.leaseMS > 0 {
				extra += fmt.Sprintf(`,"lease_ms":%d`, tt.leaseMS)
			}
			token := reserveToken(t, srv, waitBody("exec-1", 0, extra))
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel) // before the server closes, if the test fails
			ch := postWait(ctx, srv.Client(), srv.URL, waitBody("exec-2", tt.waitMS, fmt.Sprintf(`,"idempotent":%t`, tt.idempotent)))
			awaitParked(t, db, 1, ch)
			if tt.commit != "" {
				r := do(t, srv, "POST", "/v1/effects/refund-order-1234/commit", `{"reservation":"`+token+`","outcome":"`+tt.commit+`}`)
				require.Equal(t, 201, r.status, r.raw)
			}
			r := awaitReply(t, ch, 60*time.Second)
			assert.Equal(t, tt.wantStatus, r.status, "%v", r.body)
			assert.Equal(t, tt.wantErr, r.code())
			if tt.check != nil {
				tt.check(t, r)
			}
			assert.Zero(t, db.Ledger.Waiting())
		})
	}
}

// TestServer_Reserve_waitDisconnect: a client that goes away while it
// waits ends its wait, and nothing is ever appended for it.
func TestServer_Reserve_waitDisconnect(t *testing.T) {
	t.Parallel()
	srv, db := MustOpenServer(t)
	token := reserveToken(t, srv, waitBody("exec-1", 0, ""))
	ctx, cancel := context.WithCancel(context.Background())
	ch := postWait(ctx, srv.Client(), srv.URL, waitBody("exec-2", 60_000, ""))
	awaitParked(t, db, 1, ch)
	cancel()
	r := <-ch
	require.ErrorIs(t, r.err, context.Canceled)
	require.Eventually(t, func() bool { return db.Ledger.Waiting() == 0 }, 60*time.Second, time.Millisecond, "the server ends the wait")
	c := do(t, srv, "POST", "/v1/effects/refund-order-1234/commit", testkit.CommitBody(token, "succeeded", ""))
	require.Equal(t, 201, c.status, c.raw)
	// Close returns once every request's handler has: a leaked waiter,
	// woken by the commit, would have appended its replay by then.
	srv.Close()
	k, err := db.GetKey(context.Background(), "refund-order-1234")
	require.NoError(t, err)
	assert.Len(t, k.Receipts, 2, "reserve and commit only")
	assert.Equal(t, uint64(2), db.Head().Seq)
}

// TestServer_Reserve_waitInFlight: a parked reserve gives up its
// in-flight slot, so waiters beyond --max-inflight do not starve others.
func TestServer_Reserve_waitInFlight(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	s := api.NewServer(db.Ledger, api.Config{Logger: quiet, MaxInFlight: 2})
	srv := MustServe(t, s)
	token := reserveToken(t, srv, waitBody("exec-1", 0, ""))
	const n = 6
	var chans []<-chan waitReply
	for i := range n {
		// A waiter that has subscribed but not yet parked still holds its
		// slot, so the next one may briefly find none: it tries again.
		for try := 0; ; try++ {
			require.Less(t, try, 100, "waiter %d never parked", i)
			ch := postWait(waitCtx(t), srv.Client(), srv.URL, waitBody(fmt.Sprintf("exec-w%d", i), 30_000, ""))
			awaitParked(t, db, i+1, ch)
			if len(ch) == 0 {
				chans = append(chans, ch)
				break
			}
			r := <-ch
			require.NoError(t, r.err)
			require.Equal(t, 503, r.status, "%v", r.body)
			time.Sleep(10 * time.Millisecond)
		}
	}
	assert.Equal(t, n, db.Ledger.Waiting())
	require.Eventually(t, func() bool { return do(t, srv, "GET", "/v1/head", "").status == 200 }, 60*time.Second,
		10*time.Millisecond, "slots are free while reserves wait")
	c := do(t, srv, "POST", "/v1/effects/refund-order-1234/commit", testkit.CommitBody(token, "succeeded", ""))
	require.Equal(t, 201, c.status, c.raw)
	for _, ch := range chans {
		r := awaitReply(t, ch, 60*time.Second)
		assert.Equal(t, 200, r.status, "%v", r.body)
	}
	assert.Equal(t, uint64(2+n), db.Head().Seq)
}

// TestServer_Reserve_waitDeadlines: a wait longer than the server's read
// and write timeouts is not cut off by them.
func TestServer_Reserve_waitDeadlines(t *testing.T) {
	t.Parallel()
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	srv := httptest.NewUnstartedServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	srv.Config.ReadTimeout, srv.Config.WriteTimeout = 300*time.Millisecond, 300*time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)
	token := reserveToken(t, srv, waitBody("exec-1", 0, ""))
	ch := postWait(waitCtx(t), srv.Client(), srv.URL, waitBody("exec-2", 5_000, ""))
	awaitParked(t, db, 1, ch)
	testkit.ReadTimeoutPassed(t, srv.Listener.Addr().String()) // past both timeouts
	require.Equal(t, 1, db.Ledger.Waiting(), "still waiting")
	c := do(t, srv, "POST", "/v1/effects/refund-order-1234/commit", testkit.CommitBody(token, "succeeded", ""))
	require.Equal(t, 201, c.status, c.raw)
	r := awaitReply(t, ch, 60*time.Second)
	assert.Equal(t, 200, r.status)
	assert.Equal(t, "replayed", r.body["status"])
}

// TestServer_Reserve_thousandWaiters parks 1,000 reserves on one key;
// one commit answers all of them with the replay, and goroutines and heap
// return to their baseline afterwards.
func TestServer_Reserve_thousandWaiters(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 connections")
	}
	db := ledgertest.Open(t, ledgertest.WithNow(time.Now))
	// One address sends all the waiters at once: its per-client bound
	// would refuse those that have not parked yet.
	s := api.NewServer(db.Ledger, api.Config{Logger: quiet, MaxInFlightPerClient: -1})
	srv := MustServe(t, s)
	wctx := waitCtx(t) // one context for all: the heap is measured before the cleanups
	token := reserveToken(t, srv, waitBody("exec-1", 0, ""))
	tr := &http.Transport{DisableKeepAlives: true}
	hc := &http.Client{Transport: tr}

	const n = 1000
	primeGoroutines(6 * n)
	baseG, baseHeap := settle()
	chans := make([]<-chan waitReply, n)
	for i := range n {
		chans[i] = postWait(wctx, hc, srv.URL, waitBody(fmt.Sprintf("exec-w%04d", i), 60_000, ""))
	}
	require.Eventually(t, func() bool { return db.Ledger.Waiting() == n }, 60*time.Second, 10*time.Millisecond, "all parked")
	peakG := runtime.NumGoroutine()
	c := do(t, srv, "POST", "/v1/effects/refund-order-1234/commit", testkit.CommitBody(token, "succeeded", `,"result":{"ok":true}`))
	require.Equal(t, 201, c.status, c.raw)
	original := c.body["receipt"]
	var wg sync.WaitGroup
	seqs := make(map[float64]bool, n)
	var mu sync.Mutex
	for _, ch := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := awaitReply(t, ch, 60*time.Second)
			if assert.Equal(t, 200, r.status, "%v", r.body) {
				assert.Equal(t, original, r.body["original"])
				assert.Equal(t, map[string]any{"ok": true}, r.body["result"])
				mu.Lock()
				seqs[r.body["receipt"].(map[string]any)["seq"].(float64)] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.Len(t, seqs, n, "one replay receipt each")
	assert.Zero(t, db.Ledger.Waiting())
	assert.Equal(t, uint64(2+n), db.Head().Seq)

	chans, seqs = nil, nil
	tr.CloseIdleConnections()
	srv.Client().Transport.(*http.Transport).CloseIdleConnections()
	var g int
	var heap uint64
	require.Eventually(t, func() bool {
		g, heap = settle()
		return g <= baseG+10
	}, 60*time.Second, 100*time.Millisecond, "goroutines back to baseline %d (peak %d)", baseG, peakG)
	t.Logf("goroutines: baseline %d, peak %d, after %d; heap: baseline %d KiB, after %d KiB", baseG, peakG, g, baseHeap>>10, heap>>10)
	assert.Greater(t, peakG, baseG+n, "the waiters were concurrent")
	assert.Less(t, heap, baseHeap+1<<20, "heap back to baseline")
}

// primeGoroutines runs n goroutines at once and lets them end. The runtime
// keeps the descriptors of dead goroutines for reuse (about 3.5 MB for
// 5,000): primed before the baseline, they do not count as growth.
func primeGoroutines(n int) {
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() { defer wg.Done(); <-release }()
	}
	close(release)
	wg.Wait()
}

// settle collects garbage and returns the goroutine count and live heap.
func settle() (int, uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return runtime.NumGoroutine(), ms.HeapAlloc
}
