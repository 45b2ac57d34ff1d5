//lint:file-ignore SA1019 a client of the revisions before 2026-07-28 answers sampling and roots and gets log messages

package test

import (
	"context"
	"fmt"
	"github.com/effect-ledger/effect-ledger/testkit"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// s2cAgent is a client of an older revision that answers the upstream's
// server→client requests, counting them.
type s2cAgent struct {
	mu       sync.Mutex
	action   string // the answer to an elicitation
	elicits  int
	samples  int
	rootsAsk int
	logs     []string
}

func (a *s2cAgent) count(n *int) {
	a.mu.Lock()
	*n++
	a.mu.Unlock()
}

func (a *s2cAgent) counts() (elicits, samples, roots int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.elicits, a.samples, a.rootsAsk
}

func (a *s2cAgent) logged() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.logs...)
}

// client is the agent's MCP client: with elicitation, sampling and the
// root uri unless elicit is false (then only roots, the SDK's default).
func (a *s2cAgent) client(elicit bool, root string) *mcp.Client {
	o := &mcp.ClientOptions{
		LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
			a.mu.Lock()
			a.logs = append(a.logs, fmt.Sprint(r.Params.Data))
			a.mu.Unlock()
		},
	}
	if elicit {
		o.ElicitationHandler = func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			a.count(&a.elicits)
			return &mcp.ElicitResult{Action: a.action, Content: map[string]any{}}, nil
		}
		o.CreateMessageHandler = func(_ context.Context, r *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			a.count(&a.samples)
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m", Content: &mcp.TextContent{Text: "model of " + root}}, nil
		}
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "1"}, o)
	c.AddRoots(&mcp.Root{URI: root})
	return c
}

// gatewayOn is a ledger-mcp's ledger file and arguments in front of
// upstream; over "http" transport it is started, and url is its /mcp (on
// stdio a client starts its own with args).
func gatewayOn(t *testing.T, transport string, upstream []string) (db string, args []string, url string) {
	t.Helper()
	db = filepath.Join(t.TempDir(), "mcp.db")
	args = append([]string{"--db", db}, upstream...)
	if transport == "http" {
		url, _ = startHTTPGateway(t, args...)
	}
	return db, args, url
}

// s2cConnect connects c at revision rev: to url over Streamable HTTP, or
// to a ledger-mcp it starts over stdio with args.
func s2cConnect(t *testing.T, c *mcp.Client, rev, url string, args []string) *gateway {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logs := &testkit.Buffer{}
	var tr mcp.Transport = &mcp.StreamableClientTransport{Endpoint: url}
	if url == "" {
		cmd := exec.Command(filepath.Join(binDir, "ledger-mcp"), append([]string{"--log-format", "json"}, args...)...)
		cmd.Stderr = logs
		tr = &mcp.CommandTransport{Command: cmd}
	}
	s, err := c.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: rev})
	require.NoError(t, err, "ledger-mcp logs:\n%s", logs.String())
	t.Cleanup(func() { _ = s.Close() })
	require.Equal(t, rev, s.InitializeResult().ProtocolVersion)
	return &gateway{ClientSession: s, logs: logs}
}

