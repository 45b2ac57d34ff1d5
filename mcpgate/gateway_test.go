package mcpgate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// counter counts the executions of the upstream's tools.
type counter struct {
	mu   sync.Mutex
	runs map[string]int
	// progressSeen is signalled by the client for each progress
	// notification it gets.
	progressSeen chan struct{}
}

func newCounter() *counter {
	return &counter{runs: map[string]int{}, progressSeen: make(chan struct{}, 10)}
}

func (c *counter) inc(tool string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs[tool]++
	return c.runs[tool]
}

func (c *counter) get(tool string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[tool]
}

type noArgs struct{}

// MustStartUpstream serves an MCP server over Streamable HTTP whose tools
// count their executions: charge (no annotations) and get (read-only).
func MustStartUpstream(tb testing.TB) (string, *counter) {
	tb.Helper()
	runs := newCounter()
	s := newUpstreamServer(runs)
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	tb.Cleanup(srv.Close)
	return srv.URL, runs
}

// newUpstreamServer is the upstream's MCP server.
func newUpstreamServer(runs *counter) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "shop", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "charge"}, func(context.Context, *mcp.CallToolRequest, noArgs) (*mcp.CallToolResult, any, error) {
		n := runs.inc("charge")
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("charged, run %d", n)}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "get", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest, noArgs) (*mcp.CallToolResult, any, error) {
			n := runs.inc("get")
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("got, run %d", n)}}}, nil, nil
		})
	// work reports progress twice, the second time once the client has
	// seen the first: the SDK may hand notifications on after the answer
	// that follows them.
	mcp.AddTool(s, &mcp.Tool{Name: "work", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, _ noArgs) (*mcp.CallToolResult, any, error) {
			for i := range 2 {
				err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
					ProgressToken: req.Params.GetProgressToken(), Progress: float64(i + 1), Total: 2})
				if err != nil {
					return nil, nil, err
				}
				select {
				case <-runs.progressSeen:
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "worked"}}}, nil, nil
		})
	return s
}

// MustStartGateway puts a gateway over led in front of the upstream at
// url and connects an MCP client to it over Streamable HTTP.
func MustStartGateway(tb testing.TB, url string, cfg mcpgate.Config, opts ...*mcp.ClientOptions) *mcp.ClientSession {
	tb.Helper()
	up, err := mcpgate.DialURL(context.Background(), url, mcpgate.UpstreamOptions{})
	require.NoError(tb, err)
	return MustStartGatewayOn(tb, up, cfg, opts...)
}

// MustDialInMemory connects to the upstream of MustStartUpstream over an
// in-memory stream transport, the way a stdio server is reached.
func MustDialInMemory(tb testing.TB, runs *counter) *mcpgate.Upstream {
	tb.Helper()
	s := newUpstreamServer(runs)
	up, err := mcpgate.DialTransport(context.Background(), "in-memory", func() mcp.Transport {
		ct, st := mcp.NewInMemoryTransports()
		go func() { _ = s.Run(context.Background(), st) }()
		return ct
	}, mcpgate.UpstreamOptions{})
	require.NoError(tb, err)
	return up
}

// MustStartGatewayOn puts a gateway in front of up and connects an MCP
// client to it over Streamable HTTP.
func MustStartGatewayOn(tb testing.TB, up *mcpgate.Upstream, cfg mcpgate.Config, opts ...*mcp.ClientOptions) *mcp.ClientSession {
	tb.Helper()
	ctx := context.Background()
	g, err := mcpgate.New(up, cfg)
	require.NoError(tb, err)
	srv := httptest.NewServer(g.Handler(mcpgate.HTTPOptions{}))
	var o *mcp.ClientOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, o)
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL}, nil)
	require.NoError(tb, err)
	// Closed last to first: the client, the gateway's server, the upstream.
	tb.Cleanup(func() { _ = up.Close() })
	tb.Cleanup(srv.Close)
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

func call(t *testing.T, s *mcp.ClientSession, tool string) *mcp.CallToolResult {
	t.Helper()
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: tool})
	require.NoError(t, err)
	return res
}

func textOf(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	require.NotEmpty(t, res.Content)
	return res.Content[0].(*mcp.TextContent).Text
}

