package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// pollUntil polls cond every 20 ms until it holds, failing after a
// deadline generous enough for a loaded machine.
func pollUntil(t *testing.T, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), fmt.Sprintf(msg, args...))
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLedgerd_slowClientsDoNotStarveOthers: bodies that arrive slowly
// hold no --max-inflight place, from the same address or the same token.
func TestLedgerd_slowClientsDoNotStarveOthers(t *testing.T) {
	t.Parallel()
	t.Run("open, on loopback", func(t *testing.T) {
		l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"), "--max-inflight", "3")
		for range 3 {
			testkit.SlowBody(t, strings.TrimPrefix(l.URL, "http://"), "")
		}
		r := l.Do("GET", "/v1/head", "")
		assert.Equal(t, 200, r.Status, "the slow bodies hold no place: %s", r.Raw)
		r = l.Do("POST", "/v1/effects/reserve", reserve("fast-key-0001", "exec-1", 1, false))
		assert.Equal(t, 201, r.Status, r.Raw)
	})
	t.Run("by token", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "ledger.db")
		require.NoError(t, StartLedgerd(t, db).Stop())
		slow := createToken(t, db, "slow", "writer")
		fast := createToken(t, db, "fast", "writer")
		l := StartLedgerd(t, db, "--max-inflight", "4")
		for range 4 {
			testkit.SlowBody(t, strings.TrimPrefix(l.URL, "http://"), "Authorization: Bearer "+slow+"\r\n")
		}
		r := l.Do("POST", "/v1/effects/reserve", reserve("fast-key-0001", "exec-1", 1, false), "Authorization", "Bearer "+fast)
		assert.Equal(t, 201, r.Status, "another token is served: %s", r.Raw)
		r = l.Do("GET", "/v1/head", "", "Authorization", "Bearer "+slow)
		assert.Equal(t, 200, r.Status, "and the slow token itself: %s", r.Raw)
	})
}

// TestLedgerd_contentEncodingRefused: a compressed body is 415, never
// read as JSON.
func TestLedgerd_contentEncodingRefused(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	for _, enc := range []string{"br", "gzip", "identity, gzip"} {
		r := l.Do("POST", "/v1/effects/reserve", reserve("enc-key-0001", "exec-1", 1, false), "Content-Encoding", enc)
		assert.Equal(t, 415, r.Status, "%s: %s", enc, r.Raw)
		assert.Equal(t, "unsupported_media_type", r.Code(), enc)
	}
	r := l.Do("POST", "/v1/effects/reserve", reserve("enc-key-0001", "exec-1", 1, false), "Content-Encoding", "identity")
	assert.Equal(t, 201, r.Status, r.Raw)
	assert.Equal(t, float64(1), l.Do("GET", "/v1/head", "").Body["seq"], "only the identity body was recorded")
}

// TestLedgerd_storedJSONIsIJSON: result and string fields follow the
// I-JSON rules that input follows.
func TestLedgerd_storedJSONIsIJSON(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	body := func(key string) string {
		return fmt.Sprintf(`{"idempotency_key":%q,"execution_id":"exec-1","tool":"t","effect":"write","input":{"n":1e400}}`, key)
	}
	r := l.Do("POST", "/v1/effects/reserve", body("ijson-key-0000"))
	require.Equal(t, 400, r.Status, "input refuses 1e400: %s", r.Raw)
	commit := func(i int, fields string) Resp {
		key := fmt.Sprintf("ijson-key-%04d", i)
		tok := l.Reserve(t, reserve(key, "exec-1", 1, false))
		return l.Do("POST", "/v1/effects/"+key+"/commit", `{"reservation":"`+tok+`","outcome":"succeeded",`+fields+`}`)
	}
	for i, tt := range []struct{ desc, fields, field string }{
		{"number beyond a double", `"result":{"n":1e400}`, "result"},
		{"lone high surrogate", `"result":"\ud800"`, "result"},
		{"lone low surrogate in a member name", `"result":{"\udc00":1}`, "result"},
		{"member twice", `"result":{"a":1,"a":2}`, "result"},
		{"lone surrogate in external_ref", `"external_ref":"re_\ud800"`, "external_ref"},
	} {
		r := commit(i+1, tt.fields)
		assert.Equal(t, 400, r.Status, "%s: %s", tt.desc, r.Raw)
		assert.Equal(t, "invalid_request", r.Code(), tt.desc)
		assert.Contains(t, r.Raw, `"field":"`+tt.field+`"`, tt.desc)
	}
	r = commit(99, `"result":{"emoji":"\ud83d\ude00","big":12345678901234567890}`)
	assert.Equal(t, 201, r.Status, "a surrogate pair and a long integer are I-JSON: %s", r.Raw)
}

