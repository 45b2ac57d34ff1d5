package test

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"github.com/effect-ledger/effect-ledger/testkit"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startHTTPShop runs the test upstream on Streamable HTTP and returns its
// /mcp URL; args are more of its flags.
func startHTTPShop(t *testing.T, sh *shop, args ...string) string {
	t.Helper()
	cmd := exec.Command(sh.bin, append([]string{"--dir", sh.dir, "--http", "127.0.0.1:0"}, args...)...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	require.True(t, ok, line)
	return "http://" + addr + "/mcp"
}

// startHTTPGateway runs ledger-mcp with --listen and returns its /mcp URL.
func startHTTPGateway(t *testing.T, args ...string) (string, *testkit.Buffer) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "ledger-mcp"),
		append([]string{"--log-format", "json", "--listen", "127.0.0.1:0"}, args...)...)
	logs := &testkit.Buffer{}
	cmd.Stderr = logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	g := &gateway{logs: logs}
	return "http://" + g.logAddr(t, "ledger-mcp ready") + "/mcp", logs
}

// connectHTTP is an MCP client session over Streamable HTTP.
func connectHTTP(t *testing.T, url string, logs *testkit.Buffer) *gateway {
	t.Helper()
	return connectAgent(t, &mcp.StreamableClientTransport{Endpoint: url}, logs, "", nil)
}

// connectHTTPWithKeys is connectHTTP that sends the keys of
// paramsKeyMeta as params.idempotencyKey (keyTransport).
func connectHTTPWithKeys(t *testing.T, url string, logs *testkit.Buffer) *gateway {
	t.Helper()
	return connectAgent(t, &keyTransport{&mcp.StreamableClientTransport{Endpoint: url}}, logs, "", nil)
}

// TestLedgerMCP_http: Streamable HTTP on both sides; two agent sessions
// share one upstream connection and one ledger.
func TestLedgerMCP_http(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	up := startHTTPShop(t, sh)
	db := filepath.Join(t.TempDir(), "mcp.db")
	url, logs := startHTTPGateway(t, "--db", db, "--upstream", up)
	a, b := connectHTTP(t, url, logs), connectHTTP(t, url, logs)

	tools, err := a.ListTools(context.Background(), nil)
	require.NoError(t, err)
	assert.Len(t, tools.Tools, 16)

	first := a.call(t, "charge", map[string]any{"order": "H1"}, nil)
	require.False(t, first.IsError, text(t, first))
	second := b.call(t, "charge", map[string]any{"order": "H1"}, nil)
	assert.Equal(t, true, second.Meta["io.effect-ledger/replayed"])
	assert.Equal(t, first.StructuredContent, second.StructuredContent)
	assert.Equal(t, 1, sh.runs("charge", "H1"))

	assert.Equal(t, "order H1, lookup 1", text(t, a.call(t, "lookup", map[string]any{"order": "H1"}, nil)))
	assert.Equal(t, "order H1, lookup 2", text(t, b.call(t, "lookup", map[string]any{"order": "H1"}, nil)))

	// params.idempotencyKey arrives in an HTTP body too.
	k := connectHTTPWithKeys(t, url, logs)
	r1 := k.call(t, "charge", map[string]any{"order": "H2"}, mcp.Meta{paramsKeyMeta: "http-key-H2"})
	require.False(t, r1.IsError, text(t, r1))
	r2 := k.call(t, "charge", map[string]any{"order": "H3"}, mcp.Meta{paramsKeyMeta: "http-key-H2"})
	assert.Equal(t, "fingerprint_mismatch", status(r2))
	assert.Equal(t, "http-key-H2", r2.Meta["io.effect-ledger/key"])
}

