package test

import (
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
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
// it is pruned through 1,401 receipts. Every request is answered 201, and
// none takes a second or more, while the prune runs (from its POST to
// the end of its deletion) as before it; the p50, p99 and maximum of
// both are logged (BENCHMARKS.md). On SQLite and PostgreSQL.
func TestPrune_underLoad(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testPruneUnderLoad)
}

const (
	loadClients = 32
	loadPairs   = 700 // receipts 2 … 1,401
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
	time.Sleep(2 * time.Second)
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

// TestPrune_fileStopsGrowing (SPEC §16: "freed SQLite pages are reused
// (the file stops growing)"), on SQLite: a ledger file holding a
// namespace never pruned (6,001 receipts, a few MB) and one with a key
// TTL and an archive policy, which the test build's short prune interval
// prunes by itself. Round by round four clients write 300 new keys there,
// the clock moves past the TTL and keep_ms, and the next scheduled prune
// deletes them while the clients write the next round's. The ledger file
// after the first prune has finished deleting and after five more differ
// by less than 10 % (unpruned, the five rounds would add about half of
// it; what a prune keeps, the hashes, is about a tenth of a receipt).
// The WAL is logged beside it, not bounded: a checkpoint resets it only
// when no reader is behind, which steady load decides.
func TestPrune_fileStopsGrowing(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	clock := newTestClock(t, t0)
	key, _ := keygen(t, t.TempDir(), "ex.test")
	l := startLedgerdEnv(t, []string{clock.env(), "LEDGERD_TEST_PRUNE_EVERY=100ms"}, db, "--signing-key", key,
		"--log-origin", "ex.test", "--checkpoint-interval", "20ms", "--archive-dir", t.TempDir())
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"base","key_ttl_ms":60000}`).Status)
	appendPairs(t, l, "/v1/ns/base", "base", 3000)
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"steady","key_ttl_ms":60000}`).Status)
	require.Equal(t, 200, l.Do("PUT", "/v1/namespaces/steady/policy", `{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`).Status)

	const perRound, rounds = 200, 6
	w := startQuotaLoad(l.URL+"/v1/ns/steady", 4)
	t.Cleanup(w.stop)
	size := func(f string) int64 {
		fi, err := os.Stat(f)
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	// The ledger's size: the file's once the WAL is checkpointed into it
	// (pages written to the WAL and not yet copied count), and its free
	// pages, which new writes reuse.
	ro, err := sql.Open("sqlite3", "file:"+db+"?mode=ro")
	require.NoError(t, err)
	defer ro.Close()
	pages := func() (total, free int64) {
		var n, pageSize int64
		require.NoError(t, ro.QueryRow(`PRAGMA page_count`).Scan(&n))
		require.NoError(t, ro.QueryRow(`PRAGMA page_size`).Scan(&pageSize))
		require.NoError(t, ro.QueryRow(`PRAGMA freelist_count`).Scan(&free))
		return n * pageSize, free * pageSize
	}
	var sizes []int64
	w.raise(perRound)
	for round := range rounds {
		w.waitDone(t)
		require.Zero(t, w.failed.Load(), "requests not answered 201: %s", w.firstFailure())
		head := num(t, l.Do("GET", "/v1/ns/steady/head", "").Body, "seq")
		clock.advance(2 * time.Minute) // this round's keys age past the TTL and keep_ms
		w.raise(perRound)              // the next round's keys, written while these are pruned
		var st Resp
		require.Eventually(t, func() bool {
			st = l.Do("GET", "/v1/ns/steady/prune", "")
			kept, _ := st.Body["kept_through"].(float64)
			return st.Status == 200 && int64(kept) >= head
		}, 60*time.Second, 20*time.Millisecond, "round %d: a scheduled prune deletes through %d: %s", round, head, st.Raw)
		total, free := pages()
		sizes = append(sizes, total)
		t.Logf("round %d: pruned through %v (%d prunes); ledger %d bytes (%d of them free pages); file %d bytes, WAL %d bytes",
			round, st.Body["kept_through"], len(st.Body["prunes"].([]any)), total, free, size(db), size(db+"-wal"))
	}
	w.stop()
	require.Zero(t, w.failed.Load(), "requests not answered 201: %s", w.firstFailure())
	first, last := sizes[0], sizes[rounds-1]
	assert.Less(t, float64(last), 1.1*float64(first), "the file stops growing: %d bytes after the first prune, %d after %d more (%v)", first, last, rounds-1, sizes)
}

// quotaLoad is clients reserving and committing new keys up to a quota
// the test raises, so that each round writes as many keys.
type quotaLoad struct {
	quit          chan struct{}
	once          sync.Once
	wg            sync.WaitGroup
	quota, issued atomic.Int64
	done          atomic.Int64
	failed        atomic.Int32
	failure       atomic.Value // the first failure, a string
}

func startQuotaLoad(v1 string, clients int) *quotaLoad {
	w := &quotaLoad{quit: make(chan struct{})}
	for range clients {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for {
				select {
				case <-w.quit:
					return
				default:
				}
				n := w.issued.Add(1)
				if n > w.quota.Load() {
					w.issued.Add(-1)
					time.Sleep(5 * time.Millisecond)
					continue
				}
				key := fmt.Sprintf("steady-%07d", n)
				st, b, err := rawPost(v1+"/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e1","tool":"mail.send","effect":"write"}`)
				if err == nil && st == 201 {
					st, b, err = rawPost(v1+"/effects/"+key+"/commit", `{"reservation":"`+field(b, "reservation")+`","outcome":"succeeded"}`)
				}
				if err != nil || st != 201 {
					w.failed.Add(1)
					w.failure.CompareAndSwap(nil, fmt.Sprintf("%s: %d %s %v", key, st, b, err))
				}
				w.done.Add(1)
			}
		}()
	}
	return w
}

// raise lets the clients write n more keys.
func (w *quotaLoad) raise(n int64) { w.quota.Add(n) }

// waitDone waits until every key of the quota is written.
func (w *quotaLoad) waitDone(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool { return w.done.Load() >= w.quota.Load() }, 120*time.Second, 5*time.Millisecond,
		"%d keys of %d written", w.done.Load(), w.quota.Load())
}

func (w *quotaLoad) stop() { w.once.Do(func() { close(w.quit); w.wg.Wait() }) }

func (w *quotaLoad) firstFailure() string {
	s, _ := w.failure.Load().(string)
	return s
}
