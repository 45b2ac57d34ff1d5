package test

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPrune_underLoad (SPEC §16: "no reserve or commit waits more than a
// second"): 32 clients reserve and commit new keys in a namespace while
// it is pruned through 5,201 receipts. Every request is answered 201, and
// none takes a second or more, while the prune runs (from its POST to
// the end of its deletion) as before it; the p50, p99 and maximum of
// both are logged (BENCHMARKS.md). On SQLite and PostgreSQL.
func TestPrune_underLoad(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testPruneUnderLoad)
}

const (
	loadClients = 32
	loadPairs   = 2600 // receipts 2 … 5,201
)

func testPruneUnderLoad(t *testing.T, db string) {
	clock := newTestClock(t, t0)
	key, vkey := keygen(t, t.TempDir(), "ex.test")
	l := clock.start(t, db, "--signing-key", key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms",
		"--archive-dir", t.TempDir(), "--prune-interval", "0")
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"busy","key_ttl_ms":60000}`).Status)
	require.Equal(t, 200, l.Do("PUT", "/v1/namespaces/busy/policy", `{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`).Status)
	appendPairs(t, l, "/v1/ns/busy", "old", loadPairs)
	head := num(t, l.Do("GET", "/v1/ns/busy/head", "").Body, "seq")
	clock.advance(3 * time.Minute) // the keys written so far age; those of the load stay young
	waitCheckpointNS(t, l, vkey, "busy", head)

	w := startTimedLoad(l.URL+"/v1/ns/busy", loadClients)
	t.Cleanup(w.stop)
	// Before the prune: the same load, for as many requests as the
	// clients make in three seconds.
	time.Sleep(3 * time.Second)
	pruneFrom := time.Now()
	r := l.Do("POST", "/v1/ns/busy/prune", `{}`)
	require.Equal(t, 201, r.Status, r.Raw)
	require.Equal(t, float64(head), r.Body["through"], r.Raw)
	var st Resp
	require.Eventually(t, func() bool {
		st = l.Do("GET", "/v1/ns/busy/prune", "")
		return st.Status == 200 && st.Body["kept_through"] == float64(head)
	}, 60*time.Second, 20*time.Millisecond, "the deletion ends: %s", st.Raw)
	pruneTo := time.Now()
	w.stop()

	var before, during []time.Duration
	for _, s := range w.samples() {
		switch {
		case s.start.Before(pruneFrom):
			before = append(before, s.took)
		case s.start.Before(pruneTo):
			during = append(during, s.took)
		}
	}
	t.Logf("prune of %d receipts under %d clients: %s from its POST to the end of its deletion", head, loadClients, pruneTo.Sub(pruneFrom).Round(time.Millisecond))
	t.Logf("reserve or commit before the prune: %s", latencies(before))
	t.Logf("reserve or commit during the prune: %s", latencies(during))
	require.Zero(t, w.failed.Load(), "requests not answered 201: %s", w.firstFailure())
	require.NotEmpty(t, before)
	require.NotEmpty(t, during)
	assert.Less(t, slices.Max(during), time.Second, "no reserve or commit waits a second while a prune runs: %s", latencies(during))
	assert.Less(t, slices.Max(before), time.Second, "nor without it: %s", latencies(before))
	assert.Equal(t, 410, l.Do("GET", "/v1/ns/busy/effects/old-0007", "").Status)
}

// timedLoad is clients reserving and committing new keys, each request
// timed.
type timedLoad struct {
	quit    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	mu      sync.Mutex
	all     []sample
	failed  atomic.Int32
	failure atomic.Value // the first failure, a string
}

// sample is one request: when it was sent and how long its answer took.
type sample struct {
	start time.Time
	took  time.Duration
}

// startTimedLoad starts clients on the namespace routes v1, each with
// its own connection.
func startTimedLoad(v1 string, clients int) *timedLoad {
	w := &timedLoad{quit: make(chan struct{})}
	for c := range clients {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: time.Minute}
			defer hc.CloseIdleConnections()
			var mine []sample
			defer func() { w.mu.Lock(); w.all = append(w.all, mine...); w.mu.Unlock() }()
			timed := func(url, body string) (int, string) {
				start := time.Now()
				res, err := hc.Post(url, "application/json", strings.NewReader(body))
				if err != nil {
					return 0, err.Error()
				}
				b, err := io.ReadAll(res.Body)
				_ = res.Body.Close()
				mine = append(mine, sample{start, time.Since(start)})
				if err != nil {
					return 0, err.Error()
				}
				return res.StatusCode, string(b)
			}
			for i := 0; ; i++ {
				select {
				case <-w.quit:
					return
				default:
				}
				key := fmt.Sprintf("load-%02d-%06d", c, i)
				st, b := timed(v1+"/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e1","tool":"mail.send","effect":"write"}`)
				if st == 201 {
					st, b = timed(v1+"/effects/"+key+"/commit", `{"reservation":"`+field([]byte(b), "reservation")+`","outcome":"succeeded"}`)
				}
				if st != 201 {
					w.failed.Add(1)
					w.failure.CompareAndSwap(nil, fmt.Sprintf("%s: %d %s", key, st, b))
				}
			}
		}()
	}
	return w
}

// stop stops the clients and waits for them; later calls do nothing.
func (w *timedLoad) stop() { w.once.Do(func() { close(w.quit); w.wg.Wait() }) }

// samples returns every request timed (after stop).
func (w *timedLoad) samples() []sample {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.all)
}

func (w *timedLoad) firstFailure() string {
	s, _ := w.failure.Load().(string)
	return s
}

// latencies describes ds: their number, p50, p99 and maximum.
func latencies(ds []time.Duration) string {
	if len(ds) == 0 {
		return "no requests"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[int(p*float64(len(s)-1))].Round(100 * time.Microsecond) }
	return fmt.Sprintf("%d requests, p50 %s, p99 %s, max %s", len(s), q(0.50), q(0.99), s[len(s)-1].Round(100*time.Microsecond))
}