// TestLedgerMCP_remoteLedger: ledger-mcp --ledger URL over a real
// ledgerd; with the ledgerd gone no effect runs, and reads still pass.
func TestLedgerMCP_remoteLedger(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	g := startGateway(t, append([]string{"--ledger", l.URL, "--wait", "1s"}, sh.command()...)...)

	first := g.call(t, "charge", map[string]any{"order": "L1"}, nil)
	require.False(t, first.IsError, text(t, first))
	again := g.call(t, "charge", map[string]any{"order": "L1"}, nil)
	assert.Equal(t, true, again.Meta["io.effect-ledger/replayed"])
	assert.Equal(t, 1, sh.runs("charge", "L1"))
	key, _ := again.Meta["io.effect-ledger/key"].(string)
	r := l.Do("GET", "/v1/effects/"+key, "")
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, "succeeded", r.Body["state"])
	assert.Equal(t, "test-shop.charge", r.Body["tool"])
	assert.Equal(t, "destructive", r.Body["effect"])

	require.NoError(t, l.Stop())
	down := g.call(t, "charge", map[string]any{"order": "L2"}, nil)
	assert.True(t, down.IsError)
	assert.Equal(t, "ledger_unavailable", status(down))
	assert.Equal(t, 0, sh.runs("charge", "L2"))
	read := g.call(t, "lookup", map[string]any{"order": "L2"}, nil)
	assert.Equal(t, "order L2, lookup 1", text(t, read))

	out, errOut, code := ledgerctl(t, "verify", "--db", l.DB)
	require.Equal(t, 0, code, out+errOut)
	out, _, code = ledgerctl(t, "audit", "--db", l.DB, "--json")
	require.Equal(t, 0, code)
	var audit struct {
		ReInvocations []map[string]any `json:"re_invocations"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &audit))
	require.Len(t, audit.ReInvocations, 1, out)
	assert.Contains(t, out, key)
}

// TestLedgerMCP_commandLine: --help, --version, bad flags (exit 2), an
// upstream that cannot start (exit 1, naming the command), and a second
// gateway on one SQLite file.
func TestLedgerMCP_commandLine(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(binDir, "ledger-mcp")
	run := func(args ...string) (string, string, int) { return runCmd(t, exec.Command(bin, args...)) }
	t.Run("Help", func(t *testing.T) {
		out, errOut, code := run("--help")
		assert.Equal(t, 0, code)
		assert.Empty(t, out, "stdout is the MCP channel")
		assert.Contains(t, errOut, "ledger-mcp [flags] -- COMMAND")
		assert.Contains(t, errOut, "--scope")
	})
	t.Run("Version", func(t *testing.T) {
		out, _, code := run("--version")
		assert.Equal(t, 0, code)
		assert.True(t, strings.HasPrefix(out, "ledger-mcp "), out)
		ctlOut, _, _ := ledgerctl(t, "--version")
		assert.Equal(t, strings.Count(ctlOut, "\n"), strings.Count(out, "\n"), "same shape as ledgerctl --version")
	})
	for _, tc := range []struct {
		desc string
		args []string
		want string
	}{
		{"NoUpstream", nil, "no upstream MCP server"},
		{"BothUpstreams", []string{"--upstream", "http://127.0.0.1:1/mcp", "--", "true"}, "give one upstream"},
		{"UnknownFlag", []string{"--nope", "--", "true"}, "flag provided but not defined"},
		{"WaitTooLong", []string{"--wait", "2m", "--", "true"}, "--wait"},
		{"DBAndLedger", []string{"--db", "x.db", "--ledger", "http://127.0.0.1:1", "--", "true"}, "exclude"},
		{"BadPolicy", []string{"--policy", "/nonexistent/policy.json", "--", "true"}, "--policy"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, errOut, code := run(tc.args...)
			assert.Equal(t, 2, code, errOut)
			assert.Contains(t, errOut, tc.want)
		})
	}
	t.Run("UpstreamCannotStart", func(t *testing.T) {
		_, errOut, code := run("--db", filepath.Join(t.TempDir(), "x.db"), "--", "/nonexistent/mcp-server", "--flag")
		assert.Equal(t, 1, code)
		assert.Contains(t, errOut, `"/nonexistent/mcp-server --flag"`)
	})
	t.Run("SecondGatewayOnOneFile", func(t *testing.T) {
		sh := newShop(t)
		db := filepath.Join(t.TempDir(), "mcp.db")
		startGateway(t, append([]string{"--db", db}, sh.command()...)...)
		_, errOut, code := run(append([]string{"--db", db}, sh.command()...)...)
		assert.Equal(t, 1, code)
		assert.Contains(t, errOut, "--ledger URL")
	})
	t.Run("DefaultDB", func(t *testing.T) {
		sh := newShop(t)
		state := t.TempDir()
		g := startGatewayEnv(t, []string{"XDG_STATE_HOME=" + state}, sh.command()...)
		require.False(t, g.call(t, "charge", map[string]any{"order": "D1"}, nil).IsError)
		g.stop(t)
		out, errOut, code := ledgerctl(t, "verify", "--db", filepath.Join(state, "effect-ledger", "mcp-test-shop.db"))
		require.Equal(t, 0, code, out+errOut)
	})
}

// TestLedgerMCP_traceContext: a call's W3C trace context in _meta reaches
// the remote ledgerd, whose spans of the call's derivation key, reserve
// and commit then continue the agent's trace.
func TestLedgerMCP_traceContext(t *testing.T) {
	t.Parallel()
	rc := startOTLPReceiver(t)
	sh := newShop(t)
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"), "--otlp-endpoint", rc.URL+"/v1/traces")
	g := startGateway(t, append([]string{"--ledger", l.URL}, sh.command()...)...)

	const traceID = "0af7651916cd43dd8448eb211c80319c"
	const parentID = "b7ad6b7169203331"
	res := g.call(t, "charge", map[string]any{"order": "T1"}, mcp.Meta{"traceparent": "00-" + traceID + "-" + parentID + "-01"})
	require.False(t, res.IsError, text(t, res))
	require.NoError(t, l.Stop(), "SIGTERM flushes the spans")

	var names []string // the server spans that are children of the agent's span
	for _, s := range rc.Spans() {
		if hex.EncodeToString(s.TraceId) == traceID && hex.EncodeToString(s.ParentSpanId) == parentID {
			names = append(names, s.Name)
		}
	}
	// The first guarded call also asks for the derivation key (SPEC §14), within the call's trace.
	assert.ElementsMatch(t, []string{"GET /v1/derivation-key", "POST /v1/effects/reserve", "POST /v1/effects/{key}/commit"}, names)
}
