package test

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// t0 is the time the key lifetime tests start at (unix ms).
const t0 = int64(1764475200000)

// testClock is a file the test build of ledgerd reads its time from
// (LEDGERD_TEST_CLOCK_FILE): the processes started with it see
// time jump when the test moves it, so that a test crosses a lease end, a
// key lifetime or the token-existence re-read without waiting. A stopped
// clock stands at a time; a running one is the real time plus an offset.
type testClock struct {
	t       testing.TB
	path    string
	mu      sync.Mutex
	ms      int64 // the time (stopped) or the offset (running)
	running bool
}

// newTestClock makes a clock stopped at unix ms ms.
func newTestClock(t testing.TB, ms int64) *testClock {
	c := &testClock{t: t, path: filepath.Join(t.TempDir(), "clock")}
	c.write(ms)
	return c
}

// newWallClock makes a running clock at the real time.
func newWallClock(t testing.TB) *testClock { return newRunningClock(t, 0) }

// newPastClock makes a running clock an hour behind the real time: a
// lease that ends on it has ended for a reader on the real clock too
// (ledgerctl verify --db, which reports it interrupted).
func newPastClock(t testing.TB) *testClock { return newRunningClock(t, -time.Hour) }

func newRunningClock(t testing.TB, offset time.Duration) *testClock {
	c := &testClock{t: t, path: filepath.Join(t.TempDir(), "clock"), running: true}
	c.write(offset.Milliseconds())
	return c
}

// set stops ledgerd's clock at unix ms ms.
func (c *testClock) set(ms int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running = false
	c.writeLocked(ms)
}

// advance moves ledgerd's clock forward by d.
func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writeLocked(c.ms + d.Milliseconds())
}

func (c *testClock) write(ms int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writeLocked(ms)
}

// writeLocked replaces the file whole, so that ledgerd never reads half
// of it.
func (c *testClock) writeLocked(ms int64) {
	v := strconv.FormatInt(ms, 10)
	if c.running {
		v = "offset " + v
	}
	tmp := c.path + ".tmp"
	require.NoError(c.t, os.WriteFile(tmp, []byte(v), 0o600))
	require.NoError(c.t, os.Rename(tmp, c.path))
	c.ms = ms
}

// env is the environment entry that points a process at the clock.
func (c *testClock) env() string { return "LEDGERD_TEST_CLOCK_FILE=" + c.path }

// start starts ledgerd on db with this clock (StartLedgerd's arguments).
func (c *testClock) start(t testing.TB, db string, args ...string) *Ledgerd {
	t.Helper()
	return startLedgerdEnv(t, []string{c.env()}, db, args...)
}

// TestLedgerd_readsNoTestHooks: the ledgerd binary reads none of its test
// build's LEDGERD_TEST_* variables. With its clock file at a time long
// past and the kill hook at the first commit, it records at the real time
// and survives its commits.
func TestLedgerd_readsNoTestHooks(t *testing.T) {
	t.Parallel()
	past := newTestClock(t, time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
	before := time.Now().UnixMilli()
	l := startBinary(t, "ledgerd", []string{past.env(), "LEDGERD_TEST_KILL_AFTER_COMMIT=1"}, filepath.Join(t.TempDir(), "ledger.db"))
	tok := l.Reserve(t, reserve("no-hooks-0001", "exec-1", 1, false))
	l.Commit(t, "no-hooks-0001", `{"reservation":"`+tok+`","outcome":"succeeded"}`)
	_, ats := recordedAts(t, l)
	require.Len(t, ats, 2)
	for _, at := range ats {
		assert.GreaterOrEqual(t, at, before, "recorded at the real time, not the clock file's")
		assert.LessOrEqual(t, at, time.Now().UnixMilli())
	}
}