// mustDeriveKey is the derived key of a call without arguments.
// mustDeriveKey derives the key of a call of ledgerTool with no
// arguments, as the gateway does in ns (SPEC §14: dk2_ in a committed
// namespace).
func mustDeriveKey(t *testing.T, ns *ledger.Namespace, ledgerTool string) string {
	t.Helper()
	dk, err := ledgerport.Port{Ledger: mcpgate.NewLocal(ns)}.DerivationKey(context.Background())
	require.NoError(t, err)
	key, err := mcpgate.DeriveKey(dk, ledgerTool, json.RawMessage(`{}`), "")
	require.NoError(t, err)
	return key
}

func TestGateway_CallTool(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		url, runs := MustStartUpstream(t)
		l := ledgertest.Open(t, ledgertest.WithNow(time.Now)).Ledger
		ns, err := l.Default(context.Background())
		require.NoError(t, err)
		s := MustStartGateway(t, url, mcpgate.Config{Ledger: mcpgate.NewLocal(ns), Wait: time.Second})
		first := call(t, s, "charge")
		again := call(t, s, "charge")
		assert.Equal(t, "charged, run 1", textOf(t, first))
		require.Len(t, again.Content, 2, "the replay's notice, then the recorded content")
		assert.Contains(t, textOf(t, again), "was NOT run again")
		assert.Equal(t, "charged, run 1", again.Content[1].(*mcp.TextContent).Text)
		assert.Equal(t, true, again.Meta[mcpgate.MetaReplayed])
		assert.Equal(t, 1, runs.get("charge"))
		assert.Equal(t, "got, run 1", textOf(t, call(t, s, "get")))
		assert.Equal(t, "got, run 2", textOf(t, call(t, s, "get")))
		h, err := ns.Head(context.Background())
		require.NoError(t, err)
		assert.Equal(t, uint64(3), h.Seq, "reserve, commit, replay; reads leave nothing")
	})

	t.Run("OK a committed namespace derives dk2_ keys", func(t *testing.T) {
		ctx := context.Background()
		url, runs := MustStartUpstream(t)
		l := ledgertest.Open(t, ledgertest.WithNow(time.Now)).Ledger
		require.NoError(t, l.CreateNamespace(ctx, "people", ledger.NamespaceSettings{Payloads: ledger.PayloadsCommitted}))
		ns, err := l.NS(ctx, "people")
		require.NoError(t, err)
		fpKey, err := ns.FingerprintKey(ctx)
		require.NoError(t, err)
		s := MustStartGateway(t, url, mcpgate.Config{Ledger: mcpgate.NewLocal(ns), Wait: time.Second})
		call(t, s, "charge")
		again := call(t, s, "charge")
		want, err := client.DeriveKeyWith(fpKey, "shop.charge", map[string]any{"arguments": json.RawMessage(`{}`), "scope": ""})
		require.NoError(t, err)
		assert.Equal(t, want, again.Meta[mcpgate.MetaKey])
		assert.Equal(t, true, again.Meta[mcpgate.MetaReplayed])
		assert.Equal(t, 1, runs.get("charge"))
	})

	t.Run("ErrMCPError", func(t *testing.T) {
		url, _ := MustStartUpstream(t)
		ns := ledgertest.Open(t, ledgertest.WithNow(time.Now)).Namespace
		s := MustStartGateway(t, url, mcpgate.Config{Ledger: mcpgate.NewLocal(ns), Wait: time.Second})
		_, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "no_such_tool"})
		require.Error(t, err, "the upstream's JSON-RPC error comes back as it was")
		// Recorded not_applied (the default), so it is asked again.
		_, err = s.CallTool(context.Background(), &mcp.CallToolParams{Name: "no_such_tool"})
		require.Error(t, err)
		v, err := ns.Key(context.Background(), mustDeriveKey(t, ns, "shop.no_such_tool"), false)
		require.NoError(t, err)
		assert.Equal(t, "not_applied", v.Receipts[len(v.Receipts)-1].Outcome)
	})

	t.Run("ExactReplays", func(t *testing.T) {
		url, _ := MustStartUpstream(t)
		ns := ledgertest.Open(t, ledgertest.WithNow(time.Now)).Namespace
		s := MustStartGateway(t, url, mcpgate.Config{Ledger: mcpgate.NewLocal(ns), ExactReplays: true})
		first, again := call(t, s, "charge"), call(t, s, "charge")
		assert.Equal(t, true, again.Meta[mcpgate.MetaReplayed])
		assert.Equal(t, first.Content, again.Content)
	})

	t.Run("ErrInvalidKey", func(t *testing.T) {
		url, runs := MustStartUpstream(t)
		ns := ledgertest.Open(t, ledgertest.WithNow(time.Now)).Namespace
		s := MustStartGateway(t, url, mcpgate.Config{Ledger: mcpgate.NewLocal(ns)})
		for _, key := range []any{5, "has a space", "gen_0123456789"} {
			res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge",
				Meta: mcp.Meta{mcpgate.MetaIdempotencyKey: key}})
			require.NoError(t, err)
			assert.True(t, res.IsError, "key %v", key)
			assert.Equal(t, "invalid_key", res.Meta[mcpgate.MetaStatus], "key %v", key)
		}
		assert.Equal(t, 0, runs.get("charge"))
	})

	t.Run("PolicyOverridesAnnotations", func(t *testing.T) {
		url, runs := MustStartUpstream(t)
		ns := ledgertest.Open(t, ledgertest.WithNow(time.Now)).Namespace
		policy, err := mcpgate.ParsePolicy([]byte(`[{"tool": "shop.charge", "effect": "read"}]`))
		require.NoError(t, err)
		s := MustStartGateway(t, url, mcpgate.Config{Ledger: mcpgate.NewLocal(ns), Policy: policy})
		call(t, s, "charge")
		assert.Equal(t, "charged, run 2", textOf(t, call(t, s, "charge")))
		assert.Equal(t, 2, runs.get("charge"))
	})

	t.Run("ErrLedgerUnavailable", func(t *testing.T) {
		url, runs := MustStartUpstream(t)
		l := ledgertest.Open(t, ledgertest.WithNow(time.Now)).Ledger
		ns, err := l.Default(context.Background())
		require.NoError(t, err)
		s := MustStartGateway(t, url, mcpgate.Config{Ledger: mcpgate.NewLocal(ns)})
		other := ledgertest.Open(t, ledgertest.WithNow(time.Now))
		cold := MustStartGateway(t, url, mcpgate.Config{Ledger: mcpgate.NewLocal(other.Namespace)})
		require.NoError(t, other.Ledger.Close())
		call(t, s, "charge") // the gateway has the namespace's derivation key from now on
		want := mustDeriveKey(t, ns, "shop.charge")
		require.NoError(t, l.Close())
		res := call(t, s, "charge")
		assert.True(t, res.IsError)
		assert.Equal(t, mcpgate.StatusLedgerUnavailable, res.Meta[mcpgate.MetaStatus])
		assert.Equal(t, want, res.Meta[mcpgate.MetaKey])
		assert.Equal(t, 1, runs.get("charge"), "not run again")
		// Without the derivation key no key can be derived, and nothing runs.
		res = call(t, cold, "charge")
		assert.Equal(t, mcpgate.StatusLedgerUnavailable, res.Meta[mcpgate.MetaStatus])
		assert.Nil(t, res.Meta[mcpgate.MetaKey])
		assert.Equal(t, 1, runs.get("charge"))
		assert.Equal(t, "got, run 1", textOf(t, call(t, s, "get")), "reads still pass")
	})
}