// TestLedgerd_metricsNeedAToken: once tokens exist /metrics needs a
// reader token, and a namespace-scoped token sees only its namespaces.
func TestLedgerd_metricsNeedAToken(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	require.NoError(t, StartLedgerd(t, db).Stop())
	for _, ns := range []string{"payments", "secret-project"} {
		_, stderr, code := ledgerctl(t, "namespace", "create", "--db", db, ns)
		require.Equal(t, 0, code, stderr)
	}
	admin := createToken(t, db, "ops", "admin")
	reader := createToken(t, db, "prometheus", "reader")
	out, stderr, code := ledgerctl(t, "token", "create", "--db", db, "--role", "reader", "--name", "pay-audit", "--namespace", "payments")
	require.Equal(t, 0, code, stderr)
	scoped := strings.TrimSpace(out)
	l := StartLedgerd(t, db)
	for _, ns := range []string{"payments", "secret-project"} {
		r := l.Do("POST", "/v1/ns/"+ns+"/effects/reserve", reserve("metric-key-0001", "exec-1", 1, false), "Authorization", "Bearer "+admin)
		require.Equal(t, 201, r.Status, r.Raw)
	}
	r := l.Do("GET", "/metrics", "")
	assert.Equal(t, 401, r.Status, "anonymous: %s", truncated(r.Raw))
	r = l.Do("GET", "/metrics", "", "Authorization", "Bearer "+reader)
	require.Equal(t, 200, r.Status)
	assert.Contains(t, r.Raw, `namespace="secret-project"`)
	assert.Contains(t, r.Raw, `namespace="payments"`)
	r = l.Do("GET", "/metrics", "", "Authorization", "Bearer "+scoped)
	require.Equal(t, 200, r.Status)
	assert.Contains(t, r.Raw, `namespace="payments"`)
	assert.NotContains(t, r.Raw, "secret-project", "a scoped token learns nothing of other namespaces")
	assert.Contains(t, r.Raw, "ledger_http_request_duration_seconds", "series about no namespace stay")

	require.NoError(t, l.Stop())
	open := StartLedgerd(t, db, "--metrics-auth=false")
	assert.Equal(t, 200, open.Do("GET", "/metrics", "").Status, "the operator's explicit choice")
}

func truncated(s string) string { return s[:min(len(s), 300)] }

// TestLedgerd_receiptRoutesReadSeqAlike: the proof route decodes {seq}
// like the receipt route, and query integers take the whole int64 range.
func TestLedgerd_receiptRoutesReadSeqAlike(t *testing.T) {
	t.Parallel()
	l, vkey, _ := startSigned(t, t.TempDir())
	appendN(t, l, "seq", 2)
	waitCheckpoint(t, l, vkey, 2)
	r := l.Do("GET", "/v1/receipts/%31/proof", "")
	assert.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, l.Do("GET", "/v1/receipts/1/proof", "").Raw, r.Raw)
	r = l.Do("GET", "/v1/proof/inclusion?seq=9223372036854775807", "")
	assert.Equal(t, 404, r.Status, r.Raw)
	assert.Equal(t, "unknown_receipt", r.Code())
	for _, q := range []string{"/v1/proof/inclusion?seq=1&size=9223372036854775807", "/v1/proof/consistency?from=9223372036854775807",
		"/v1/proof/consistency?from=1&to=9223372036854775807"} {
		r = l.Do("GET", q, "")
		// Not a checkpointed size, or beyond the tree: the route's own
		// answer about the value, never a failure to read the number.
		assert.True(t, r.Status >= 400 && r.Status < 500, "%s: %d %s", q, r.Status, r.Raw)
		assert.NotContains(t, r.Raw, "must be one non-negative integer", q)
	}
	r = l.Do("GET", "/v1/proof/inclusion?seq=9223372036854775808", "")
	assert.Equal(t, 400, r.Status, "beyond int64: %s", r.Raw)
}

