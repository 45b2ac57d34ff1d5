package test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/cmd/ledgerd/daemon"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// runLedgerd runs ledgerd's Main in-process, as the binary does, to its
// exit and returns what it wrote and its exit code (for start-up
// refusals, which need no process of their own). A start that does not
// refuse is stopped after a minute and fails the test.
func runLedgerd(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := &testkit.Buffer{}
	m := daemon.NewMain(out)
	m.Stdout = out
	code := m.Execute(ctx, args)
	require.NoError(t, ctx.Err(), "ledgerd was expected to exit: %s", out)
	return out.String(), code
}

// TestLedgerd_authNeverOpensUp revokes the last token of a running server,
// on loopback and on every address, and checks it keeps refusing
// anonymous writes, says so at WARN, and serves a new token at once.
func TestLedgerd_authNeverOpensUp(t *testing.T) {
	t.Parallel()
	for _, listen := range []string{"127.0.0.1:0", "0.0.0.0:0"} {
		t.Run(listen, func(t *testing.T) {
			db := filepath.Join(t.TempDir(), "ledger.db")
			// Create the file first so the token can be added before start.
			first := StartLedgerd(t, db)
			require.NoError(t, first.Stop())
			tok, stderr, code := ledgerctl(t, "token", "create", "--db", db, "--role", "admin", "--name", "ops")
			require.Equal(t, 0, code, stderr)
			tok = strings.TrimSpace(tok)
			clock := newWallClock(t)
			l := clock.start(t, db, "--listen", listen)
			if strings.HasPrefix(listen, "0.0.0.0") {
				_, port, _ := net.SplitHostPort(strings.TrimPrefix(l.URL, "http://"))
				l.URL = "http://127.0.0.1:" + port
			}
			body := reserve("auth-latch-0001", "exec-1", 1, false)
			assert.Equal(t, 401, l.Do("POST", "/v1/effects/reserve", body).Status)
			_, stderr, code = ledgerctl(t, "token", "revoke", "--db", db, "ops")
			require.Equal(t, 0, code, stderr)
			clock.advance(time.Second) // past the token-existence re-read
			for range 3 {
				r := l.Do("POST", "/v1/effects/reserve", body)
				assert.Equal(t, 401, r.Status, "a running server never opens up: %s", r.Raw)
				assert.Equal(t, "unauthorized", r.Code())
			}
			assert.Equal(t, 401, l.Do("GET", "/v1/head", "").Status)
			require.Eventually(t, func() bool {
				return strings.Contains(l.Logs(), `"level":"WARN","msg":"auth: no valid API token remains`)
			}, 60*time.Second, 50*time.Millisecond, l.Logs())
			assert.Contains(t, l.Logs(), `"level":"WARN","msg":"refusing API request: auth is on but no valid API token exists"`)

			tok2, _, code := ledgerctl(t, "token", "create", "--db", db, "--role", "writer", "--name", "gw")
			require.Equal(t, 0, code)
			clock.advance(time.Second) // past the token-existence re-read
			require.Eventually(t, func() bool {
				return l.Do("POST", "/v1/effects/reserve", body, "Authorization", "Bearer "+strings.TrimSpace(tok2)).Status == 201
			}, 60*time.Second, 5*time.Millisecond)
			assert.Equal(t, 401, l.Do("POST", "/v1/effects/reserve", reserve("auth-latch-0002", "exec-2", 1, false)).Status)
			_ = tok
		})
	}
}

// TestLedgerd_writerReadsItsKeys: a writer token may look up keys and the
// head, not list the chain.
func TestLedgerd_writerReadsItsKeys(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	first := StartLedgerd(t, db)
	require.NoError(t, first.Stop())
	tok, _, code := ledgerctl(t, "token", "create", "--db", db, "--role", "writer", "--name", "gw")
	require.Equal(t, 0, code)
	auth := []string{"Authorization", "Bearer " + strings.TrimSpace(tok)}
	l := StartLedgerd(t, db)
	require.Equal(t, 201, l.Do("POST", "/v1/effects/reserve", reserve("writer-key-0001", "exec-1", 1, false), auth...).Status)
	r := l.Do("GET", "/v1/effects/writer-key-0001", "", auth...)
	assert.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, 200, l.Do("GET", "/v1/head", "", auth...).Status)
	assert.Equal(t, 403, l.Do("GET", "/v1/receipts", "", auth...).Status)
}

