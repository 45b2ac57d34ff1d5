package test

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/verify"
)

var killCycles = flag.Int("kill-cycles", 10, "kill -9 cycles of TestLedgerd_kill9")

// ack is a receipt a client saw acknowledged.
type ack struct {
	seq  uint64
	hash string
	key  string
}

// TestLedgerd_kill9 kills ledgerd with SIGKILL at random moments under
// concurrent reserve/commit load, --kill-cycles times, restarting it on
// the same file. What clients saw acknowledged (recorded from the HTTP
// responses) must all be there with the same hash; the chain must verify
// and pass PRAGMA integrity_check; no receipt may be invented; and a key
// whose commit was never sent must not be committed.
func TestLedgerd_kill9(t *testing.T) {
	t.Parallel()
	if testing.Short() && *killCycles > 3 {
		*killCycles = 3
	}
	path := filepath.Join(t.TempDir(), "ledger.db")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var mu sync.Mutex
	var acks []ack
	sent := map[string]bool{}       // keys whose reserve was sent
	commitSent := map[string]bool{} // keys whose commit was sent
	acked := func() int { mu.Lock(); defer mu.Unlock(); return len(acks) }
	for cycle := range *killCycles {
		l := StartLedgerd(t, path)
		// The kill lands after a random number of acknowledged writes, with
		// 16 clients mid-request.
		target := acked() + 1 + rng.IntN(40)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		loadWriters(16, stop, &wg, func(c, i int) bool {
			key := fmt.Sprintf("crash-%02d-%02d-%05d", cycle, c, i)
			mu.Lock()
			sent[key] = true
			mu.Unlock()
			st, b, err := rawPost(l.URL+"/v1/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e-`+key+`","tool":"t.x","effect":"write"}`)
			if err != nil {
				return false // killed
			}
			if st != 201 {
				t.Errorf("reserve: %d %s", st, b)
				return false
			}
			recordAck(&mu, &acks, b, key)
			if i%4 == 3 {
				return true // leave some reservations open
			}
			mu.Lock()
			commitSent[key] = true
			mu.Unlock()
			st, b, err = rawPost(l.URL+"/v1/effects/"+key+"/commit", `{"reservation":"`+field(b, "reservation")+`","outcome":"succeeded"}`)
			if err != nil {
				return false
			}
			if st != 201 {
				t.Errorf("commit: %d %s", st, b)
				return false
			}
			recordAck(&mu, &acks, b, key)
			return true
		})
		require.Eventually(t, func() bool { return acked() >= target }, 60*time.Second, time.Millisecond,
			"cycle %d: want %d acknowledgements:\n%s", cycle, target, l.Logs())
		require.NoError(t, l.cmd.Process.Signal(syscall.SIGKILL))
		close(stop)
		wg.Wait()
		l.Kill()
	}
	require.NotEmpty(t, acks)

	// Restart once more: the ledger opens and serves after the last kill.
	l := StartLedgerd(t, path)
	assert.Equal(t, 200, l.Do("GET", "/readyz", "").Status)
	require.NoError(t, l.Stop())

	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	for _, a := range acks {
		r, err := rd.GetReceipt(context.Background(), a.seq)
		require.NoError(t, err, "acknowledged receipt %d lost", a.seq)
		require.Equal(t, a.hash, r.Hash.String(), "acknowledged receipt %d changed", a.seq)
		require.Equal(t, a.key, r.IdempotencyKey)
	}
	rep, err := verify.New(rd, verify.Opts{}).Check(context.Background())
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep.Violations)

	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	var integrity string
	require.NoError(t, db.QueryRow(`PRAGMA integrity_check`).Scan(&integrity))
	assert.Equal(t, "ok", integrity)

	states := map[string]string{}
	require.NoError(t, rd.Receipts(context.Background(), 0, func(r *chain.Receipt) error {
		if !sent[r.IdempotencyKey] {
			t.Errorf("receipt %d for key %q that no client sent", r.Seq, r.IdempotencyKey)
		}
		if r.Kind == "commit" {
			states[r.IdempotencyKey] = "committed"
			if !commitSent[r.IdempotencyKey] {
				t.Errorf("key %q committed, but its commit was never sent", r.IdempotencyKey)
			}
		}
		return nil
	}))
	t.Logf("%d cycles, %d acknowledged receipts, %d in the chain, %d committed keys", *killCycles, len(acks), rep.Receipts, len(states))
}

// TestLedgerd_sigtermUnderLoad stops ledgerd with SIGTERM while clients
// write: it exits 0 within its shutdown timeout, and every receipt a
// client saw acknowledged is in the file.
func TestLedgerd_sigtermUnderLoad(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ledger.db")
	l := StartLedgerd(t, path, "--shutdown-timeout", "10s")
	var mu sync.Mutex
	var acks []ack
	var wg sync.WaitGroup
	loadWriters(16, nil, &wg, func(c, i int) bool {
		key := fmt.Sprintf("term-%02d-%05d", c, i)
		st, b, err := rawPost(l.URL+"/v1/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e","tool":"t.x","effect":"write"}`)
		if err != nil || st != 201 {
			return false // refused: the server is shutting down
		}
		recordAck(&mu, &acks, b, key)
		return true
	})
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(acks) >= 100 }, 60*time.Second, time.Millisecond,
		"the clients write")
	start := time.Now()
	require.NoError(t, l.Stop(), "exit 0 on SIGTERM:\n%s", l.Logs())
	assert.Less(t, time.Since(start), 10*time.Second)
	wg.Wait()
	require.NotEmpty(t, acks)
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	for _, a := range acks {
		r, err := rd.GetReceipt(context.Background(), a.seq)
		require.NoError(t, err, "acknowledged receipt %d lost", a.seq)
		require.Equal(t, a.hash, r.Hash.String())
	}
}

// TestLedgerd_slowHeaders: a client that never finishes its headers is
// dropped at the read-header timeout while other clients are served.
func TestLedgerd_slowHeaders(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"), "--read-header-timeout", "300ms")
	conn, err := net.Dial("tcp", strings.TrimPrefix(l.URL, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte("GET /v1/head HTTP/1.1\r\nHost: x\r\nX-Slow: "))
	require.NoError(t, err)
	assert.Equal(t, 200, l.Do("GET", "/v1/head", "").Status, "others are served meanwhile")
	start := time.Now()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = io.ReadAll(conn)
	require.NoError(t, err, "the server closes the connection")
	assert.Less(t, time.Since(start), 5*time.Second)
}
