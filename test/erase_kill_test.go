package test

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// TestRetention_replicasSweepOnce (SPEC §14): two ledgerd replicas of one
// PostgreSQL database, with a signing key, on one test clock: the one that
// holds the namespace's signer lock sweeps, and each expiry appends one
// erase receipt, never two; the ledger verifies.
func TestRetention_replicasSweepOnce(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	clock := newTestClock(t, t0)
	keyFile, _ := keygen(t, t.TempDir(), "sweep.test")
	args := []string{"--default-payloads", "committed", "--retention-interval", "20ms",
		"--signing-key", keyFile, "--log-origin", "sweep.test", "--checkpoint-interval", "100ms"}
	a, b := startReplicasEnv(t, []string{clock.env()}, url, args...)
	r := a.Do("PUT", "/v1/namespaces/default/policy", `{"retention":{"payloads_ms":60000}}`)
	require.Equal(t, 200, r.Status, r.Raw)
	sweeps := func() int {
		rs := a.Do("GET", "/v1/receipts?kind=erase&limit=100", "")
		require.Equal(t, 200, rs.Status, rs.Raw)
		return strings.Count(rs.Raw, `\"retention\":true`)
	}
	for round := range 3 {
		for i := range 6 {
			l := []*Ledgerd{a, b}[i%2]
			key := fmt.Sprintf("sweep-%d-%04d", round, i)
			tok := l.Reserve(t, reserve(key, "exec-1", 1, false))
			l.Commit(t, key, `{"reservation":"`+tok+`","outcome":"succeeded","result":{"n":`+fmt.Sprint(i)+`}}`)
		}
		clock.advance(61 * time.Second)
		require.Eventually(t, func() bool { return sweeps() == round+1 }, 20*time.Second, 20*time.Millisecond,
			"round %d: one sweep erased", round)
		time.Sleep(300 * time.Millisecond) // many sweep intervals of both replicas
		assert.Equal(t, round+1, sweeps(), "round %d: one erase receipt per expiry, not one per replica", round)
	}
	require.NoError(t, a.Stop())
	require.NoError(t, b.Stop())
	out, stderr, code := ledgerctl(t, "verify", "--db", url)
	require.Equal(t, 0, code, "%s%s", out, stderr)
}

// TestErasure_killed (SPEC §14): ledgerd killed (SIGKILL, as kill -9)
// while erases and commits run, and once right after the durable commit
// of a retention sweep (SQLite: the kill seam is its writer's), leaves each erase receipt and the deletion of its
// values both done or both undone: `ledgerctl verify --db` (which reports
// a listed value still kept, and a value missing without an erase) is
// clean after every kill, on SQLite and PostgreSQL.
func TestErasure_killed(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testErasureKilled)
}

func testErasureKilled(t *testing.T, db string) {
	clock := newTestClock(t, t0)
	args := []string{"--default-payloads", "committed", "--retention-interval", "0"}
	for round := range 4 {
		l := clock.start(t, db, args...)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("kill-%d-%05d", round, i)
				rr := post(l, "/v1/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e1","tool":"mail.send","effect":"external","input":{"i":`+fmt.Sprint(i)+`}}`)
				if rr.Status != 201 {
					return
				}
				c := post(l, "/v1/effects/"+key+"/commit", `{"reservation":"`+rr.Body["reservation"].(string)+`","outcome":"succeeded","external_ref":"ref-`+key+`","result":{"k":"`+key+`"}}`)
				if c.Status != 201 {
					return
				}
				if i%3 == 2 {
					keys := fmt.Sprintf(`"kill-%d-%05d","kill-%d-%05d"`, round, i-1, round, i)
					if e := post(l, "/v1/erasures", `{"keys":[`+keys+`],"reason":"request"}`); e.Status != 201 && e.Status != 200 {
						return
					}
				}
			}
		}()
		time.Sleep(time.Duration(150+rand.IntN(250)) * time.Millisecond)
		l.Kill()
		close(stop)
		<-done
		out, stderr, code := ledgerctl(t, "verify", "--db", db)
		require.Equal(t, 0, code, "round %d, killed mid-erase: %s%s", round, out, stderr)
	}

	if !strings.HasPrefix(db, "postgres") { // the kill seam is SQLite's writer's
		killedSweep(t, clock, db, args)
	}
}

// killedSweep: ledgerd dies right after the durable commit of a retention
// sweep; the sweep is then there, whole, and verify is clean.
func killedSweep(t *testing.T, clock *testClock, db string, args []string) {
	l := clock.start(t, db, args...)
	r := l.Do("PUT", "/v1/namespaces/default/policy", `{"retention":{"payloads_ms":60000}}`)
	require.Equal(t, 200, r.Status, r.Raw)
	head := l.Do("GET", "/v1/head", "").Body["seq"].(float64)
	require.NoError(t, l.Stop())
	clock.advance(61 * time.Second)
	l = startLedgerdEnv(t, []string{clock.env(), "LEDGERD_TEST_KILL_AFTER_COMMIT=1"}, db,
		"--default-payloads", "committed", "--retention-interval", "20ms")
	select {
	case err := <-l.exit:
		l.exit <- err // for Kill at cleanup
	case <-time.After(30 * time.Second):
		t.Fatalf("ledgerd did not commit a sweep:\n%s", l.Logs())
	}
	out, stderr, code := ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, "killed after the sweep's commit: %s%s", out, stderr)
	l = clock.start(t, db, args...)
	rs := l.Do("GET", fmt.Sprintf("/v1/receipts?kind=erase&after=%d", int(head)), "")
	require.Equal(t, 200, rs.Status, rs.Raw)
	assert.Contains(t, rs.Raw, `\"retention\":true`, "the killed process's sweep is there, whole")
}

// post sends a JSON body to l and decodes the reply; a transport error (l
// killed) is a zero Resp, not a test failure.
func post(l *Ledgerd, path, body string) Resp {
	res, err := http.Post(l.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		return Resp{}
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	out := Resp{Status: res.StatusCode, Raw: string(raw)}
	if err != nil || json.Unmarshal(raw, &out.Body) != nil {
		return Resp{}
	}
	return out
}
