package mcpgate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

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