// TestLedgerd_metricsLabelsBounded sends made-up methods and checks that
// /metrics does not grow a label for each.
func TestLedgerd_metricsLabelsBounded(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	for i := range 20 {
		r := l.Do(fmt.Sprintf("BOGUS%d", i), "/v1/effects/reserve", "")
		assert.Equal(t, 405, r.Status)
		r = l.Do(fmt.Sprintf("WEIRD%d", i), "/no/such/path/"+fmt.Sprint(i), "")
		assert.Equal(t, 404, r.Status)
	}
	m := l.Do("GET", "/metrics", "")
	require.Equal(t, 200, m.Status)
	assert.NotContains(t, m.Raw, "BOGUS")
	assert.NotContains(t, m.Raw, "WEIRD")
	assert.NotContains(t, m.Raw, "/no/such/path")
	assert.Contains(t, m.Raw, `method="OTHER"`)
}

// TestLedgerd_derivedStateRefused removes the receipts' tail behind
// ledgerd's back and checks that it refuses to start, naming the repair
// command, and serves correctly after it.
func TestLedgerd_derivedStateRefused(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	// Inline: the tail is deleted by hand below, and a committed
	// namespace's values of the deleted receipts would stay behind.
	l := StartLedgerd(t, db, "--default-payloads", "inline")
	for _, k := range []string{"tail-key-0001", "tail-key-0002"} {
		tok := l.Reserve(t, reserve(k, "exec-"+k, 1, true))
		l.Commit(t, k, `{"reservation":"`+tok+`","outcome":"succeeded","result":{"key":"`+k+`"}}`)
	}
	require.NoError(t, l.Stop())
	raw, err := sql.Open("sqlite3", "file:"+db)
	require.NoError(t, err)
	for _, q := range []string{`DROP TRIGGER ns_receipts_no_delete`, `DELETE FROM ns_receipts WHERE ns = 0 AND seq > 2`} {
		_, err := raw.Exec(q)
		require.NoError(t, err)
	}
	require.NoError(t, raw.Close())

	out, code := runLedgerd(t, "--db", db, "--listen", "127.0.0.1:0")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "ledgerctl rebuild-index --db")
	assert.Equal(t, 1, strings.Count(out, "ledgerd: "), "the fatal error is printed once by main: %s", out)

	stdout, stderr, code := ledgerctl(t, "rebuild-index", "--db", db)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "2 receipts, head 2")
	l = StartLedgerd(t, db)
	r := l.Do("POST", "/v1/effects/reserve", reserve("other-key-0003", "exec-9", 1, true))
	require.Equal(t, 201, r.Status, "a new key is reserved, not a replay of another key's result: %s", r.Raw)
	assert.Equal(t, float64(3), r.Body["receipt"].(map[string]any)["seq"])
	r = l.Do("POST", "/v1/effects/reserve", reserve("tail-key-0002", "exec-10", 1, true))
	assert.Equal(t, 201, r.Status, "the removed key is new again: %s", r.Raw)
	require.NoError(t, l.Stop())
	verified(t, db)
}

// TestLedgerd_foreignFileUntouched starts ledgerd on another application's
// SQLite file: it exits 1 and leaves the file byte for byte as it was,
// with nothing beside it.
func TestLedgerd_foreignFileUntouched(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "app.db")
	other, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=DELETE")
	require.NoError(t, err)
	_, err = other.Exec(`CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO users (name) VALUES ('ada')`)
	require.NoError(t, err)
	require.NoError(t, other.Close())
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	out, code := runLedgerd(t, "--db", path, "--listen", "127.0.0.1:0")
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "not an effect-ledger database")
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(before, after), "the refused file was changed")
	entries, _ := os.ReadDir(dir)
	assert.Len(t, entries, 1, "no -wal, -shm or .lock is left beside a refused file")
}

// TestLedgerd_noDatabaseBeforeBind: a ledgerd that cannot bind its address
// creates no database.
func TestLedgerd_noDatabaseBeforeBind(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	dir := t.TempDir()
	out, code := runLedgerd(t, "--db", filepath.Join(dir, "l.db"), "--listen", ln.Addr().String())
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "listen")
	entries, _ := os.ReadDir(dir)
	assert.Empty(t, entries, "nothing is created when the address cannot be bound")
}

