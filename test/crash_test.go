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
	"github.com/effect-ledger/effect-ledger/ledger"
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
// the same file: with every write in the default namespace, and spread
// over 16 namespaces (each client's writes go to each namespace in
// turn). What clients saw acknowledged (recorded from the HTTP
// responses) must all be there with the same hash, in its namespace;
// each namespace's chain must verify and its file pass PRAGMA
// integrity_check; no receipt may be invented; a key whose commit was
// never sent must not be committed; and ledgerctl verify
// --all-namespaces is clean.
func TestLedgerd_kill9(t *testing.T) {
	t.Parallel()
	if testing.Short() && *killCycles > 3 {
		*killCycles = 3
	}
	for _, n := range []int{1, 16} {
		t.Run(fmt.Sprintf("%dns", n), func(t *testing.T) {
			t.Parallel()
			kill9(t, n)
		})
	}
}

// crashLoad is what the clients of a kill -9 test sent and saw
// acknowledged, by namespace.
type crashLoad struct {
	mu         sync.Mutex
	acks       map[string][]ack
	n          int             // acknowledgements
	sent       map[string]bool // keys whose reserve was sent
	commitSent map[string]bool // keys whose commit was sent
}

func (cl *crashLoad) acked() int { cl.mu.Lock(); defer cl.mu.Unlock(); return cl.n }

func (cl *crashLoad) mark(m map[string]bool, key string) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	m[key] = true
}

// write reserves key in namespace ns of the ledgerd at url, and commits
// it unless it is every fourth (left open); it reports whether ledgerd
// still answers.
func (cl *crashLoad) write(t *testing.T, url, ns, key string, leaveOpen bool) bool {
	prefix := url + "/v1"
	if ns != ledger.DefaultNamespace {
		prefix += "/ns/" + ns
	}
	cl.mark(cl.sent, key)
	st, b, err := rawPost(prefix+"/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"e-`+key+`","tool":"t.x","effect":"write"}`)
	if err != nil {
		return false // killed
	}
	if st != 201 {
		t.Errorf("reserve: %d %s", st, b)
		return false
	}
	cl.ack(ns, b, key)
	if leaveOpen {
		return true
	}
	cl.mark(cl.commitSent, key)
	st, b, err = rawPost(prefix+"/effects/"+key+"/commit", `{"reservation":"`+field(b, "reservation")+`","outcome":"succeeded"}`)
	if err != nil {
		return false
	}
	if st != 201 {
		t.Errorf("commit: %d %s", st, b)
		return false
	}
	cl.ack(ns, b, key)
	return true
}

// ack records the receipt of a 2xx response in namespace ns.
func (cl *crashLoad) ack(ns string, b []byte, key string) {
	var got []ack
	var mu sync.Mutex
	recordAck(&mu, &got, b, key)
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.acks[ns] = append(cl.acks[ns], got...)
	cl.n += len(got)
}

func kill9(t *testing.T, namespaces int) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	names := []string{ledger.DefaultNamespace}
	for k := 2; k <= namespaces; k++ {
		names = append(names, fmt.Sprintf("ns-%d", k))
	}
	cl := &crashLoad{acks: map[string][]ack{}, sent: map[string]bool{}, commitSent: map[string]bool{}}
	for cycle := range *killCycles {
		l := StartLedgerd(t, path)
		if cycle == 0 {
			for _, ns := range names[1:] {
				require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"`+ns+`"}`).Status)
			}
		}
		// The kill lands after a random number of acknowledged writes, with
		// 16 clients mid-request.
		target := cl.acked() + 1 + rng.IntN(40)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		loadWriters(16, stop, &wg, func(c, i int) bool {
			return cl.write(t, l.URL, names[(c+i)%len(names)], fmt.Sprintf("crash-%02d-%02d-%05d", cycle, c, i), i%4 == 3)
		})
		require.Eventually(t, func() bool { return cl.acked() >= target }, 60*time.Second, time.Millisecond,
			"cycle %d: want %d acknowledgements:\n%s", cycle, target, l.Logs())
		require.NoError(t, l.cmd.Process.Signal(syscall.SIGKILL))
		close(stop)
		wg.Wait()
		l.Kill()
	}
	require.NotZero(t, cl.acked())

	// Restart once more: the ledger opens and serves after the last kill.
	l := StartLedgerd(t, path)
	assert.Equal(t, 200, l.Do("GET", "/readyz", "").Status)
	require.NoError(t, l.Stop())
	for _, ns := range names {
		cl.check(t, path, ns)
	}
	out, errOut, code := ledgerctl(t, "verify", "--db", path, "--all-namespaces")
	require.Equal(t, 0, code, out+errOut)
}

// check holds namespace ns of the ledger file to what its clients saw acknowledged.
func (cl *crashLoad) check(t *testing.T, file, ns string) {
	st, err := sqlite.OpenStore(context.Background(), file, sqlite.Options{}, true)
	require.NoError(t, err)
	defer st.Close()
	ch, err := st.Chain(context.Background(), ns)
	require.NoError(t, err)
	rd := ch.(interface {
		ledger.ChainReader
		verify.DB
	})
	for _, a := range cl.acks[ns] {
		r, err := rd.GetReceipt(context.Background(), a.seq)
		require.NoError(t, err, "%s: acknowledged receipt %d lost", ns, a.seq)
		require.Equal(t, a.hash, r.Hash.String(), "%s: acknowledged receipt %d changed", ns, a.seq)
		require.Equal(t, a.key, r.IdempotencyKey)
	}
	rep, err := verify.New(rd, verify.Opts{}).Check(context.Background())
	require.NoError(t, err)
	require.True(t, rep.OK, "%s: %+v", ns, rep.Violations)

	db, err := sql.Open("sqlite3", "file:"+file+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	var integrity string
	require.NoError(t, db.QueryRow(`PRAGMA integrity_check`).Scan(&integrity))
	assert.Equal(t, "ok", integrity, ns)

	committed := 0
	require.NoError(t, rd.Receipts(context.Background(), 0, func(r *chain.Receipt) error {
		if !cl.sent[r.IdempotencyKey] {
			t.Errorf("%s: receipt %d for key %q that no client sent", ns, r.Seq, r.IdempotencyKey)
		}
		if r.Kind == "commit" {
			committed++
			if !cl.commitSent[r.IdempotencyKey] {
				t.Errorf("%s: key %q committed, but its commit was never sent", ns, r.IdempotencyKey)
			}
		}
		return nil
	}))
	t.Logf("%s: %d cycles, %d acknowledged receipts, %d in the chain, %d commits", ns, *killCycles, len(cl.acks[ns]), rep.Receipts, committed)
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