func TestGateway_progress(t *testing.T) {
	ns := ledgertest.Open(t, ledgertest.WithNow(time.Now)).Namespace
	runs := newCounter()
	var mu sync.Mutex
	var got []*mcp.ProgressNotificationParams
	s := MustStartGatewayOn(t, MustDialInMemory(t, runs), mcpgate.Config{Ledger: mcpgate.NewLocal(ns)}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			got = append(got, r.Params)
			mu.Unlock()
			runs.progressSeen <- struct{}{}
		}})
	params := &mcp.CallToolParams{Name: "work"}
	params.SetProgressToken("agent-token")
	res, err := s.CallTool(context.Background(), params)
	require.NoError(t, err)
	assert.Equal(t, "worked", textOf(t, res))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 2)
	for i, p := range got {
		assert.Equal(t, "agent-token", p.ProgressToken)
		assert.Equal(t, float64(i+1), p.Progress)
	}
}

func TestGateway_listChanged(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "shop", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "first"}, func(context.Context, *mcp.CallToolRequest, noArgs) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)
	ns := ledgertest.Open(t, ledgertest.WithNow(time.Now)).Namespace
	changed := make(chan struct{}, 10)
	cs := MustStartGateway(t, srv.URL, mcpgate.Config{Ledger: mcpgate.NewLocal(ns)}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }})
	_, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)

	mcp.AddTool(s, &mcp.Tool{Name: "second", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest, noArgs) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "second"}}}, nil, nil
		})
	select {
	case <-changed:
	case <-time.After(30 * time.Second):
		t.Fatal("no tools/list_changed relayed")
	}
	tools, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	assert.Equal(t, []string{"first", "second"}, names)
	assert.Equal(t, "second", textOf(t, call(t, cs, "second")))
}

