package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/testkit"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// mcpUpstreamBin is the test MCP server (testdata/mcp-upstream), built
// once.
var mcpUpstreamBin = builtOnce("mcp-upstream", "./testdata/mcp-upstream")

// shop is one test upstream's directory: its executions file and the
// release files of its slow tool.
type shop struct {
	t   *testing.T
	dir string
	bin string
}

func newShop(t *testing.T) *shop {
	t.Helper()
	bin, err := mcpUpstreamBin()
	require.NoError(t, err)
	return &shop{t: t, dir: t.TempDir(), bin: bin}
}

// command is the upstream's command line for ledger-mcp, after --.
func (s *shop) command() []string { return []string{"--", s.bin, "--dir", s.dir} }

// runs is how often the tool really ran with that id (or order).
func (s *shop) runs(tool, id string) int {
	b, err := os.ReadFile(filepath.Join(s.dir, "executions"))
	if os.IsNotExist(err) {
		return 0
	}
	require.NoError(s.t, err)
	n := 0
	for l := range strings.Lines(string(b)) {
		if l == tool+" "+id+"\n" {
			n++
		}
	}
	return n
}

// release lets the slow call of id finish.
func (s *shop) release(id string) {
	require.NoError(s.t, os.WriteFile(filepath.Join(s.dir, "release-"+id), nil, 0o600))
}

// gateway is a ledger-mcp child process driven by the Go SDK's client
// over stdio.
type gateway struct {
	*mcp.ClientSession
	logs *testkit.Buffer
}

// startGateway runs ledger-mcp with args and connects to it over stdio.
func startGateway(t *testing.T, args ...string) *gateway {
	t.Helper()
	return startGatewayEnv(t, nil, args...)
}

// startGatewayEnv is startGateway with extra environment variables.
func startGatewayEnv(t *testing.T, env []string, args ...string) *gateway {
	t.Helper()
	return startAgentEnv(t, env, "", nil, args...)
}

// startAgentEnv runs ledger-mcp with env and args and connects to it over
// stdio at revision rev (the latest if "") with the client options o.
func startAgentEnv(t *testing.T, env []string, rev string, o *mcp.ClientOptions, args ...string) *gateway {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "ledger-mcp"), append([]string{"--log-format", "json"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	logs := &testkit.Buffer{}
	cmd.Stderr = logs
	return connectAgent(t, &keyTransport{&mcp.CommandTransport{Command: cmd}}, logs, rev, o)
}

// connectAgent is the e2e agent's MCP client session with ledger-mcp over
// tr, at revision rev (the latest if "") with the client options o,
// closed when t ends; logs are ledger-mcp's.
func connectAgent(t *testing.T, tr mcp.Transport, logs *testkit.Buffer, rev string, o *mcp.ClientOptions) *gateway {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "1"}, o)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := c.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: rev})
	require.NoError(t, err, "ledger-mcp logs:\n%s", logs.String())
	t.Cleanup(func() { _ = s.Close() })
	return &gateway{ClientSession: s, logs: logs}
}

// stop disconnects, which ends ledger-mcp.
func (g *gateway) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, g.Close(), "ledger-mcp logs:\n%s", g.logs.String())
}

// call makes a tools/call; meta may carry an explicit key, and
// paramsKey becomes params.idempotencyKey (see keyTransport).
func (g *gateway) call(t *testing.T, tool string, args map[string]any, meta mcp.Meta) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := g.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args, Meta: meta})
	require.NoError(t, err, "ledger-mcp logs:\n%s", g.logs.String())
	return res
}

// logAddr waits for a JSON log line with msg and returns its addr.
func (g *gateway) logAddr(t *testing.T, msg string) string {
	t.Helper()
	var addr string
	require.Eventually(t, func() bool {
		for _, line := range strings.Split(g.logs.String(), "\n") {
			var l struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg {
				addr = l.Addr
				return true
			}
		}
		return false
	}, 30*time.Second, 10*time.Millisecond, "no %q in\n%s", msg, g.logs.String())
	return addr
}

// paramsKeyMeta is a test-only _meta entry that keyTransport turns into
// params.idempotencyKey: the SDK's typed params have no such field.
const paramsKeyMeta = "test/params-idempotency-key"

// paramsKeyEscapedMeta is paramsKeyMeta with the member's name written
// with a JSON escape, "idempotency\u004bey", which names the same member.
const paramsKeyEscapedMeta = "test/params-idempotency-key-escaped"

// keyTransport writes tools/call requests with params.idempotencyKey,
// the form proposed for MCP itself, taken from paramsKeyMeta.
type keyTransport struct{ mcp.Transport }

func (t *keyTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return keyConn{c}, nil
}

type keyConn struct{ mcp.Connection }

func (c keyConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if req, ok := msg.(*jsonrpc.Request); ok && req.Method == "tools/call" {
		var p map[string]any
		if json.Unmarshal(req.Params, &p) == nil {
			meta, _ := p["_meta"].(map[string]any)
			switch {
			case meta[paramsKeyMeta] != nil:
				p["idempotencyKey"] = meta[paramsKeyMeta]
				delete(meta, paramsKeyMeta)
				b, err := json.Marshal(p)
				if err != nil {
					return err
				}
				req.Params = b
			case meta[paramsKeyEscapedMeta] != nil:
				p["idempotencyKey"] = meta[paramsKeyEscapedMeta]
				delete(meta, paramsKeyEscapedMeta)
				b, err := json.Marshal(p)
				if err != nil {
					return err
				}
				req.Params = bytes.Replace(b, []byte(`"idempotencyKey"`), []byte(`"idempotency\u004bey"`), 1)
			}
		}
	}
	return c.Connection.Write(ctx, msg)
}

// text is the first text content of a result.
func text(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	require.NotEmpty(t, res.Content)
	tc, ok := res.Content[0].(*mcp.TextContent)
	require.True(t, ok, "content %T", res.Content[0])
	return tc.Text
}

// status is the gateway's _meta status of a result ("" on a forwarded one).
func status(res *mcp.CallToolResult) string {
	s, _ := res.Meta["io.effect-ledger/status"].(string)
	return s
}

// metric reads one sample of a Prometheus text exposition.
func metric(t *testing.T, addr, sample string) string {
	t.Helper()
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer func() { _ = res.Body.Close() }()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			return v
		}
	}
	_, _ = io.Copy(io.Discard, res.Body)
	return ""
}
