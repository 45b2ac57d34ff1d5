package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/effect-ledger/effect-ledger/testkit"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The MCP revisions the gateway serves (SPEC §11.1), newest first.
const (
	rev2026 = "2026-07-28"
	rev1125 = "2025-11-25"
	rev0618 = "2025-06-18"
)

// tap keeps the raw results a client session received, so a test sees
// members the SDK's types hide (resultType, requestState).
type tap struct {
	mu      sync.Mutex
	results []json.RawMessage
}

func (t *tap) last() map[string]json.RawMessage {
	t.mu.Lock()
	defer t.mu.Unlock()
	var obj map[string]json.RawMessage
	if len(t.results) > 0 {
		_ = json.Unmarshal(t.results[len(t.results)-1], &obj)
	}
	return obj
}

func (t *tap) all() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var b strings.Builder
	for _, r := range t.results {
		b.Write(r)
		b.WriteByte('\n')
	}
	return b.String()
}

type tapTransport struct {
	mcp.Transport
	tap *tap
}

func (t tapTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return tapConn{c, t.tap}, nil
}

type tapConn struct {
	mcp.Connection
	tap *tap
}

func (c tapConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if res, ok := msg.(*jsonrpc.Response); ok && err == nil && res.Result != nil {
		c.tap.mu.Lock()
		c.tap.results = append(c.tap.results, append(json.RawMessage(nil), res.Result...))
		c.tap.mu.Unlock()
	}
	return msg, err
}

// revClient is an agent's session pinned to one protocol revision.
type revClient struct {
	*gateway
	tap *tap
	cmd *exec.Cmd // the ledger-mcp process (stdio only)
}

// clientOptions: a client that fulfils no input request itself (the
// test sends each round), unless elicit is given.
func clientOptions(elicit func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error)) *mcp.ClientOptions {
	if elicit == nil {
		return &mcp.ClientOptions{MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}}
	}
	return &mcp.ClientOptions{ElicitationHandler: elicit}
}

// startGatewayRev runs ledger-mcp with args and connects over stdio at
// revision rev.
func startGatewayRev(t *testing.T, rev string, o *mcp.ClientOptions, args ...string) *revClient {
	t.Helper()
	return startGatewayRevEnv(t, nil, rev, o, args...)
}

// startGatewayRevEnv is startGatewayRev with env added to ledger-mcp's
// environment.
func startGatewayRevEnv(t *testing.T, env []string, rev string, o *mcp.ClientOptions, args ...string) *revClient {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "ledger-mcp"), append([]string{"--log-format", "json"}, args...)...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	logs := &testkit.Buffer{}
	cmd.Stderr = logs
	tp := &tap{}
	g := connectAgent(t, tapTransport{&mcp.CommandTransport{Command: cmd}, tp}, logs, rev, o)
	return &revClient{gateway: g, tap: tp, cmd: cmd}
}

// connectHTTPRev connects to a ledger-mcp --listen at revision rev.
func connectHTTPRev(t *testing.T, url string, logs *testkit.Buffer, rev string, o *mcp.ClientOptions) *revClient {
	t.Helper()
	tp := &tap{}
	g := connectAgent(t, tapTransport{&mcp.StreamableClientTransport{Endpoint: url}, tp}, logs, rev, o)
	return &revClient{gateway: g, tap: tp}
}

// Transports the agent's client reaches ledger-mcp over.
const (
	overStdio = "stdio"
	overHTTP  = "HTTP"
)

var transports = []string{overStdio, overHTTP}

// revGateway is ledger-mcp with one set of flags, reached over one
// transport. Over HTTP one process (--listen) serves every client; over
// stdio each client starts its own, so on an embedded SQLite ledger one
// client at a time.
type revGateway struct {
	transport string
	env, args []string
	url       string // over HTTP
	logs      *testkit.Buffer
	cmd       *exec.Cmd // over HTTP
}

// startRevGateway starts ledger-mcp with args (and env) over transport;
// over stdio it starts with each client.
func startRevGateway(t *testing.T, transport string, env []string, args ...string) *revGateway {
	t.Helper()
	g := &revGateway{transport: transport, env: env, args: args}
	if transport == overHTTP {
		g.start(t)
	}
	return g
}

// start runs the HTTP gateway's process.
func (g *revGateway) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "ledger-mcp"),
		append([]string{"--log-format", "json", "--listen", "127.0.0.1:0"}, g.args...)...)
	if g.env != nil {
		cmd.Env = append(os.Environ(), g.env...)
	}
	logs := &testkit.Buffer{}
	cmd.Stderr = logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	g.cmd, g.logs = cmd, logs
	g.url = "http://" + (&gateway{logs: logs}).logAddr(t, "ledger-mcp ready") + "/mcp"
}