func TestNew(t *testing.T) {
	url, _ := MustStartUpstream(t)
	up, err := mcpgate.DialURL(context.Background(), url, mcpgate.UpstreamOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = up.Close() })
	ns := ledgertest.Open(t, ledgertest.WithNow(time.Now)).Namespace
	for _, tc := range []struct {
		desc    string
		cfg     mcpgate.Config
		wantErr string
	}{
		{"NoLedger", mcpgate.Config{}, "no ledger"},
		{"WaitTooLong", mcpgate.Config{Ledger: mcpgate.NewLocal(ns), Wait: 2 * time.Minute}, "wait"},
		{"LeaseTooShort", mcpgate.Config{Ledger: mcpgate.NewLocal(ns), Lease: time.Millisecond}, "lease"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := mcpgate.New(up, tc.cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
	t.Run("ServerName", func(t *testing.T) {
		g, err := mcpgate.New(up, mcpgate.Config{Ledger: mcpgate.NewLocal(ns)})
		require.NoError(t, err)
		assert.Equal(t, "shop", g.ServerName())
		g, err = mcpgate.New(up, mcpgate.Config{Ledger: mcpgate.NewLocal(ns), ServerName: "my shop/v2"})
		require.NoError(t, err)
		assert.Equal(t, "my_shop_v2", g.ServerName())
	})
}

// recorder keeps the JSON-RPC results an MCP client receives over
// Streamable HTTP, by the method of the request they answer.
type recorder struct {
	mu      sync.Mutex
	results map[string][]byte
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var call struct{ Method string }
	if req.Body != nil {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		_ = json.Unmarshal(body, &call)
	}
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || call.Method == "" || call.Method == "notifications/initialized" {
		return res, err
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil {
		return nil, err
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	// The answer is the last "data:" line of an event stream, or the body.
	msg := body
	for line := range bytes.SplitSeq(body, []byte("\n")) {
		if d, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte("data: ")); ok {
			msg = d
		}
	}
	var m struct{ Result json.RawMessage }
	if json.Unmarshal(msg, &m) == nil && m.Result != nil {
		r.mu.Lock()
		r.results[call.Method] = m.Result
		r.mu.Unlock()
	}
	return res, nil
}

func (r *recorder) result(method string) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.results[method]
}

func recordingClient(tb testing.TB, url string) (*mcp.ClientSession, *recorder) {
	tb.Helper()
	rec := &recorder{results: map[string][]byte{}}
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	s, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url,
		HTTPClient: &http.Client{Transport: rec}}, nil)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = s.Close() })
	return s, rec
}

// TestGateway_rawAnswers: through a Streamable HTTP upstream, tools/list
// and a forwarded call reach the client byte for byte as the upstream
// sent them, not re-encoded by the SDK (which, for one, sorts the members
// of a schema it decoded into a map).
func TestGateway_rawAnswers(t *testing.T) {
	url, _ := MustStartUpstream(t)
	ns := ledgertest.Open(t, ledgertest.WithNow(time.Now)).Namespace
	up, err := mcpgate.DialURL(context.Background(), url, mcpgate.UpstreamOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = up.Close() })
	g, err := mcpgate.New(up, mcpgate.Config{Ledger: mcpgate.NewLocal(ns)})
	require.NoError(t, err)
	srv := httptest.NewServer(g.Handler(mcpgate.HTTPOptions{}))
	t.Cleanup(srv.Close)

	direct, want := recordingClient(t, url)
	gated, got := recordingClient(t, srv.URL)
	for _, s := range []*mcp.ClientSession{direct, gated} {
		_, err := s.ListTools(context.Background(), nil)
		require.NoError(t, err)
		_, err = s.CallTool(context.Background(), &mcp.CallToolParams{Name: "get"})
		require.NoError(t, err)
	}
	// The client speaks 2026-07-28 to the gateway, the upstream 2025-11-25
	// to both: the gateway adds only resultType (SPEC §11.1).
	complete := func(b []byte) string { return `{"resultType":"complete",` + string(b[1:]) }
	require.NotEmpty(t, want.result("tools/list"))
	assert.Equal(t, complete(want.result("tools/list")), string(got.result("tools/list")))
	assert.NotEmpty(t, got.result("tools/call"))
	assert.Equal(t, complete(bytes.Replace(want.result("tools/call"), []byte("run 1"), []byte("run 2"), 1)),
		string(got.result("tools/call")))
}