// TestLedgerMCP_s2cForwarded: clients of 2025-11-25 and 2025-06-18, over
// stdio and Streamable HTTP, in front of an upstream of 2025-11-25 whose
// tools ask their client during the call (SPEC §11.1): elicitation,
// sampling and roots reach the client that made the call and its
// answers the upstream (the client's roots, never the gateway's); an
// accepted call runs once and is committed; a decline is the upstream's
// answer, recorded, and the same call runs later; a client without
// elicitation gets not_applied CLIENT_CAPABILITY_MISSING and a later
// identical call runs; a log message reaches the client; two HTTP
// sessions at once each see only their own requests.
func TestLedgerMCP_s2cForwarded(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	upstream := append(sh.command(), "--revision", rev1125)
	for _, rev := range []string{rev1125, rev0618} {
		for _, transport := range []string{"stdio", "http"} {
			t.Run(rev+"/"+transport, func(t *testing.T) {
				t.Parallel()
				db, args, url := gatewayOn(t, transport, upstream)
				id := func(s string) map[string]any { return map[string]any{"id": s + "-" + rev + "-" + transport} }
				name := func(s string) string { return s + "-" + rev + "-" + transport }

				yes := &s2cAgent{action: "accept"}
				g := s2cConnect(t, yes.client(true, "file:///yes/"+transport), rev, url, args)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				require.NoError(t, g.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}))

				res := g.call(t, "ask_elicit", id("E"), nil)
				assert.Equal(t, "elicited "+name("E")+", run 1", text(t, res))
				assert.Equal(t, 1, sh.runs("ask_elicit", name("E")))
				rs := toolReceipts(t, db, "test-shop.ask_elicit")
				require.NotEmpty(t, rs)
				assert.Equal(t, "succeeded", rs[len(rs)-1].Outcome)
				again := g.call(t, "ask_elicit", id("E"), nil)
				assert.Equal(t, 1, sh.runs("ask_elicit", name("E")), "a repeat is replayed: %s", text(t, again))

				res = g.call(t, "ask_sample", id("S"), nil)
				assert.Equal(t, "sampled "+name("S")+": model of file:///yes/"+transport+", run 1", text(t, res))
				res = g.call(t, "ask_roots", id("R"), nil)
				assert.Equal(t, "roots of "+name("R")+": [file:///yes/"+transport+"], run 1", text(t, res))
				e, s, _ := yes.counts()
				assert.Equal(t, 1, e)
				assert.Equal(t, 1, s)

				res = g.call(t, "log_then_charge", id("L"), nil)
				assert.False(t, res.IsError, text(t, res))
				assert.Eventually(t, func() bool {
					for _, l := range yes.logged() {
						if l == "charging "+name("L") {
							return true
						}
					}
					return false
				}, 5*time.Second, 10*time.Millisecond, "%v", yes.logged())

				// A decline: the upstream's answer (an error) is recorded,
				// nothing ran, and the same call runs once accepted.
				no := &s2cAgent{action: "decline"}
				var d *gateway
				if url == "" {
					g.stop(t)
					d = s2cConnect(t, no.client(true, "file:///no"), rev, url, args)
				} else {
					d = s2cConnect(t, no.client(true, "file:///no"), rev, url, nil)
				}
				res = d.call(t, "ask_elicit", id("D"), nil)
				assert.True(t, res.IsError)
				assert.Contains(t, text(t, res), "the user answered decline")
				assert.Equal(t, 0, sh.runs("ask_elicit", name("D")))
				rs = toolReceipts(t, db, "test-shop.ask_elicit")
				assert.Equal(t, "not_applied", rs[len(rs)-1].Outcome)
				assert.Equal(t, "TOOL_ERROR", rs[len(rs)-1].ErrorCode)

				// No elicitation: not applied, CLIENT_CAPABILITY_MISSING.
				bare := &s2cAgent{}
				var b *gateway
				if url == "" {
					d.stop(t)
					b = s2cConnect(t, bare.client(false, "file:///bare"), rev, url, args)
				} else {
					b = s2cConnect(t, bare.client(false, "file:///bare"), rev, url, nil)
				}
				res = b.call(t, "ask_elicit", id("M"), nil)
				assert.True(t, res.IsError)
				assert.Equal(t, "CLIENT_CAPABILITY_MISSING", status(res), text(t, res))
				rs = toolReceipts(t, db, "test-shop.ask_elicit")
				assert.Equal(t, "not_applied", rs[len(rs)-1].Outcome)
				assert.Equal(t, "CLIENT_CAPABILITY_MISSING", rs[len(rs)-1].ErrorCode)
				res = b.call(t, "ask_sample", id("MS"), nil)
				assert.Equal(t, "CLIENT_CAPABILITY_MISSING", status(res), text(t, res))
				assert.Equal(t, 0, sh.runs("ask_sample", name("MS")))

				last := &s2cAgent{action: "accept"}
				var y *gateway
				if url == "" {
					b.stop(t)
					y = s2cConnect(t, last.client(true, "file:///last"), rev, url, args)
				} else {
					y = s2cConnect(t, last.client(true, "file:///last"), rev, url, nil)
				}
				assert.Equal(t, "elicited "+name("D")+", run 1", text(t, y.call(t, "ask_elicit", id("D"), nil)))
				assert.Equal(t, "elicited "+name("M")+", run 1", text(t, y.call(t, "ask_elicit", id("M"), nil)))
			})
		}
	}

	t.Run("ConcurrentHTTPSessions", func(t *testing.T) {
		t.Parallel()
		url, _ := startHTTPGateway(t, append([]string{"--db", filepath.Join(t.TempDir(), "mcp.db")}, upstream...)...)
		agents := []*s2cAgent{{action: "accept"}, {action: "accept"}}
		var wg sync.WaitGroup
		for i, a := range agents {
			g := s2cConnect(t, a.client(true, fmt.Sprintf("file:///agent%d", i)), rev1125, url, nil)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 3 {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					res, err := g.CallTool(ctx, &mcp.CallToolParams{Name: "ask_roots",
						Arguments: map[string]any{"id": fmt.Sprintf("C%d-%d", i, j)}})
					if assert.NoError(t, err) {
						assert.Equal(t, fmt.Sprintf("roots of C%d-%d: [file:///agent%d], run 1", i, j, i), text(t, res))
					}
					res, err = g.CallTool(ctx, &mcp.CallToolParams{Name: "ask_sample",
						Arguments: map[string]any{"id": fmt.Sprintf("C%d-%d", i, j)}})
					if assert.NoError(t, err) {
						assert.Equal(t, fmt.Sprintf("sampled C%d-%d: model of file:///agent%d, run 1", i, j, i), text(t, res))
					}
				}
			}()
		}
		wg.Wait()
		for _, a := range agents {
			_, s, _ := a.counts()
			assert.Equal(t, 3, s)
		}
	})
}

