package test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/testkit"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gatewayBin is examples/gateway, built once in binDir.
var gatewayBin = builtOnce("gateway", "../examples/gateway")

// StartGateway runs examples/gateway (built once) against the ledger at
// ledgerURL (without scheme, as a user may write it), returning its URL.
func StartGateway(t *testing.T, ledgerURL string, env ...string) string {
	t.Helper()
	bin, err := gatewayBin()
	require.NoError(t, err)
	cmd := exec.Command(bin, "--ledger", strings.TrimPrefix(ledgerURL, "http://"), "--listen", "127.0.0.1:0", "--log-format", "json")
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var logs testkit.Buffer
	ready := readyAddr(stderr, "gateway ready", func(line []byte) { _, _ = logs.Write(append(line, '\n')) })
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("gateway logs:\n%s", logs.String())
		}
	})
	select {
	case addr, ok := <-ready:
		require.True(t, ok, "gateway exited:\n%s", logs.String())
		return "http://" + addr
	case <-time.After(60 * time.Second):
		t.Fatalf("gateway not ready:\n%s", logs.String())
		return ""
	}
}

func postJSON(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	res, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out), "%s", raw)
	return res.StatusCode, out
}

// TestGateway_withLedgerd runs the example gateway against the real
// ledgerd binary, as docs/clients.md shows, with a writer token.
func TestGateway_withLedgerd(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	l := StartLedgerd(t, db)
	tok := createToken(t, db, "gateway", "writer")
	reader := createToken(t, db, "auditor", "reader")
	require.Eventually(t, func() bool { return l.Do("GET", "/v1/head", "").Status == 401 }, 60*time.Second, 50*time.Millisecond)
	gw := StartGateway(t, l.URL, "LEDGER_TOKEN="+tok)

	refund := `{"execution_id":"call-%d","input":{"order":1234,"amount":1200}}`
	status, first := postJSON(t, gw+"/tools/payments.refund", strings.Replace(refund, "%d", "1", 1))
	require.Equal(t, 200, status, "%v\n%s", first, l.Logs())
	assert.Equal(t, false, first["replayed"])

	// The model calls the tool again, from two replicas at once.
	var wg sync.WaitGroup
	for i := 2; i <= 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, r := postJSON(t, gw+"/tools/payments.refund", strings.Replace(refund, "%d", strconv.Itoa(i), 1))
			assert.Equal(t, 200, status)
			assert.Equal(t, true, r["replayed"])
			assert.Equal(t, first["external_ref"], r["external_ref"])
		}()
	}
	wg.Wait()

	res, err := http.Get(gw + "/stats")
	require.NoError(t, err)
	defer res.Body.Close()
	var st map[string]float64
	require.NoError(t, json.NewDecoder(res.Body).Decode(&st))
	assert.Equal(t, 1.0, st["payments.refund"], "the refund ran once")

	r := l.Do("GET", "/v1/effects/"+first["key"].(string), "", "Authorization", "Bearer "+tok)
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, "succeeded", r.Body["state"])
	assert.Len(t, r.Body["receipts"], 4, "reserve, commit, two replays")
	r = l.Do("GET", "/v1/receipts?kind=replay", "", "Authorization", "Bearer "+reader)
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Len(t, r.Body["receipts"], 2)
	assert.Equal(t, "gateway", r.Body["receipts"].([]any)[0].(map[string]any)["actor"])
}