// connect is a client at revision rev.
func (g *revGateway) connect(t *testing.T, rev string, o *mcp.ClientOptions) *revClient {
	t.Helper()
	if g.transport == overHTTP {
		return connectHTTPRev(t, g.url, g.logs, rev, o)
	}
	return startGatewayRevEnv(t, g.env, rev, o, g.args...)
}

// stop ends the HTTP gateway's process (SIGTERM); a stdio gateway ends
// with its client.
func (g *revGateway) stop(t *testing.T) {
	t.Helper()
	if g.transport != overHTTP || g.cmd.ProcessState != nil {
		return
	}
	require.NoError(t, g.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, g.cmd.Wait(), "ledger-mcp logs:\n%s", g.logs.String())
}

// restart stops the HTTP gateway and starts it again on the same
// ledger; its clients connect anew. Over stdio the next client starts
// the next gateway.
func (g *revGateway) restart(t *testing.T) {
	t.Helper()
	if g.transport == overHTTP {
		g.stop(t)
		g.start(t)
	}
}

// round sends one round of a call: its inputResponses and requestState.
func (c *revClient) round(t *testing.T, tool string, args map[string]any, answers mcp.InputResponseMap, state string) (*mcp.CallToolResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args, InputResponses: answers, RequestState: state})
}

// accept and decline answer the confirm tool's elicitation.
var (
	accept  = mcp.InputResponseMap{"ok": &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}}
	decline = mcp.InputResponseMap{"ok": &mcp.ElicitResult{Action: "decline"}}
)

// receipt is one receipt as ledgerctl receipts --json lists it.
type receipt struct {
	Kind        string `json:"kind"`
	Key         string `json:"idempotency_key"`
	ExecutionID string `json:"execution_id"`
	Attempt     int    `json:"attempt"`
	Outcome     string `json:"outcome"`
	ErrorCode   string `json:"error_code"`
}