// TestLedgerMCP_s2cCallsAtOnce: two calls at once in one session of an
// older revision each hold an upstream session of their own, so what the
// upstream asks during one is that call's alone. Call A waits upstream
// while call B is asking its client (an elicitation the client holds);
// then A asks for sampling, which this client cannot answer: A is
// not_applied CLIENT_CAPABILITY_MISSING (nothing had been answered on
// A), and B, accepted, runs once.
func TestLedgerMCP_s2cCallsAtOnce(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	upstream := append(sh.command(), "--revision", rev1125)
	for _, c := range []struct{ rev, transport string }{{rev1125, "stdio"}, {rev1125, "http"}, {rev0618, "stdio"}, {rev0618, "http"}} {
		rev, transport := c.rev, c.transport
		t.Run(rev+"/"+transport, func(t *testing.T) {
			t.Parallel()
			db, args, url := gatewayOn(t, transport, upstream)
			asked, release := make(chan struct{}, 1), make(chan struct{})
			c := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "1"}, &mcp.ClientOptions{
				ElicitationHandler: func(ctx context.Context, _ *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
					asked <- struct{}{}
					select {
					case <-release:
					case <-ctx.Done():
						return nil, ctx.Err()
					}
					return &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}, nil
				}})
			g := s2cConnect(t, c, rev, url, args)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			a, b := "A-"+rev+"-"+transport, "B-"+rev+"-"+transport
			callAsync := func(tool, id string) <-chan *mcp.CallToolResult {
				out := make(chan *mcp.CallToolResult, 1)
				go func() {
					res, err := g.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"id": id}})
					if err != nil {
						res = &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
					}
					out <- res
				}()
				return out
			}
			resA := callAsync("ask_sample_later", a)
			require.Eventually(t, func() bool { return len(toolReceipts(t, db, "test-shop.ask_sample_later")) > 0 },
				30*time.Second, 20*time.Millisecond, "A reserved")
			resB := callAsync("ask_elicit", b)
			<-asked // B is asking its client, and stays in flight
			require.NoError(t, os.WriteFile(filepath.Join(sh.dir, "release-"+a), nil, 0o600))
			gotA := <-resA
			assert.Equal(t, "CLIENT_CAPABILITY_MISSING", status(gotA), text(t, gotA))
			close(release)
			assert.Equal(t, "elicited "+b+", run 1", text(t, <-resB))

			rs := toolReceipts(t, db, "test-shop.ask_sample_later")
			assert.Equal(t, "not_applied", rs[len(rs)-1].Outcome)
			assert.Equal(t, "CLIENT_CAPABILITY_MISSING", rs[len(rs)-1].ErrorCode)
			assert.Equal(t, 0, sh.runs("ask_sample_later", a))
			assert.Equal(t, 1, sh.runs("ask_elicit", b))
		})
	}
}
