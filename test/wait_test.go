package test

import (
	"bufio"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// metric returns the value of an unlabelled metric from /metrics.
func (l *Ledgerd) metric(name string) float64 {
	l.t.Helper()
	res, err := http.Get(l.URL + "/metrics")
	require.NoError(l.t, err)
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(l.t, err)
			return f
		}
	}
	l.t.Fatalf("metric %s not found", name)
	return 0
}

// asyncPost posts body to path and delivers status, body and duration.
type asyncReply struct {
	status  int
	body    []byte
	err     error
	elapsed time.Duration
}

func asyncPost(url, body string) <-chan asyncReply {
	out := make(chan asyncReply, 1)
	go func() {
		start := time.Now()
		status, b, err := rawPost(url, body)
		out <- asyncReply{status, b, err, time.Since(start)}
	}()
	return out
}

func waitReserve(exec string, waitMS int) string {
	return `{"idempotency_key":"refund-wait-0001","execution_id":"` + exec + `","tool":"payments.refund","effect":"write","input":{"order":9},"wait_ms":` + strconv.Itoa(waitMS) + `}`
}

// TestLedgerd_wait: through the real binary, a reserve waits for the
// holder's commit past the server's read and write timeouts and gets the
// replay; one that runs out of wait gets in_progress. The timeouts are
// short, but not so short that a busy machine's fsync outlasts the write
// timeout of an ordinary request (its answer would be cut: EOF).
func TestLedgerd_wait(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"), "--read-timeout", "2s", "--write-timeout", "2s")
	token := l.Reserve(t, waitReserve("exec-1", 0))

	short := asyncPost(l.URL+"/v1/effects/reserve", waitReserve("exec-2", 300))
	long := asyncPost(l.URL+"/v1/effects/reserve", waitReserve("exec-3", 10_000))
	s := <-short
	require.NoError(t, s.err)
	assert.Equal(t, 409, s.status, "%s", s.body)
	assert.Contains(t, string(s.body), `"in_progress"`)
	assert.GreaterOrEqual(t, s.elapsed, 300*time.Millisecond)

	require.Eventually(t, func() bool { return l.metric("ledger_reserve_waiting") == 1 }, 60*time.Second, 10*time.Millisecond)
	testkit.ReadTimeoutPassed(t, strings.TrimPrefix(l.URL, "http://")) // past --read-timeout and --write-timeout
	l.Commit(t, "refund-wait-0001", `{"reservation":"`+token+`","outcome":"succeeded","external_ref":"re_w1"}`)
	g := <-long
	require.NoError(t, g.err)
	assert.Equal(t, 200, g.status, "%s", g.body)
	assert.Equal(t, "replayed", field(g.body, "status"))
	assert.Equal(t, "re_w1", field(g.body, "external_ref"))
	assert.Zero(t, l.metric("ledger_reserve_waiting"))

	r := l.Do("GET", "/v1/head", "")
	assert.Equal(t, 3.0, r.Body["seq"], "reserve, commit, one replay")
}

// TestLedgerd_waitShutdown: SIGTERM answers parked reserves at once
// instead of letting them hold the shutdown for their wait_ms.
func TestLedgerd_waitShutdown(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	r := l.Do("POST", "/v1/effects/reserve", waitReserve("exec-1", 0))
	require.Equal(t, 201, r.Status, r.Raw)
	ch := asyncPost(l.URL+"/v1/effects/reserve", waitReserve("exec-2", 60_000))
	require.Eventually(t, func() bool { return l.metric("ledger_reserve_waiting") == 1 }, 60*time.Second, 10*time.Millisecond)
	start := time.Now()
	require.NoError(t, l.Stop())
	assert.Less(t, time.Since(start), 10*time.Second)
	g := <-ch
	require.NoError(t, g.err)
	assert.Equal(t, 409, g.status, "%s", g.body)
	assert.Contains(t, string(g.body), `"in_progress"`)
}