// toolReceipts lists the receipts of a ledger tool in db.
func toolReceipts(t *testing.T, db, tool string) []receipt {
	t.Helper()
	out, errOut, code := ledgerctl(t, "receipts", "--db", db, "--tool", tool, "--json")
	require.Equal(t, 0, code, out+errOut)
	var rs []receipt
	if err := json.Unmarshal([]byte(out), &rs); err != nil {
		var wrapped struct {
			Receipts []receipt `json:"receipts"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &wrapped), out)
		rs = wrapped.Receipts
	}
	return rs
}

// invalidParams reports whether err is a JSON-RPC invalid params error.
func invalidParams(err error) bool {
	var e *jsonrpc.Error
	return errors.As(err, &e) && e.Code == jsonrpc.CodeInvalidParams
}

// TestLedgerMCP_mrtrConfirm: a 2026-07-28 client in front of a
// 2026-07-28 upstream (stdio), over stdio and Streamable HTTP. A tool that
// asks (input_required with an elicitation) reaches the client; the round
// is committed not_applied INPUT_REQUIRED and its requestState comes back
// as the gateway's envelope; the next round carries inputResponses and
// the upstream's state, continues the same execution at the next attempt
// and is committed once; a tampered or misapplied envelope is invalid
// params with nothing appended; a decline runs nothing and leaves the
// call runnable; a restart between the rounds changes nothing; replays
// carry resultType "complete". The client declares no elicitation and is
// sent the rounds all the same: a 2026-07-28 client is never asked by the
// gateway, and the upstream reads its capabilities in _meta
// (TestLedgerMCP_clientDescribedUpstream).
func TestLedgerMCP_mrtrConfirm(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			t.Parallel()
			testMRTRConfirm(t, tr)
		})
	}
}

func testMRTRConfirm(t *testing.T, tr string) {
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	gw := startRevGateway(t, tr, nil, append([]string{"--db", db}, sh.command()...)...)
	g := gw.connect(t, rev2026, clientOptions(nil))
	assert.Equal(t, rev2026, g.InitializeResult().ProtocolVersion)
	c1 := map[string]any{"id": "C1"}

	first, err := g.round(t, "confirm", c1, nil, "")
	require.NoError(t, err)
	require.True(t, first.NeedsInput(), g.tap.all())
	require.IsType(t, &mcp.ElicitParams{}, first.InputRequests["ok"])
	assert.Equal(t, "Really do C1?", first.InputRequests["ok"].(*mcp.ElicitParams).Message)
	assert.True(t, strings.HasPrefix(first.RequestState, "lrs1."), first.RequestState)
	assert.NotContains(t, first.RequestState, "state-C1", "the upstream's state travels sealed")
	assert.Equal(t, 1, sh.runs("confirm-ask", "C1"))
	assert.Equal(t, 0, sh.runs("confirm", "C1"))

	t.Run("EnvelopeRefused", func(t *testing.T) {
		before := len(toolReceipts(t, db, "test-shop.confirm"))
		s := first.RequestState
		tampered := s[:len(s)-2] + map[bool]string{true: "AA", false: "BB"}[!strings.HasSuffix(s, "AA")]
		_, err := g.round(t, "confirm", c1, accept, tampered)
		assert.True(t, invalidParams(err), "tampered: %v", err)
		_, err = g.round(t, "confirm", map[string]any{"id": "C2"}, accept, s)
		assert.True(t, invalidParams(err), "other arguments: %v", err)
		_, err = g.round(t, "charge", map[string]any{"order": "C1"}, accept, s)
		assert.True(t, invalidParams(err), "other tool: %v", err)
		_, err = g.round(t, "confirm", c1, accept, "state-C1")
		assert.True(t, invalidParams(err), "the upstream's own state: %v", err)
		assert.Len(t, toolReceipts(t, db, "test-shop.confirm"), before, "nothing appended")
		assert.Equal(t, 0, sh.runs("confirm", "C1"))
	})

	done, err := g.round(t, "confirm", c1, accept, first.RequestState)
	require.NoError(t, err)
	require.False(t, done.IsError, text(t, done))
	assert.Equal(t, "confirmed C1, run 1", text(t, done))
	assert.Equal(t, `"complete"`, string(g.tap.last()["resultType"]))
	rs := toolReceipts(t, db, "test-shop.confirm")
	require.Len(t, rs, 4, "%+v", rs)
	assert.Equal(t, []string{"reserve", "commit", "reserve", "commit"}, []string{rs[0].Kind, rs[1].Kind, rs[2].Kind, rs[3].Kind})
	assert.Equal(t, "not_applied", rs[1].Outcome)
	assert.Equal(t, "INPUT_REQUIRED", rs[1].ErrorCode)
	assert.Equal(t, rs[0].ExecutionID, rs[2].ExecutionID, "the rounds are one execution")
	assert.Equal(t, []int{1, 2}, []int{rs[0].Attempt, rs[2].Attempt})
	assert.Equal(t, "succeeded", rs[3].Outcome)

	t.Run("Replay", func(t *testing.T) {
		again, err := g.round(t, "confirm", c1, nil, "")
		require.NoError(t, err)
		assert.Equal(t, true, again.Meta["io.effect-ledger/replayed"])
		assert.Equal(t, `"complete"`, string(g.tap.last()["resultType"]))
		_, err = g.round(t, "confirm", c1, accept, first.RequestState)
		require.NoError(t, err, "a late round of a finished call")
		assert.Equal(t, 1, sh.runs("confirm", "C1"))
	})

	t.Run("GatewayAnswer", func(t *testing.T) {
		res, err := g.round(t, "charge", map[string]any{"order": "x"},
			nil, "")
		require.NoError(t, err)
		require.False(t, res.IsError)
		refused, err := g.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"order": "y"},
			Meta: mcp.Meta{"io.effect-ledger/idempotency-key": "short"}})
		require.NoError(t, err)
		require.True(t, refused.IsError)
		assert.Equal(t, `"complete"`, string(g.tap.last()["resultType"]), "the gateway's own answer")
	})

	t.Run("Decline", func(t *testing.T) {
		d1 := map[string]any{"id": "D1"}
		ask, err := g.round(t, "confirm", d1, nil, "")
		require.NoError(t, err)
		require.True(t, ask.NeedsInput())
		no, err := g.round(t, "confirm", d1, decline, ask.RequestState)
		require.NoError(t, err)
		assert.True(t, no.IsError)
		assert.Contains(t, text(t, no), "decline")
		assert.Equal(t, 0, sh.runs("confirm", "D1"))
		later, err := g.round(t, "confirm", d1, nil, "")
		require.NoError(t, err)
		require.True(t, later.NeedsInput(), "the declined call may be asked again")
		yes, err := g.round(t, "confirm", d1, accept, later.RequestState)
		require.NoError(t, err)
		assert.Equal(t, "confirmed D1, run 1", text(t, yes))
	})

	t.Run("AcceptedAfterRestart", func(t *testing.T) {
		r1 := map[string]any{"id": "R1"}
		ask, err := g.round(t, "confirm", r1, nil, "")
		require.NoError(t, err)
		require.True(t, ask.NeedsInput())
		g.stop(t)
		gw.restart(t)
		g = gw.connect(t, rev2026, clientOptions(nil))
		yes, err := g.round(t, "confirm", r1, accept, ask.RequestState)
		require.NoError(t, err)
		assert.Equal(t, "confirmed R1, run 1", text(t, yes))
		assert.Equal(t, 1, sh.runs("confirm", "R1"))
		assert.NoFileExists(t, db+".mcp-key", "the key is kept in the ledger")
	})

	if tr == overStdio { // the key's storage, whatever the transport
		t.Run("KeyFileOfAnEarlierGatewayStillRead", func(t *testing.T) {
			// A gateway before the key was kept in the ledger made
			// <db>.mcp-key; its envelopes still open after the upgrade.
			sh := newShop(t)
			db := filepath.Join(t.TempDir(), "mcp.db")
			args := append([]string{"--db", db}, sh.command()...)
			old := startGatewayRev(t, rev2026, clientOptions(nil), append([]string{"--state-key-file", db + ".mcp-key"}, args...)...)
			k1 := map[string]any{"id": "K1"}
			ask, err := old.round(t, "confirm", k1, nil, "")
			require.NoError(t, err)
			require.True(t, ask.NeedsInput())
			old.stop(t)
			require.FileExists(t, db+".mcp-key")
			h := startGatewayRev(t, rev2026, clientOptions(nil), args...)
			yes, err := h.round(t, "confirm", k1, accept, ask.RequestState)
			require.NoError(t, err)
			assert.Equal(t, "confirmed K1, run 1", text(t, yes))
		})
	}

	t.Run("ClientFulfils", func(t *testing.T) {
		var asked atomic.Int32
		h := startRevGateway(t, tr, nil, "--db", filepath.Join(t.TempDir(), "mcp.db"), "--", sh.bin, "--dir", sh.dir).
			connect(t, rev2026, clientOptions(func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				asked.Add(1)
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}, nil
			}))
		res := h.call(t, "confirm", map[string]any{"id": "E1"}, nil)
		assert.Equal(t, "confirmed E1, run 1", text(t, res))
		assert.Equal(t, int32(1), asked.Load())
	})

	t.Run("Verify", func(t *testing.T) {
		g.stop(t)
		gw.stop(t)
		out, errOut, code := ledgerctl(t, "verify", "--db", db)
		require.Equal(t, 0, code, out+errOut)
		out, errOut, code = ledgerctl(t, "audit", "--db", db, "--json")
		require.Equal(t, 0, code, out+errOut)
		var audit struct {
			Repeated []map[string]any `json:"repeated_failures"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &audit))
		for _, r := range audit.Repeated {
			assert.NotEqual(t, "INPUT_REQUIRED", r["error_code"], "rounds that asked are no failures: %s", out)
		}
	})
}