// TestLedgerd_migratesV1 serves a file written by schema 1.
func TestLedgerd_migratesV1(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "v1.db")
	testkit.CopyFile(t, "../storage/sqlite/testdata/v1.db", db)
	_, _, code := ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, "a v1 file verifies as it is")
	l := StartLedgerd(t, db)
	assert.Contains(t, l.Logs(), "migrated ledger database")
	assert.Contains(t, l.Logs(), fmt.Sprintf(`"from":1,"to":%d`, sqlite.SchemaVersion))
	r := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"refund-order-1234","execution_id":"exec-7","tool":"payments.refund","effect":"write","input":{"order":1234}}`)
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, "replayed", r.Body["status"])
	require.NoError(t, l.Stop())
	verified(t, db)
}

// TestLedgerd_badFlagValues: nonsense values exit 2 with a message.
func TestLedgerd_badFlagValues(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--rate-limit", "NaN"}, {"--rate-limit", "-1"}, {"--rate-limit", "+Inf"},
		{"--rate-burst", "0"}, {"--rate-burst", "-5"},
		{"--max-inflight", "-1"}, {"--max-inflight-per-client", "-2"}, {"--read-header-timeout", "-1s"}, {"--batch-linger", "-1ms"}, {"--read-header-timeout", "0s"},
		{"--cache-mib", "0"}, {"--cache-mib", "3"}, {"--cache-mib", "-64"},
	} {
		t.Run(strings.Join(args, "="), func(t *testing.T) {
			dir := t.TempDir()
			out, code := runLedgerd(t, append([]string{"--db", filepath.Join(dir, "l.db"), "--listen", "127.0.0.1:0"}, args...)...)
			assert.Equal(t, 2, code, out)
			assert.Contains(t, out, args[0])
			entries, _ := os.ReadDir(dir)
			assert.Empty(t, entries)
		})
	}
}

// rawHTTP sends a raw request and returns the status line, headers and body.
func rawHTTP(t *testing.T, l *Ledgerd, req string) (int, http.Header, string) {
	t.Helper()
	c := testkit.Dial(t, strings.TrimPrefix(l.URL, "http://"), 10*time.Second)
	_, err := io.WriteString(c, req)
	require.NoError(t, err)
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(b)
}

// TestLedgerd_httpEdges covers the HTTP corners of the hardening issue.
func TestLedgerd_httpEdges(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	r := l.Do("POST", "/v1/effects/reserve", reserve("edge-key-0001", "exec-1", 1, false))
	require.Equal(t, 201, r.Status)

	t.Run("405 carries Allow", func(t *testing.T) {
		for path, want := range map[string]string{
			"/v1/effects/reserve":              "POST",
			"/v1/head":                         "GET, HEAD",
			"/v1/effects/edge-key-0001":        "GET, HEAD",
			"/v1/effects/edge-key-0001/commit": "POST",
		} {
			method := "DELETE"
			r := l.Do(method, path, "")
			assert.Equal(t, 405, r.Status, path)
			assert.Equal(t, "method_not_allowed", r.Code())
			assert.Equal(t, want, r.Header.Get("Allow"), path)
		}
	})
	t.Run("bad percent-encoding is a JSON 400", func(t *testing.T) {
		for _, path := range []string{"/v1/effects/%zz", "/v1/effects/%zz/commit", "/v1/receipts/%G1"} {
			status, h, body := rawHTTP(t, l, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
			assert.Equal(t, 400, status, path)
			assert.Equal(t, "application/json", h.Get("Content-Type"), path)
			assert.Contains(t, body, `"code":"invalid_request"`, path)
			assert.Contains(t, body, `"details":{}`)
		}
	})
	t.Run("over-long headers are a JSON 431", func(t *testing.T) {
		status, h, body := rawHTTP(t, l, "GET /v1/head HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 100<<10)+"\r\n\r\n")
		assert.Equal(t, 431, status)
		assert.Equal(t, "application/json", h.Get("Content-Type"))
		assert.Contains(t, body, `"code":"headers_too_large"`)
	})
	t.Run("percent-encoded seq", func(t *testing.T) {
		r := l.Do("GET", "/v1/receipts/%31", "")
		assert.Equal(t, 200, r.Status, r.Raw)
		assert.Equal(t, float64(1), r.Body["seq"])
	})
	t.Run("declared oversize body is 413 without 100 Continue", func(t *testing.T) {
		c := testkit.Dial(t, strings.TrimPrefix(l.URL, "http://"), 10*time.Second)
		_, err := io.WriteString(c, "POST /v1/effects/reserve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
			"Content-Length: 5000000\r\nExpect: 100-continue\r\n\r\n")
		require.NoError(t, err)
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		body, _ := io.ReadAll(res.Body)
		assert.Equal(t, 413, res.StatusCode, "no 100 Continue first")
		assert.Contains(t, string(body), `"code":"body_too_large"`)
	})
	t.Run("gen_ keys are reserved", func(t *testing.T) {
		r := l.Do("POST", "/v1/effects/reserve", reserve("gen_mine-0001", "exec-1", 1, false))
		assert.Equal(t, 400, r.Status)
		assert.Equal(t, "invalid_key", r.Code())
		g := l.Do("POST", "/v1/effects/reserve", reserve("", "exec-2", 1, true))
		require.Equal(t, 201, g.Status)
		key := g.Body["idempotency_key"].(string)
		require.True(t, strings.HasPrefix(key, "gen_"))
		r = l.Do("POST", "/v1/effects/reserve", reserve(key, "exec-3", 1, true))
		assert.Equal(t, 400, r.Status, "sending a generated key back is refused, never a replay")
		r = l.Do("POST", "/v1/effects/reserve", reserve("", "exec-2", 1, true), "Idempotency-Key", key)
		assert.Equal(t, 400, r.Status, "also in the header")
	})
	t.Run("exact results", func(t *testing.T) {
		r := l.Do("POST", "/v1/effects/reserve", reserve("exact-key-0001", "exec-1", 1, false))
		require.Equal(t, 201, r.Status)
		tok := r.Body["reservation"].(string)
		c := func(n string) Resp {
			return l.Do("POST", "/v1/effects/exact-key-0001/commit", `{"reservation":"`+tok+`","outcome":"succeeded","result":{"n":`+n+`}}`)
		}
		require.Equal(t, 201, c("12345678901234567890").Status)
		assert.Equal(t, 200, c("12345678901234567890").Status)
		assert.Equal(t, 409, c("12345678901234567891").Status)
	})
}

// TestLedgerd_readyzWhenTheLedgerFillsTheDisk fills a small tmpfs with the
// ledger's own writes and checks /readyz is 503 from the first failed
// write on.
func TestLedgerd_readyzWhenTheLedgerFillsTheDisk(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", dir).CombinedOutput(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI runs as root and must mount a tmpfs: %v %s", err, out)
		}
		t.Skipf("cannot mount a tmpfs here (needs root): %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	l := StartLedgerd(t, filepath.Join(dir, "ledger.db"))
	big := `"` + strings.Repeat("x", 60<<10) + `"`
	failed := false
	for i := 0; i < 200 && !failed; i++ {
		k := fmt.Sprintf("fill-key-%06d", i)
		r := l.Do("POST", "/v1/effects/reserve", reserve(k, "exec-1", 1, false))
		if r.Status == 503 {
			t.Logf("reserve %d: %s", i, r.Raw)
			failed = true
			break
		}
		require.Equal(t, 201, r.Status, r.Raw)
		c := l.Do("POST", "/v1/effects/"+k+"/commit", `{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded","result":`+big+`}`)
		if c.Status == 503 {
			t.Logf("commit %d: %s", i, c.Raw)
			failed = true
			break
		}
		require.Equal(t, 201, c.Status, c.Raw)
	}
	require.True(t, failed, "the ledger never filled the disk")
	r := l.Do("GET", "/readyz", "")
	assert.Equal(t, 503, r.Status, "readyz turns 503 on the first failed write: %s", r.Raw)
	assert.Equal(t, 503, l.Do("GET", "/readyz", "").Status, "and stays 503 while the disk is full")
}

