package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// Reserve posts body as a reserve (with the headers header) and returns
// its reservation token, failing t unless it was answered 201.
func (l *Ledgerd) Reserve(t *testing.T, body string, header ...string) string {
	t.Helper()
	r := l.Do("POST", "/v1/effects/reserve", body, header...)
	require.Equal(t, 201, r.Status, r.Raw)
	return r.Body["reservation"].(string)
}

// Commit posts body as the commit of key (with the headers header),
// fails t unless it was answered 201, and returns the answer.
func (l *Ledgerd) Commit(t *testing.T, key, body string, header ...string) Resp {
	t.Helper()
	r := l.Do("POST", "/v1/effects/"+key+"/commit", body, header...)
	require.Equal(t, 201, r.Status, r.Raw)
	return r
}

// refundBody is the body of a reserve of key by exec: a payments.refund
// (a write) of order, with the further fields extra (`,"idempotent":true`).
func refundBody(key, exec string, order int, extra string) string {
	return fmt.Sprintf(`{"idempotency_key":%q,"execution_id":%q,"tool":"payments.refund","effect":"write","input":{"order":%d}%s}`,
		key, exec, order, extra)
}

// onSQLiteAndPostgres runs test in two parallel subtests: "sqlite" with
// db a new file, and "postgres" with db a new PostgreSQL database's URL.
func onSQLiteAndPostgres(t *testing.T, test func(t *testing.T, db string)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		test(t, filepath.Join(t.TempDir(), "ledger.db"))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		test(t, pgtest.URL(t))
	})
}

// loadWriters starts clients goroutines, counted in wg: client c calls
// write(c, i) for i = 0, 1, … until stop is closed or write returns
// false. A nil stop is never closed.
func loadWriters(clients int, stop <-chan struct{}, wg *sync.WaitGroup, write func(c, i int) bool) {
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if !write(c, i) {
					return
				}
			}
		}()
	}
}

// reserveAndCommit reserves key at the ledgerd at url with the reserve
// fields reserveRest (what follows idempotency_key) and commits it with
// the commit fields commitRest (what follows reservation); it reports
// whether both were answered 201.
func reserveAndCommit(url, key, reserveRest, commitRest string) bool {
	st, b, err := rawPost(url+"/v1/effects/reserve", `{"idempotency_key":"`+key+`",`+reserveRest+`}`)
	if err != nil || st != 201 {
		return false
	}
	st, _, err = rawPost(url+"/v1/effects/"+key+"/commit", `{"reservation":"`+field(b, "reservation")+`",`+commitRest+`}`)
	return err == nil && st == 201
}

// load is clients that reserve and commit keys on a ledgerd until
// stopped, counting the keys written and the writes that failed.
type load struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
	failures atomic.Int32 // reserves or commits not answered 201
	written  atomic.Int32 // keys reserved and committed
}

// startLoad starts clients on l: client c writes the keys
// prefix-CC-IIIIII for i = 0, 1, … with reserveAndCommit, the reserve
// fields reserveRest and the commit fields commit(i), until Stop, which
// the test's cleanup calls too.
func startLoad(t *testing.T, l *Ledgerd, clients int, prefix, reserveRest string, commit func(i int) string) *load {
	w := &load{stop: make(chan struct{})}
	loadWriters(clients, w.stop, &w.wg, func(c, i int) bool {
		if reserveAndCommit(l.URL, fmt.Sprintf("%s-%02d-%06d", prefix, c, i), reserveRest, commit(i)) {
			w.written.Add(1)
		} else {
			w.failures.Add(1)
		}
		return true
	})
	t.Cleanup(w.Stop)
	return w
}

// Stop stops the clients and waits for them; later calls do nothing.
func (w *load) Stop() {
	w.once.Do(func() { close(w.stop); w.wg.Wait() })
}

// readyAddr reads the JSON log lines of a starting process from r, each
// given to seen first (unless seen is nil), and sends on the channel it
// returns the "addr" of the line whose "msg" is msg; the channel is closed
// when r ends.
func readyAddr(r io.Reader, msg string, seen func(line []byte)) <-chan string {
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if seen != nil {
				seen(sc.Bytes())
			}
			var line struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == msg {
				ready <- line.Addr
			}
		}
		close(ready)
	}()
	return ready
}

// metricFamilies scrapes l's /metrics and parses it.
func metricFamilies(t *testing.T, l *Ledgerd) map[string]*dto.MetricFamily {
	t.Helper()
	res := l.Do("GET", "/metrics", "")
	require.Equal(t, 200, res.Status)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(res.Raw))
	require.NoError(t, err)
	return fams
}

// verified runs ledgerctl verify on the ledger file db and requires it
// clean.
func verified(t *testing.T, db string) {
	t.Helper()
	out, errOut, code := ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, out+errOut)
}

// createToken makes an API token with ledgerctl on the database db (a
// file or a PostgreSQL URL), as an operator would, and returns it.
func createToken(t *testing.T, db, name, role string, extra ...string) string {
	t.Helper()
	out, stderr, code := ledgerctl(t, append([]string{"token", "create", "--db", db, "--name", name, "--role", role}, extra...)...)
	require.Equal(t, 0, code, stderr)
	tok := strings.TrimSpace(out)
	require.True(t, strings.HasPrefix(tok, "elt_"), out)
	return tok
}