// TestLedgerMCP_mrtrAcrossReplicas: two ledger-mcp --ledger replicas
// with one token in front of one ledgerd, each with its own state
// directory, share the key kept in the ledger (GET /v1/mcp/state-key):
// a call's first round answered input_required by replica A completes
// on replica B, as one execution run once, and no key file is made. A
// gateway with another token has another key and refuses the envelope.
func TestLedgerMCP_mrtrAcrossReplicas(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	l := StartLedgerd(t, db)
	require.NoError(t, l.Stop())
	gw := createToken(t, db, "gateway", "writer")
	other := createToken(t, db, "other-gateway", "writer")
	reader := createToken(t, db, "auditor", "reader")
	l = StartLedgerd(t, db)
	sh := newShop(t)
	args := append([]string{"--ledger", l.URL}, sh.command()...)
	var states []string
	replica := func(token string) *revClient {
		state := t.TempDir()
		states = append(states, state)
		return startGatewayRevEnv(t, []string{"LEDGER_TOKEN=" + token, "XDG_STATE_HOME=" + state}, rev2026, clientOptions(nil), args...)
	}
	a, b, c := replica(gw), replica(gw), replica(other)

	c1 := map[string]any{"id": "C1"}
	first, err := a.round(t, "confirm", c1, nil, "")
	require.NoError(t, err)
	require.True(t, first.NeedsInput(), a.tap.all())
	assert.Equal(t, 0, sh.runs("confirm", "C1"))

	_, err = c.round(t, "confirm", c1, accept, first.RequestState)
	assert.True(t, invalidParams(err), "another token's gateway: %v", err)

	done, err := b.round(t, "confirm", c1, accept, first.RequestState)
	require.NoError(t, err, "a: %s\nb: %s", a.logs.String(), b.logs.String())
	require.False(t, done.IsError, text(t, done))
	assert.Equal(t, "confirmed C1, run 1", text(t, done))
	assert.Equal(t, 1, sh.runs("confirm", "C1"))

	r := l.Do("GET", "/v1/receipts?tool=test-shop.confirm", "", "Authorization", "Bearer "+reader)
	require.Equal(t, 200, r.Status, r.Raw)
	rs := r.Body["receipts"].([]any)
	require.Len(t, rs, 4, r.Raw)
	exec := func(i int) any { return rs[i].(map[string]any)["execution_id"] }
	assert.Equal(t, exec(0), exec(2), "the rounds are one execution")
	assert.Equal(t, "succeeded", rs[3].(map[string]any)["outcome"])

	for _, dir := range states {
		assert.NoDirExists(t, filepath.Join(dir, "effect-ledger"), "no key file")
	}
}