// TestLedgerd_namespaceDerivedStateRefused: a namespace whose recorded
// head no longer matches its receipts (edited by hand in the ledger file)
// stops ledgerd at start, naming the repair for that namespace, which then
// works.
func TestLedgerd_namespaceDerivedStateRefused(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	l := StartLedgerd(t, db)
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"pay"}`).Status)
	for _, k := range []string{"ns-tail-key-1", "ns-tail-key-2"} {
		r := l.Do("POST", "/v1/ns/pay/effects/reserve", reserve(k, "exec-"+k, 1, true))
		require.Equal(t, 201, r.Status, r.Raw)
	}
	require.NoError(t, l.Stop())
	raw, err := sql.Open("sqlite3", "file:"+db)
	require.NoError(t, err)
	_, err = raw.Exec(`UPDATE ns_head SET seq = 1, hash = (SELECT hash FROM ns_receipts WHERE ns = ns_head.ns AND seq = 1)
		WHERE ns = (SELECT id FROM namespaces WHERE name = 'pay')`)
	require.NoError(t, err)
	require.NoError(t, raw.Close())

	out, code := runLedgerd(t, "--db", db, "--listen", "127.0.0.1:0")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "ledgerctl rebuild-index --db "+db+" --namespace pay")

	_, stderr, code := ledgerctl(t, "rebuild-index", "--db", db, "--namespace", "nope")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, `no namespace "nope"`, stderr)
	stdout, stderr, code := ledgerctl(t, "rebuild-index", "--db", db, "--namespace", "pay")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "2 receipts")
	l = StartLedgerd(t, db)
	r := l.Do("GET", "/v1/ns/pay/effects/ns-tail-key-2", "")
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, "reserved", r.Body["state"], "the key is what its receipts say again")
	out, _, code = ledgerctl(t, "verify", "--db", db, "--all-namespaces")
	assert.Equal(t, 0, code, out)
}
