package test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// Two ledgerd replicas on one PostgreSQL database (SPEC §10): every
// guarantee holds across them. The database is a real cluster (started by
// the tests, or $LEDGER_TEST_POSTGRES).

func randomKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "k_" + hex.EncodeToString(b[:])
}

// refunded is a succeeded refund's fields.
const refunded = `,"external_ref":"re_1","result":{"ok":true}`

func startReplicas(t *testing.T, url string, args ...string) (a, b *Ledgerd) {
	t.Helper()
	return StartLedgerd(t, url, args...), StartLedgerd(t, url, args...)
}

// startReplicasEnv is startReplicas with env added to both processes'.
func startReplicasEnv(t *testing.T, env []string, url string, args ...string) (a, b *Ledgerd) {
	t.Helper()
	return startLedgerdEnv(t, env, url, args...), startLedgerdEnv(t, env, url, args...)
}

func TestReplicas_oneWinnerAcrossReplicas(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	a, b := startReplicas(t, url)
	key := randomKey()
	var created, inProgress, other atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		l := a
		if i%2 == 1 {
			l = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, body, err := rawPost(l.URL+"/v1/effects/reserve", refundBody(key, fmt.Sprintf("exec-%d", i), 7, ""))
			switch {
			case err != nil:
				t.Errorf("reserve: %v", err)
			case status == 201:
				created.Add(1)
			case status == 409 && strings.Contains(string(body), `"in_progress"`):
				inProgress.Add(1)
			default:
				other.Add(1)
				t.Errorf("reserve: %d %s", status, body)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(1), created.Load(), "exactly one 201 across both replicas")
	assert.Equal(t, int64(63), inProgress.Load())
}

func TestReplicas_noForkUnderMixedLoad(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	a, b := startReplicas(t, url)
	for _, ns := range []string{"alpha", "beta"} {
		r := a.Do("POST", "/v1/namespaces", fmt.Sprintf(`{"name":%q}`, ns))
		require.Equal(t, 201, r.Status, r.Raw)
	}
	r := b.Do("POST", "/v1/namespaces", `{"name":"alpha"}`)
	require.Equal(t, 409, r.Status, r.Raw)
	require.Equal(t, "namespace_exists", r.Code())

	prefixes := []string{"/v1", "/v1/ns/alpha", "/v1/ns/beta"}
	var wg sync.WaitGroup
	var acked atomic.Int64
	for w := range 12 {
		l := []*Ledgerd{a, b}[w%2]
		prefix := prefixes[w%3]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 15 {
				key := randomKey()
				status, body, err := rawPost(l.URL+prefix+"/effects/reserve", refundBody(key, randomKey(), 7, ""))
				if !assert.NoError(t, err) || !assert.Equal(t, 201, status, "%s", body) {
					return
				}
				status, body, err = rawPost(l.URL+prefix+"/effects/"+key+"/commit", testkit.CommitBody(field(body, "reservation"), "succeeded", refunded))
				if !assert.NoError(t, err) || !assert.Equal(t, 201, status, "%s", body) {
					return
				}
				acked.Add(2)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int64(12*15*2), acked.Load())
	total := uint64(0)
	for _, ns := range []string{"default", "alpha", "beta"} {
		out, stderr, code := ledgerctl(t, "verify", "--db", url, "--namespace", ns, "--json")
		require.Equal(t, 0, code, "verify %s: %s %s", ns, out, stderr)
		assert.Contains(t, out, `"ok":true`)
		prefix := "/v1"
		if ns != "default" {
			prefix = "/v1/ns/" + ns
		}
		h := b.Do("GET", prefix+"/head", "")
		require.Equal(t, 200, h.Status, h.Raw)
		total += uint64(h.Body["seq"].(float64))
	}
	assert.Equal(t, uint64(acked.Load()), total, "every acknowledged receipt is in exactly one chain")
}

func TestReplicas_takeoverAfterReplicaDied(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	clock := newWallClock(t)
	a, b := startReplicasEnv(t, []string{clock.env()}, url)
	key := randomKey()
	r := a.Do("POST", "/v1/effects/reserve", refundBody(key, "exec-1", 7, `,"idempotent":true,"lease_ms":1000`))
	require.Equal(t, 201, r.Status, r.Raw)
	a.Kill()
	r = b.Do("POST", "/v1/effects/reserve", refundBody(key, "exec-2", 7, `,"idempotent":true`))
	require.Equal(t, 409, r.Status, r.Raw)
	require.Equal(t, "in_progress", r.Code())
	clock.advance(1200 * time.Millisecond) // past a's lease
	r = b.Do("POST", "/v1/effects/reserve", refundBody(key, "exec-2", 7, `,"idempotent":true`))
	require.Equal(t, 201, r.Status, r.Raw)
	assert.Equal(t, true, r.Body["takeover"], r.Raw)
}

// TestReplicas_killOneUnderLoad: two replicas under load spread over four
// namespaces (so each replica commits groups of namespaces' batches in
// one transaction), one killed with SIGKILL mid-stream: the other serves
// on, and every acknowledged receipt is there, in its namespace.
func TestReplicas_killOneUnderLoad(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	a, b := startReplicas(t, url)
	names := []string{ledger.DefaultNamespace, "t1", "t2", "t3"}
	for _, ns := range names[1:] {
		r := a.Do("POST", "/v1/namespaces", `{"name":"`+ns+`"}`)
		require.Equal(t, 201, r.Status, r.Raw)
	}
	prefix := func(ns string) string {
		if ns == ledger.DefaultNamespace {
			return "/v1"
		}
		return "/v1/ns/" + ns
	}
	var mu sync.Mutex
	acks := map[string]*[]ack{}
	for _, ns := range names {
		acks[ns] = &[]ack{}
	}
	var bErrors, aAcked, bAcked atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	loadWriters(8, stop, &wg, func(w, i int) bool {
		l := []*Ledgerd{a, b}[w%2]
		ns := names[(w+i)%len(names)]
		base := l.URL + prefix(ns)
		key := randomKey()
		status, body, err := rawPost(base+"/effects/reserve", refundBody(key, randomKey(), 7, ""))
		if err != nil || status != 201 {
			if l == b {
				bErrors.Add(1)
				t.Errorf("replica b: %d %v %s", status, err, body)
			}
			if l == a {
				return false // a was killed
			}
			return true
		}
		recordAck(&mu, acks[ns], body, key)
		status, body, err = rawPost(base+"/effects/"+key+"/commit", testkit.CommitBody(field(body, "reservation"), "succeeded", refunded))
		if err == nil && status == 201 {
			recordAck(&mu, acks[ns], body, key)
			if l == a {
				aAcked.Add(1)
			} else {
				bAcked.Add(1)
			}
		} else if l == b {
			bErrors.Add(1)
			t.Errorf("replica b commit: %d %v %s", status, err, body)
		}
		return true
	})
	// Both replicas under load, then a dies mid-stream and b goes on.
	require.Eventually(t, func() bool { return aAcked.Load() >= 30 && bAcked.Load() >= 30 }, 60*time.Second, 5*time.Millisecond,
		"both replicas serve the load")
	a.Kill()
	atKill := bAcked.Load()
	require.Eventually(t, func() bool { return bAcked.Load() >= atKill+30 }, 60*time.Second, 5*time.Millisecond,
		"the surviving replica serves on after the kill")
	close(stop)
	wg.Wait()
	require.Zero(t, bErrors.Load(), "the surviving replica kept serving")
	mu.Lock()
	defer mu.Unlock()
	for _, ns := range names {
		require.NotEmpty(t, *acks[ns], ns)
		for _, k := range *acks[ns] {
			r := b.Do("GET", fmt.Sprintf("%s/receipts/%d", prefix(ns), k.seq), "")
			require.Equal(t, 200, r.Status, "%s: acknowledged receipt %d lost: %s", ns, k.seq, r.Raw)
			require.Equal(t, k.hash, r.Body["hash"], "%s: receipt %d", ns, k.seq)
		}
	}
	require.Greater(t, b.metric("ledger_writer_group_namespaces_sum"), b.metric("ledger_writer_group_namespaces_count"),
		"replica b committed groups of more than one namespace")
	out, stderr, code := ledgerctl(t, "verify", "--db", url, "--all-namespaces", "--json")
	require.Equal(t, 0, code, "%s %s", out, stderr)
}

func TestReplicas_waitWakesAcrossReplicas(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	a, b := startReplicas(t, url)
	key := randomKey()
	token := a.Reserve(t, refundBody(key, "exec-1", 7, ""))
	done := make(chan Resp, 1)
	go func() { done <- b.Do("POST", "/v1/effects/reserve", refundBody(key, "exec-2", 7, `,"wait_ms":20000`)) }()
	require.Eventually(t, func() bool { return b.metric("ledger_reserve_waiting") == 1 }, 60*time.Second, 5*time.Millisecond,
		"the reserve parks on b")
	start := time.Now()
	a.Commit(t, key, testkit.CommitBody(token, "succeeded", refunded))
	select {
	case got := <-done:
		require.Equal(t, 200, got.Status, got.Raw)
		assert.Equal(t, "replayed", got.Body["status"])
		assert.Less(t, time.Since(start), 2*time.Second, "woken by a's commit, not by the wait running out")
	case <-time.After(25 * time.Second):
		t.Fatal("the waiting reserve on b never answered")
	}
}

func TestReplicas_tokensAcrossReplicas(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	admin := createToken(t, url, "ops", "admin")
	scoped := createToken(t, url, "gw", "writer", "--namespace", "alpha")
	a, b := startReplicas(t, url)
	bearer := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	r := a.Do("POST", "/v1/namespaces", `{"name":"alpha"}`, bearer(admin)...)
	require.Equal(t, 201, r.Status, r.Raw)
	r = b.Do("POST", "/v1/ns/alpha/effects/reserve", refundBody(randomKey(), "e", 7, ""), bearer(scoped)...)
	require.Equal(t, 201, r.Status, r.Raw)
	for _, l := range []*Ledgerd{a, b} {
		r = l.Do("POST", "/v1/effects/reserve", refundBody(randomKey(), "e", 7, ""), bearer(scoped)...)
		require.Equal(t, 403, r.Status, r.Raw)
		require.Equal(t, "forbidden", r.Code())
	}
	_, stderr, code := ledgerctl(t, "token", "revoke", "--db", url, "gw")
	require.Equal(t, 0, code, stderr)
	for _, l := range []*Ledgerd{a, b} {
		r = l.Do("POST", "/v1/ns/alpha/effects/reserve", refundBody(randomKey(), "e", 7, ""), bearer(scoped)...)
		require.Equal(t, 401, r.Status, "a revoked token is refused at once on every replica: %s", r.Raw)
	}
}

func TestReplicas_databaseLostAndBack(t *testing.T) {
	t.Parallel()
	c := pgtest.StartCluster(t)
	url := c.URL(t)
	a, b := startReplicas(t, url)
	require.NoError(t, c.Stop())
	for _, l := range []*Ledgerd{a, b} {
		r := l.Do("POST", "/v1/effects/reserve", refundBody(randomKey(), "e", 7, ""))
		require.Equal(t, 503, r.Status, r.Raw)
		require.Equal(t, "unavailable", r.Code())
		require.NotEmpty(t, r.Header.Get("Retry-After"))
		rz := l.Do("GET", "/readyz", "")
		require.Equal(t, 503, rz.Status, rz.Raw)
	}
	require.NoError(t, c.Start())
	for _, l := range []*Ledgerd{a, b} {
		require.Eventually(t, func() bool {
			res, err := http.Get(l.URL + "/readyz")
			if err != nil {
				return false
			}
			_ = res.Body.Close()
			return res.StatusCode == 200
		}, 30*time.Second, 200*time.Millisecond, "replica ready again without a restart")
		r := l.Do("POST", "/v1/effects/reserve", refundBody(randomKey(), "e", 7, ""))
		require.Equal(t, 201, r.Status, r.Raw)
	}
}

func TestReplicas_oneSignerPerNamespace(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	dir := t.TempDir()
	keyFile, vkey := keygen(t, dir, "replicas.test")
	args := []string{"--signing-key", keyFile, "--log-origin", "replicas.test", "--checkpoint-interval", "100ms"}
	a, b := startReplicas(t, url, args...)
	var last int
	for round := range 3 {
		for i := range 5 {
			l := []*Ledgerd{a, b}[i%2]
			r := l.Do("POST", "/v1/effects/reserve", refundBody(randomKey(), "e", 7, ""))
			require.Equal(t, 201, r.Status, r.Raw)
		}
		want := (round + 1) * 5
		require.Eventually(t, func() bool {
			r := b.Do("GET", "/log/default/checkpoint", "")
			if r.Status != 200 {
				return false
			}
			lines := strings.Split(r.Raw, "\n")
			var n int
			_, _ = fmt.Sscan(lines[1], &n)
			last = n
			return n == want
		}, 60*time.Second, 50*time.Millisecond)
	}
	assert.Equal(t, 15, last)
	r := a.Do("GET", "/v1/receipts/7/proof", "")
	require.Equal(t, 200, r.Status, r.Raw)
	proof := filepath.Join(dir, "proof.json")
	require.NoError(t, os.WriteFile(proof, []byte(r.Raw), 0o600))
	_, stderr, code := ledgerctl(t, "check-proof", proof, "--vkey", vkey)
	require.Equal(t, 0, code, stderr)
	for _, l := range []*Ledgerd{a, b} {
		m := l.Do("GET", "/metrics", "")
		assert.NotContains(t, m.Raw, `ledger_tlog_checkpoint_failures_total{namespace="default"} 1`, "no signing failures")
		assert.Contains(t, m.Raw, `ledger_tlog_checkpoint_failures_total{namespace="default"} 0`)
	}
}

func TestReplicas_rateLimitIsATotal(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	tok := createToken(t, url, "bot", "reader")
	a, b := startReplicasEnv(t, []string{"LEDGERD_TEST_REPLICA_COUNT_EVERY=10ms"}, url, "--rate-limit", "0.2", "--rate-burst", "4")
	for _, l := range []*Ledgerd{a, b} {
		require.Eventually(t, func() bool {
			return strings.Contains(l.Logs(), `"msg":"rate limit shared by replicas","replicas":2`)
		}, 60*time.Second, 5*time.Millisecond, "each replica counts the other:\n%s", l.Logs())
	}
	auth := []string{"Authorization", "Bearer " + tok}
	for _, l := range []*Ledgerd{a, b} {
		for range 2 {
			r := l.Do("GET", "/v1/head", "", auth...)
			require.Equal(t, 200, r.Status, r.Raw)
		}
		r := l.Do("GET", "/v1/head", "", auth...)
		require.Equal(t, 429, r.Status, "each of two replicas allows half the burst of 4: %s", r.Raw)
	}
}

// TestLedgerd_postgresFaults: a malformed or unreachable --db URL, and a
// database whose schema is newer than this build, stop ledgerd with exit 1
// and a message naming the problem, never the password.
func TestLedgerd_postgresFaults(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ url, want string }{
		{"postgres://bob:s3cr3t@127.0.0.1:1/ledger", "connection refused"},
		{"postgres://bob:s3/cr3t@host:notaport/x", "malformed URL"},
		{"postgresql://bob:s3cr3t@/x?host=/nonexistent-dir", "no such file or directory"},
	} {
		out, code := runLedgerd(t, "--db", tt.url, "--listen", "127.0.0.1:0")
		assert.Equal(t, 1, code, out)
		assert.Contains(t, out, tt.want)
		assert.NotContains(t, out, "s3cr3t")
		assert.NotContains(t, out, "cr3t")
	}

	url := pgtest.URL(t)
	l := StartLedgerd(t, url) // creates the schema
	require.NoError(t, l.Stop())
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	_, err = conn.Exec(context.Background(), `UPDATE schema_version SET version = 99`)
	require.NoError(t, err)
	require.NoError(t, conn.Close(context.Background()))
	out, code := runLedgerd(t, "--db", url, "--listen", "127.0.0.1:0")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "99")
	out, _, code = ledgerctl(t, "verify", "--db", url)
	assert.NotEqual(t, 0, code, out)
}

// TestLedgerd_postgresRefusesOpenNoPassword: the refusal to serve a
// non-loopback address without auth names the database without its
// password.
func TestLedgerd_postgresRefusesOpenNoPassword(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	u := strings.Replace(url, "postgres://ledger@", "postgres://ledger:pw-not-needed-s3cr3t@", 1)
	out, code := runLedgerd(t, "--db", u, "--listen", "0.0.0.0:0")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "refusing to serve")
	assert.NotContains(t, out, "s3cr3t")
}