// TestLedgerMCP_mrtrOlderLedgerd: a ledgerd older than GET
// /v1/mcp/state-key (404 not_found, here a proxy that hides the route)
// makes ledger-mcp say so in its log and use the key file, which
// replicas sharing it share.
func TestLedgerMCP_mrtrOlderLedgerd(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	target, err := neturl.Parse(l.URL)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	older := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/mcp/state-key") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":{"code":"not_found","message":"no such route","details":{}}}`))
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(older.Close)
	sh := newShop(t)
	state := t.TempDir()
	args := append([]string{"--ledger", older.URL}, sh.command()...)
	env := []string{"XDG_STATE_HOME=" + state}
	a := startGatewayRevEnv(t, env, rev2026, clientOptions(nil), args...)
	b := startGatewayRevEnv(t, env, rev2026, clientOptions(nil), args...)

	o1 := map[string]any{"id": "O1"}
	first, err := a.round(t, "confirm", o1, nil, "")
	require.NoError(t, err)
	require.True(t, first.NeedsInput(), a.tap.all())
	done, err := b.round(t, "confirm", o1, accept, first.RequestState)
	require.NoError(t, err, "b: %s", b.logs.String())
	assert.Equal(t, "confirmed O1, run 1", text(t, done))
	assert.FileExists(t, filepath.Join(state, "effect-ledger", "mcp-state.key"))
	assert.Contains(t, a.logs.String(), "the ledger keeps no state key")
}

// TestLedgerMCP_olderClientsGetNoNewerFields: a client that negotiated
// 2025-11-25 or 2025-06-18, over stdio or Streamable HTTP, never sees
// resultType, inputRequests or requestState, on forwarded answers, replays
// and the gateway's own.
func TestLedgerMCP_olderClientsGetNoNewerFields(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	for _, rev := range []string{rev1125, rev0618} {
		for _, tr := range transports {
			t.Run(rev+"/"+tr, func(t *testing.T) {
				t.Parallel()
				g := startRevGateway(t, tr, nil, append([]string{"--db", filepath.Join(t.TempDir(), "mcp.db")}, sh.command()...)...).
					connect(t, rev, nil)
				assert.Equal(t, rev, g.InitializeResult().ProtocolVersion)
				order := map[string]any{"order": "O-" + rev + "-" + tr}
				first := g.call(t, "charge", order, nil)
				require.False(t, first.IsError, text(t, first))
				again := g.call(t, "charge", order, nil)
				assert.Equal(t, true, again.Meta["io.effect-ledger/replayed"])
				refused := g.call(t, "charge", order, mcp.Meta{"io.effect-ledger/idempotency-key": "short"})
				assert.True(t, refused.IsError)
				_, err := g.ListTools(context.Background(), nil)
				require.NoError(t, err)
				for _, m := range []string{`"resultType"`, `"inputRequests"`, `"requestState"`} {
					assert.NotContains(t, g.tap.all(), m)
				}
			})
		}
	}
}

// TestLedgerMCP_revisionsHTTP: over Streamable HTTP a client pinned to
// 2026-07-28 negotiates 2026-07-28 (no silent fallback), statelessly, and
// is not refused by --max-sessions; clients of 2025-11-25 and 2025-06-18
// keep their sessions beside it, and those count: a third is refused. A
// confirmation's rounds may come from two clients.
func TestLedgerMCP_revisionsHTTP(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	url, logs := startHTTPGateway(t, append([]string{"--db", db, "--max-sessions", "2"}, sh.command()...)...)
	old := map[string]*revClient{}
	for _, rev := range []string{rev1125, rev0618} {
		old[rev] = connectHTTPRev(t, url, logs, rev, nil)
		assert.Equal(t, rev, old[rev].InitializeResult().ProtocolVersion)
		assert.NotEmpty(t, old[rev].ID(), "a session")
		res := old[rev].call(t, "charge", map[string]any{"order": "H-" + rev}, nil)
		require.False(t, res.IsError, text(t, res))
		assert.NotContains(t, old[rev].tap.all(), `"resultType"`)
	}
	a := connectHTTPRev(t, url, logs, rev2026, clientOptions(nil))
	b := connectHTTPRev(t, url, logs, rev2026, clientOptions(nil))
	assert.Equal(t, rev2026, a.InitializeResult().ProtocolVersion, "no fallback to an older revision")
	assert.Empty(t, a.ID(), "stateless")
	for _, rev := range []string{rev1125, rev0618} {
		c := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "1"}, nil)
		_, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url},
			&mcp.ClientSessionOptions{ProtocolVersion: rev})
		assert.Error(t, err, "a third session, of %s, is refused: the two older clients' are counted", rev)
	}

	t.Run("Confirm", func(t *testing.T) {
		h1 := map[string]any{"id": "H1"}
		ask, err := a.round(t, "confirm", h1, nil, "")
		require.NoError(t, err)
		require.True(t, ask.NeedsInput(), a.tap.all())
		done, err := b.round(t, "confirm", h1, accept, ask.RequestState)
		require.NoError(t, err)
		assert.Equal(t, "confirmed H1, run 1", text(t, done), "another client, same envelope")
		again := a.call(t, "confirm", h1, nil)
		assert.Equal(t, true, again.Meta["io.effect-ledger/replayed"])
		assert.Equal(t, `"complete"`, string(a.tap.last()["resultType"]))
	})
}

// TestLedgerMCP_mrtrRace: two clients of one revision race the same
// confirmed call, over stdio (two gateways, one ledgerd) and Streamable
// HTTP (two clients of one gateway): it runs once, and the other client
// gets its recorded result. 2026-07-28 clients, each asked in a first
// round, send their accepting rounds at once; older clients send the call
// at once and the gateway asks them.
func TestLedgerMCP_mrtrRace(t *testing.T) {
	t.Parallel()
	for _, rev := range []string{rev2026, rev1125, rev0618} {
		for _, tr := range transports {
			t.Run(rev+"/"+tr, func(t *testing.T) {
				t.Parallel()
				sh := newShop(t)
				var gw *revGateway
				if tr == overStdio {
					l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
					gw = startRevGateway(t, tr, []string{"XDG_STATE_HOME=" + t.TempDir()}, append([]string{"--ledger", l.URL}, sh.command()...)...)
				} else {
					gw = startRevGateway(t, tr, nil, append([]string{"--db", filepath.Join(t.TempDir(), "mcp.db")}, sh.command()...)...)
				}
				o := clientOptions(nil)
				var asked atomic.Int32
				if rev != rev2026 {
					o = clientOptions(func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
						asked.Add(1)
						return &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}, nil
					})
				}
				a, b := gw.connect(t, rev, o), gw.connect(t, rev, o)
				race := map[string]any{"id": "RACE"}
				states := []string{"", ""}
				if rev == rev2026 {
					for i, c := range []*revClient{a, b} {
						ask, err := c.round(t, "confirm", race, nil, "")
						require.NoError(t, err)
						require.True(t, ask.NeedsInput(), c.tap.all())
						states[i] = ask.RequestState
					}
				}
				answers := map[bool]mcp.InputResponseMap{true: accept}[rev == rev2026]
				var wg sync.WaitGroup
				results := make([]*mcp.CallToolResult, 2)
				start := make(chan struct{})
				for i, c := range []*revClient{a, b} {
					wg.Go(func() {
						<-start
						res, err := c.round(t, "confirm", race, answers, states[i])
						assert.NoError(t, err)
						results[i] = res
					})
				}
				close(start)
				wg.Wait()
				if rev != rev2026 {
					// The first call holds the key while its client is
					// asked; the other is asked too if it takes the key
					// between the first's rounds, else it is a replay.
					assert.Contains(t, []int32{1, 2}, asked.Load())
				}
				replays := 0
				for _, res := range results {
					require.NotNil(t, res)
					assert.False(t, res.IsError, resultTexts(res))
					if res.Meta["io.effect-ledger/replayed"] == true {
						replays++
					}
				}
				assert.Equal(t, 1, replays, "the other client gets the recorded result")
				assert.Equal(t, 1, sh.runs("confirm", "RACE"), "one execution")
			})
		}
	}
}

// TestLedgerMCP_clientDescribedUpstream: the per-request _meta a
// 2026-07-28 upstream gets describes the downstream client, whatever its
// revision and transport, with the upstream's version, never the gateway:
// its name, and elicitation only when the client declared it. In front of
// an older upstream (HTTP, 2025-11-25) a 2026-07-28 client's _meta is not
// sent on, so the upstream does not refuse the request.
func TestLedgerMCP_clientDescribedUpstream(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	elicit := func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		return &mcp.ElicitResult{Action: "decline"}, nil
	}
	for _, rev := range []string{rev2026, rev1125, rev0618} {
		for _, tr := range transports {
			t.Run(rev+"/"+tr, func(t *testing.T) {
				t.Parallel()
				gw := startRevGateway(t, tr, nil, append([]string{"--db", filepath.Join(t.TempDir(), "mcp.db")}, sh.command()...)...)
				for _, declared := range []bool{true, false} {
					o := clientOptions(nil) // declares no elicitation
					if declared {
						o = clientOptions(elicit)
					}
					g := gw.connect(t, rev, o)
					got := text(t, g.call(t, "whoami", nil, nil))
					assert.Equal(t, fmt.Sprintf("client=e2e-agent version=2026-07-28 elicitation=%t", declared), got)
					g.stop(t)
				}
			})
		}
	}
	t.Run("OlderUpstream", func(t *testing.T) {
		up := startHTTPShop(t, sh)
		url, logs := startHTTPGateway(t, "--db", filepath.Join(t.TempDir(), "mcp.db"), "--upstream", up)
		g := connectHTTPRev(t, url, logs, rev2026, nil)
		assert.Equal(t, rev2026, g.InitializeResult().ProtocolVersion)
		res := g.call(t, "charge", map[string]any{"order": "OU1"}, nil)
		require.False(t, res.IsError, text(t, res))
		assert.Equal(t, `"complete"`, string(g.tap.last()["resultType"]))
		assert.Equal(t, 1, sh.runs("charge", "OU1"))
	})
}

// TestLedgerMCP_olderClientConfirms: a client of 2025-11-25 or 2025-06-18
// in front of a 2026-07-28 upstream, over stdio and Streamable HTTP: the
// gateway asks it with elicitation/create on the session that made the
// call and sends the call again with the answer, one execution; a decline
// reaches the upstream, which acts on nothing, and leaves the call
// runnable; a client without elicitation gets the call not run, committed
// not_applied CLIENT_CAPABILITY_MISSING; both calls run later for a client
// that accepts.
func TestLedgerMCP_olderClientConfirms(t *testing.T) {
	t.Parallel()
	answer := func(action string, asked *atomic.Int32) *mcp.ClientOptions {
		return clientOptions(func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked.Add(1)
			return &mcp.ElicitResult{Action: action, Content: map[string]any{}}, nil
		})
	}
	for _, rev := range []string{rev1125, rev0618} {
		for _, tr := range transports {
			t.Run(rev+"/"+tr, func(t *testing.T) {
				t.Parallel()
				sh := newShop(t)
				db := filepath.Join(t.TempDir(), "mcp.db")
				gw := startRevGateway(t, tr, nil, append([]string{"--db", db}, sh.command()...)...)
				last := func() receipt {
					rs := toolReceipts(t, db, "test-shop.confirm")
					require.NotEmpty(t, rs)
					return rs[len(rs)-1]
				}

				var asked atomic.Int32
				g := gw.connect(t, rev, answer("accept", &asked))
				assert.Equal(t, rev, g.InitializeResult().ProtocolVersion)
				res := g.call(t, "confirm", map[string]any{"id": "B1"}, nil)
				assert.Equal(t, "confirmed B1, run 1", text(t, res))
				assert.Equal(t, int32(1), asked.Load())
				assert.NotContains(t, g.tap.all(), `"resultType"`)
				rs := toolReceipts(t, db, "test-shop.confirm")
				require.Len(t, rs, 4, "%+v", rs)
				assert.Equal(t, "INPUT_REQUIRED", rs[1].ErrorCode)
				assert.Equal(t, rs[0].ExecutionID, rs[2].ExecutionID, "the rounds are one execution")
				assert.Equal(t, []int{1, 2}, []int{rs[0].Attempt, rs[2].Attempt})
				assert.Equal(t, "succeeded", rs[3].Outcome)
				g.stop(t)

				declined := map[string]any{"id": "D1"}
				asked.Store(0)
				g = gw.connect(t, rev, answer("decline", &asked))
				no := g.call(t, "confirm", declined, nil)
				assert.True(t, no.IsError)
				assert.Contains(t, text(t, no), "the user answered decline", "the upstream's answer to the decline")
				assert.Equal(t, int32(1), asked.Load())
				assert.Equal(t, 0, sh.runs("confirm", "D1"))
				assert.Equal(t, receipt{Kind: "commit", Outcome: "not_applied", ErrorCode: "TOOL_ERROR"},
					receipt{Kind: last().Kind, Outcome: last().Outcome, ErrorCode: last().ErrorCode})
				assert.NotContains(t, g.tap.all(), `"requestState"`)
				g.stop(t)

				missing := map[string]any{"id": "N1"}
				g = gw.connect(t, rev, nil)
				res = g.call(t, "confirm", missing, nil)
				assert.True(t, res.IsError)
				assert.Equal(t, "CLIENT_CAPABILITY_MISSING", status(res))
				assert.Equal(t, receipt{Kind: "commit", Outcome: "not_applied", ErrorCode: "CLIENT_CAPABILITY_MISSING"},
					receipt{Kind: last().Kind, Outcome: last().Outcome, ErrorCode: last().ErrorCode})
				assert.Equal(t, 1, sh.runs("confirm-ask", "N1"), "nothing sent upstream again")
				g.stop(t)

				asked.Store(0)
				g = gw.connect(t, rev, answer("accept", &asked))
				assert.Equal(t, "confirmed D1, run 1", text(t, g.call(t, "confirm", declined, nil)))
				assert.Equal(t, "confirmed N1, run 1", text(t, g.call(t, "confirm", missing, nil)))
				assert.Equal(t, int32(2), asked.Load())
			})
		}
	}
}

// TestLedgerMCP_mrtrInterruptedRound: the gateway is killed while the
// round that acts runs upstream (SPEC §11.1). The round's reservation has
// no final answer, so ledgerctl audit lists the call as interrupted, like
// any other call whose outcome is unknown, with the round's attempt; the
// round that only asked was committed not_applied and is not; verify
// stays clean.
func TestLedgerMCP_mrtrInterruptedRound(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startGatewayRev(t, rev2026, clientOptions(nil), append([]string{"--db", db, "--lease", "1s"}, sh.command()...)...)
	c9 := map[string]any{"id": "C9"}
	first, err := g.round(t, "confirm", c9, nil, "")
	require.NoError(t, err)
	require.True(t, first.NeedsInput(), g.tap.all())
	hold := filepath.Join(sh.dir, "hold-C9")
	require.NoError(t, os.WriteFile(hold, nil, 0o600))
	t.Cleanup(func() { _ = os.Remove(hold) }) // the orphaned upstream finishes and exits
	go func() { _, _ = g.round(t, "confirm", c9, accept, first.RequestState) }()
	var key string
	require.Eventually(t, func() bool {
		reserves := 0
		for _, r := range toolReceipts(t, db, "test-shop.confirm") {
			if r.Kind == "reserve" {
				reserves++
				key = r.Key
			}
		}
		return reserves == 2
	}, 20*time.Second, 20*time.Millisecond, "the acting round is reserved")
	// kill -9 (not Wait: the held upstream keeps the gateway's stderr open
	// until the cleanup lets it go).
	require.NoError(t, g.cmd.Process.Kill())
	time.Sleep(1200 * time.Millisecond) // the round's lease ends

	out, stderr, code := ledgerctl(t, "audit", "--db", db, "--json")
	require.Equal(t, 0, code, stderr)
	var rep struct {
		Interrupted []struct {
			Key            string `json:"key"`
			Tool           string `json:"tool"`
			Attempt        int    `json:"attempt"`
			AwaitingPerson bool   `json:"awaiting_person"`
		} `json:"interrupted"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Len(t, rep.Interrupted, 1, out)
	assert.Equal(t, key, rep.Interrupted[0].Key)
	assert.Equal(t, "test-shop.confirm", rep.Interrupted[0].Tool)
	assert.Equal(t, 2, rep.Interrupted[0].Attempt, "the second round of the execution")
	text, _, code := ledgerctl(t, "audit", "--db", db)
	require.Equal(t, 0, code)
	assert.Contains(t, text, key)
	out, stderr, code = ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, "%s\n%s", out, stderr)
	assert.Equal(t, 0, sh.runs("confirm", "C9"), "the held round never acted")
}