// runLedgerdBounded runs ledgerd to its exit, killing it (and failing)
// if it does not exit within a minute.
func runLedgerdBounded(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "ledgerd"), args...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, ctx.Err(), "ledgerd did not exit: %s", out)
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	}
	require.NoError(t, err, "%s", out)
	return string(out), 0
}

// TestLedgerd_signingKeyFileRules: a key that is not a regular file, or
// that group or others may read, is refused at start.
func TestLedgerd_signingKeyFileRules(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key, _ := keygen(t, dir, "ex.test")
	base := []string{"--db", filepath.Join(dir, "ledger.db"), "--listen", "127.0.0.1:0", "--log-origin", "ex.test"}

	fifo := filepath.Join(dir, "key.fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	out, code := runLedgerdBounded(t, append(base, "--signing-key", fifo)...)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, out, "not a regular file")

	require.NoError(t, os.Chmod(key, 0o644))
	out, code = runLedgerdBounded(t, append(base, "--signing-key", key)...)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, out, "chmod 600")
	_, err := os.Stat(filepath.Join(dir, "ledger.db"))
	assert.ErrorIs(t, err, os.ErrNotExist, "refused before the database is created")

	l := StartLedgerd(t, filepath.Join(dir, "ledger.db"), "--signing-key", key, "--log-origin", "ex.test", "--allow-readable-signing-key")
	assert.Contains(t, l.Logs(), `"level":"WARN","msg":"the signing key file may be read by group or others`)
}

// namespaceCheckpoint waits for a checkpoint of namespace ns of at least
// size leaves and returns its note.
func namespaceCheckpoint(t *testing.T, l *Ledgerd, ns string, size int64) string {
	t.Helper()
	var note string
	pollUntil(t, func() bool {
		r := l.Do("GET", "/log/"+ns+"/checkpoint", "")
		if r.Status != 200 {
			return false
		}
		c, err := tlog.ParseCheckpoint(tlog.NoteText([]byte(r.Raw)))
		note = r.Raw
		return err == nil && c.Size >= size
	}, "no checkpoint of %s at size %d", ns, size)
	return note
}

// TestLedgerctl_anotherNamespacesCheckpointRefused: verify --checkpoint
// and check-proof want the origin of the namespace verified.
func TestLedgerctl_anotherNamespacesCheckpointRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, vkey, _ := startSigned(t, dir)
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"payments"}`).Status)
	appendN(t, l, "dflt", 2)
	r := l.Do("POST", "/v1/ns/payments/effects/reserve", reserve("pay-key-0001", "exec-1", 1, false))
	require.Equal(t, 201, r.Status, r.Raw)
	waitCheckpoint(t, l, vkey, 2)
	payCP := filepath.Join(dir, "payments.cp")
	require.NoError(t, os.WriteFile(payCP, []byte(namespaceCheckpoint(t, l, "payments", 1)), 0o644))

	state := filepath.Join(dir, "state.json")
	out, stderr, code := ledgerctl(t, "verify", "--db", l.DB, "--checkpoint", payCP, "--vkey", vkey, "--state", state)
	assert.NotEqual(t, 0, code, "%s%s", out, stderr)
	assert.Contains(t, out+stderr, `"ex.test/payments", want "ex.test/default"`)
	if b, err := os.ReadFile(state); err == nil {
		assert.NotContains(t, string(b), "payments", "never stored")
	}
	out, stderr, code = ledgerctl(t, "verify", "--db", l.DB, "--namespace", "payments", "--checkpoint", payCP, "--vkey", vkey)
	assert.Equal(t, 0, code, "its own namespace: %s%s", out, stderr)

	proof, stderr, code := ledgerctl(t, "prove", "--server", l.URL+"/v1/ns/payments", "1")
	if code != 0 {
		proof, stderr, code = ledgerctl(t, "prove", "--db", l.DB, "--namespace", "payments", "1")
	}
	require.Equal(t, 0, code, stderr)
	pf := filepath.Join(dir, "pay.json")
	require.NoError(t, os.WriteFile(pf, []byte(proof), 0o644))
	out, _, code = ledgerctl(t, "check-proof", pf, "--vkey", vkey)
	assert.Equal(t, 1, code, "checked as a receipt of default: %s", out)
	assert.Contains(t, out, "INVALID")
	out, stderr, code = ledgerctl(t, "check-proof", pf, "--vkey", vkey, "--namespace", "payments")
	assert.Equal(t, 0, code, "%s%s", out, stderr)
	assert.Contains(t, out, "is in ex.test/payments")
}

// TestLedgerctl_checkProofReadsStrictly: a portable receipt with unknown
// or repeated fields, or data after it, is invalid.
func TestLedgerctl_checkProofReadsStrictly(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, vkey, _ := startSigned(t, dir)
	appendN(t, l, "strict", 1)
	waitCheckpoint(t, l, vkey, 1)
	out, stderr, code := ledgerctl(t, "prove", "--db", l.DB, "1")
	require.Equal(t, 0, code, stderr)
	good := strings.TrimSpace(out)
	check := func(doc string) (string, int) {
		f := filepath.Join(t.TempDir(), "p.json")
		require.NoError(t, os.WriteFile(f, []byte(doc), 0o644))
		out, stderr, code := ledgerctl(t, "check-proof", f, "--vkey", vkey)
		return out + stderr, code
	}
	out, code = check(good)
	require.Equal(t, 0, code, out)
	inner := strings.Replace(good, `"receipt":{`, `"receipt":{"seq":1,`, 1)
	require.NotEqual(t, good, inner)
	for _, tt := range []struct{ desc, doc, want string }{
		{"unknown envelope field", strings.Replace(good, `{"receipt"`, `{"verified_by":"us","receipt"`, 1), "unknown field"},
		{"unknown receipt field", strings.Replace(good, `"receipt":{`, `"receipt":{"approved":true,`, 1), "unknown field"},
		{"envelope field twice", strings.Replace(good, `{"receipt"`, `{"leaf_index":0,"receipt"`, 1), "twice"},
		{"receipt field twice", inner, "twice"},
		{"trailing garbage", good + "garbage", "INVALID"},
		{"trailing bracket", good + "]", "INVALID"},
		{"trailing number", good + "\n5\n", "INVALID"},
	} {
		out, code := check(tt.doc)
		assert.Equal(t, 1, code, "%s: %s", tt.desc, out)
		assert.Contains(t, out, tt.want, tt.desc)
	}
	out, code = check(good + "\n" + good + "\n")
	assert.Equal(t, 0, code, "JSON Lines of receipts: %s", out)
}

// TestLedgerctl_backupSweepsKilledTemporaries: the temporary copy that a
// killed backup left beside --out is removed by the next backup.
func TestLedgerctl_backupSweepsKilledTemporaries(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l := StartLedgerd(t, filepath.Join(dir, "ledger.db"))
	appendN(t, l, "bk", 2)
	outDir := t.TempDir()
	stale := filepath.Join(outDir, ".copy.db.tmp-1234567")
	for _, f := range []string{stale, stale + "-journal"} {
		require.NoError(t, os.WriteFile(f, []byte("half a copy"), 0o600))
	}
	_, stderr, code := ledgerctl(t, "backup", "--db", l.DB, "--out", filepath.Join(outDir, "copy.db"))
	require.Equal(t, 0, code, stderr)
	entries, err := os.ReadDir(outDir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	assert.Equal(t, []string{"copy.db"}, names, "no temporaries left beside --out")
}

// TestHelpTextsMatchTheCode: the help texts say what the binaries do.
func TestHelpTextsMatchTheCode(t *testing.T) {
	t.Parallel()
	out, _ := runLedgerdBounded(t, "--help")
	assert.NotContains(t, out, "SQLite ledger and")
	assert.Contains(t, out, "PostgreSQL")
	assert.Contains(t, out, "/log/NS/")
	assert.NotContains(t, out, "serve /log/default/ (checkpoint")
	_, stderr, _ := ledgerctl(t, "backup", "--help")
	assert.NotContains(t, stderr, "postgres://", "backup refuses PostgreSQL URLs")

	db := filepath.Join(t.TempDir(), "ledger.db")
	require.NoError(t, StartLedgerd(t, db).Stop())
	w := createToken(t, db, "gw", "writer")
	l := StartLedgerd(t, db)
	r := l.Do("GET", "/v1/receipts", "", "Authorization", "Bearer "+w)
	require.Equal(t, 403, r.Status)
	assert.Contains(t, r.Body["error"].(map[string]any)["message"], "needs a reader or admin token")
	out, stderr, code := ledgerctl(t, "verify", "--server", l.URL, "--token", w)
	assert.Equal(t, 2, code, out)
	assert.Contains(t, stderr, "role writer")
	assert.Contains(t, stderr, "reader")
}
