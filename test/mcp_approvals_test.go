package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writePolicy writes a --policy file and returns its path.
func writePolicy(t *testing.T, policy string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "policy.json")
	require.NoError(t, os.WriteFile(f, []byte(policy), 0o600))
	return f
}

// approvalMeta is the _meta the gateway puts on an approval_required
// answer: the ask's seq, expiry and page.
func approvalMeta(t *testing.T, res *mcp.CallToolResult) (seq int64, url string) {
	t.Helper()
	require.True(t, res.IsError, text(t, res))
	require.Equal(t, "approval_required", status(res), text(t, res))
	m, ok := res.Meta["io.effect-ledger/approval"].(map[string]any)
	require.True(t, ok, "no approval in _meta: %v", res.Meta)
	s, ok := m["seq"].(float64)
	require.True(t, ok && s > 0, "%v", m)
	_, err := time.Parse(time.RFC3339Nano, m["expires_at"].(string))
	require.NoError(t, err)
	url, _ = m["url"].(string)
	return int64(s), url
}

// postAuthJSON posts body to url with an optional bearer token.
func postAuthJSON(t *testing.T, url, token, body string) (int, map[string]any) {
	t.Helper()
	return authJSON(t, http.MethodPost, url, token, strings.NewReader(body))
}

// getAuthJSON gets url with an optional bearer token.
func getAuthJSON(t *testing.T, url, token string) (int, map[string]any) {
	t.Helper()
	return authJSON(t, http.MethodGet, url, token, nil)
}

// authJSON makes a request with an optional bearer token and decodes its
// JSON answer.
func authJSON(t *testing.T, method, url, token string, body io.Reader) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = res.Body.Close() }()
	var out map[string]any
	_ = json.NewDecoder(res.Body).Decode(&out)
	return res.StatusCode, out
}

// TestLedgerMCP_approvalEmbedded: an embedded ledger with a --policy file
// whose gate members become the namespace's policy (SPEC §13): a call
// that needs approval answers approval_required with the ask's seq and
// the --admin-listen page; a person approves there and the model's next
// identical call runs once, the one after is a replay; a rejection is
// approval_rejected; a denied tool never reaches the upstream; an
// unchanged retry of a failed call is refused; the chain verifies.
func TestLedgerMCP_approvalEmbedded(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	policy := writePolicy(t, `{"rules": [
		{"tool": "charge", "approval": "required", "approvers": ["role:approver"], "expires_in_ms": 600000},
		{"tool": "create_entity", "deny": true},
		{"tool": "refund", "repeat_failure": "refuse"}]}`)
	args := append([]string{"--db", db, "--policy", policy, "--admin-listen", "127.0.0.1:0", "--wait", "0s"}, sh.command()...)
	g := startGateway(t, args...)
	admin := "http://" + g.logAddr(t, "admin API ready")
	token := strings.TrimSpace(readFile(t, db+".admin-token"))

	order := map[string]any{"order": "AP1", "amount": 12.5}
	first := g.call(t, "charge", order, nil)
	seq, url := approvalMeta(t, first)
	assert.Equal(t, fmt.Sprintf("%s/ui/#approvals/%d", admin, seq), url)
	assert.Contains(t, text(t, first), url)
	assert.Contains(t, text(t, first), "NOT run")
	again := g.call(t, "charge", order, nil)
	seq2, _ := approvalMeta(t, again)
	assert.Equal(t, seq, seq2, "the same call while the ask is pending names the same ask")
	assert.Zero(t, sh.runs("charge", "AP1"))

	// The approver sees the call's arguments, checked against the ask.
	code, view := getAuthJSON(t, fmt.Sprintf("%s/v1/approvals/%d", admin, seq), token)
	require.Equal(t, 200, code, view)
	assert.Equal(t, map[string]any{"order": "AP1", "amount": 12.5}, view["input"])
	assert.Equal(t, true, view["input_verified"])
	assert.Equal(t, "test-shop.charge", view["tool"])
	code, ans := postAuthJSON(t, fmt.Sprintf("%s/v1/approvals/%d", admin, seq), token, `{"decision":"approve","note":"ok"}`)
	require.Equal(t, 201, code, ans)

	ran := g.call(t, "charge", order, nil)
	require.False(t, ran.IsError, text(t, ran))
	assert.Equal(t, 1, sh.runs("charge", "AP1"))
	replay := g.call(t, "charge", order, nil)
	assert.Equal(t, true, replay.Meta["io.effect-ledger/replayed"])
	assert.Equal(t, 1, sh.runs("charge", "AP1"))

	t.Run("Rejected", func(t *testing.T) {
		other := map[string]any{"order": "AP2"}
		seq, _ := approvalMeta(t, g.call(t, "charge", other, nil))
		code, ans := postAuthJSON(t, fmt.Sprintf("%s/v1/approvals/%d", admin, seq), token, `{"decision":"reject","note":"not this one"}`)
		require.Equal(t, 201, code, ans)
		res := g.call(t, "charge", other, nil)
		assert.True(t, res.IsError)
		assert.Equal(t, "approval_rejected", status(res), text(t, res))
		assert.Contains(t, text(t, res), "not this one")
		assert.Zero(t, sh.runs("charge", "AP2"))
	})

	t.Run("Denied", func(t *testing.T) {
		for range 2 {
			res := g.call(t, "create_entity", map[string]any{"id": "D1"}, nil)
			assert.True(t, res.IsError)
			assert.Equal(t, "denied_by_policy", status(res), text(t, res))
		}
		assert.Zero(t, sh.runs("create_entity", "D1"), "the upstream never saw a denied call")
	})

	t.Run("UnchangedRetry", func(t *testing.T) {
		res := g.call(t, "refund", map[string]any{"order": "RF1"}, nil)
		assert.True(t, res.IsError)
		assert.Empty(t, status(res), "the tool's own error answer")
		res = g.call(t, "refund", map[string]any{"order": "RF1"}, nil)
		assert.Equal(t, "unchanged_retry", status(res), text(t, res))
		assert.Contains(t, text(t, res), "card declined")
		assert.Equal(t, 1, sh.runs("refund", "RF1"))
	})

	g.stop(t)
	out, errOut, code := ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, out+errOut)
	assert.Equal(t, 1, kinds(t, db)["policy"])

	// The same --policy again appends no second policy receipt.
	g = startGateway(t, args...)
	g.stop(t)
	assert.Equal(t, 1, kinds(t, db)["policy"])
}

// dbReceipts lists the receipts of an embedded ledger's file.
func dbReceipts(t *testing.T, db string) []map[string]any {
	t.Helper()
	out, errOut, code := ledgerctl(t, "receipts", "--db", db, "--json", "--limit", "1000")
	require.Equal(t, 0, code, out+errOut)
	var page struct {
		Receipts []map[string]any `json:"receipts"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &page), out)
	return page.Receipts
}

// kinds counts an embedded ledger's receipts by kind.
func kinds(t *testing.T, db string) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, r := range dbReceipts(t, db) {
		n[r["kind"].(string)]++
	}
	return n
}

// elicitAgent answers the gateway's approval elicitations with action,
// counting them and keeping the last message.
type elicitAgent struct {
	mu      sync.Mutex
	action  string
	asked   int
	message string
}

func (a *elicitAgent) set(action string) {
	a.mu.Lock()
	a.action = action
	a.mu.Unlock()
}

func (a *elicitAgent) seen() (int, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.asked, a.message
}

func (a *elicitAgent) handle(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked++
	a.message = r.Params.Message
	var content map[string]any
	if a.action == "accept" {
		content = map[string]any{"note": "fine by me"}
	}
	return &mcp.ElicitResult{Action: a.action, Content: content}, nil
}

// TestLedgerMCP_approvalByClient: a rule whose approvers list mcp-client,
// with self_approval allowed, has the agent's own client answer with a
// form elicitation (SPEC §13, MCP path) — elicitation/create for a client
// of 2025-11-25, an input_required round for one of 2026-07-28: accept
// runs the call once (a repeat is a replay, asked nothing), decline
// records a rejection (approval_rejected, the upstream never called),
// cancel records nothing (approval_required); a client without
// elicitation is told a person must approve. The ledger records the
// answers with actor "<asker>/mcp-client:<client name>", and the chain
// verifies. The default --wait does not hold the call before its client
// is asked.
func TestLedgerMCP_approvalByClient(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	policy := writePolicy(t, `{"rules": [{"tool": "charge", "effect": "external", "approval": "required", "approvers": ["mcp-client"]}],
		"self_approval": "allow"}`)
	args := append([]string{"--db", db, "--policy", policy}, sh.command()...)
	agent := &elicitAgent{action: "accept"}
	g := startGatewayRev(t, rev1125, clientOptions(agent.handle), args...)

	start := time.Now()
	res := g.call(t, "charge", map[string]any{"order": "C1"}, nil)
	require.False(t, res.IsError, text(t, res))
	assert.Less(t, time.Since(start), 20*time.Second, "the client is asked at once, not after --wait")
	asked, msg := agent.seen()
	assert.Equal(t, 1, asked)
	assert.Contains(t, msg, "test-shop.charge")
	assert.Contains(t, msg, `"order":"C1"`)
	assert.Equal(t, 1, sh.runs("charge", "C1"))
	replay := g.call(t, "charge", map[string]any{"order": "C1"}, nil)
	assert.Equal(t, true, replay.Meta["io.effect-ledger/replayed"])
	asked, _ = agent.seen()
	assert.Equal(t, 1, asked, "a replay asks nothing")

	agent.set("decline")
	res = g.call(t, "charge", map[string]any{"order": "C2"}, nil)
	assert.Equal(t, "approval_rejected", status(res), text(t, res))
	res = g.call(t, "charge", map[string]any{"order": "C2"}, nil)
	assert.Equal(t, "approval_rejected", status(res), text(t, res))
	assert.Zero(t, sh.runs("charge", "C2"))

	agent.set("cancel")
	res = g.call(t, "charge", map[string]any{"order": "C3"}, nil)
	approvalMeta(t, res)
	assert.Contains(t, text(t, res), "dismissed")
	assert.Zero(t, sh.runs("charge", "C3"))
	g.stop(t)

	t.Run("Client2026", func(t *testing.T) {
		agent := &elicitAgent{action: "accept"}
		g := startGatewayRev(t, rev2026, clientOptions(agent.handle), args...)
		res := g.call(t, "charge", map[string]any{"order": "C4"}, nil)
		require.False(t, res.IsError, text(t, res))
		asked, msg := agent.seen()
		assert.Equal(t, 1, asked)
		assert.Contains(t, msg, `"order":"C4"`)
		assert.Equal(t, 1, sh.runs("charge", "C4"))
		agent.set("decline")
		res = g.call(t, "charge", map[string]any{"order": "C5"}, nil)
		assert.Equal(t, "approval_rejected", status(res), text(t, res))
		assert.Zero(t, sh.runs("charge", "C5"))
		g.stop(t)
	})

	t.Run("NoElicitation", func(t *testing.T) {
		// No elicitation: a person must answer, which --wait would
		// wait for.
		g := startGatewayRev(t, rev1125, &mcp.ClientOptions{}, append([]string{"--wait", "0s"}, args...)...)
		res := g.call(t, "charge", map[string]any{"order": "C6"}, nil)
		approvalMeta(t, res)
		assert.Zero(t, sh.runs("charge", "C6"))
		g.stop(t)
	})

	out, errOut, code := ledgerctl(t, "verify", "--db", db)
	require.Equal(t, 0, code, out+errOut)
	outcomes := map[string]int{}
	for _, r := range dbReceipts(t, db) {
		if r["kind"] == "approval" {
			assert.Equal(t, "/mcp-client:e2e-agent", r["actor"], r)
			outcomes[r["outcome"].(string)]++
		}
	}
	assert.Equal(t, map[string]int{"approved": 2, "rejected": 2}, outcomes)
}

// TestLedgerMCP_approvalRemote: ledger-mcp --ledger in front of a ledgerd
// whose policy sends a tool to a person's approval (SPEC §13): the call
// answers approval_required with the ask's seq and the ledgerd's page; an
// approver's token approves over HTTP; the model's identical call runs
// once and the next is a replay; with --wait a person who answers while
// the call waits lets that call run; a denied tool never reaches the
// upstream; under a rule for mcp-client the agent's client approves,
// relayed with the gateway's token; a --policy file with gate members is
// refused with --ledger.
func TestLedgerMCP_approvalRemote(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	l := StartLedgerd(t, db)
	require.NoError(t, l.Stop())
	adminTok := createToken(t, db, "ops", "admin")
	gw := createToken(t, db, "gateway", "writer")
	alice := createToken(t, db, "alice", "approver")
	l = StartLedgerd(t, db)
	r := l.Do("PUT", "/v1/namespaces/default/policy", `{"rules": [
		{"tool": "test-shop.charge", "approval": "required", "approvers": ["role:approver"]},
		{"tool": "test-shop.create_entity", "deny": true}]}`, "Authorization", "Bearer "+adminTok)
	require.Equal(t, 200, r.Status, r.Raw)

	sh := newShop(t)
	env := []string{"LEDGER_TOKEN=" + gw}
	g := startGatewayEnv(t, env, append([]string{"--ledger", l.URL, "--wait", "0s"}, sh.command()...)...)

	order := map[string]any{"order": "B1"}
	first := g.call(t, "charge", order, nil)
	seq, url := approvalMeta(t, first)
	assert.Equal(t, fmt.Sprintf("%s/ui/#approvals/%d", l.URL, seq), url)
	code, view := getAuthJSON(t, fmt.Sprintf("%s/v1/approvals/%d", l.URL, seq), alice)
	require.Equal(t, 200, code, view)
	assert.Equal(t, "gateway", view["actor"], "the gateway's token asked")
	assert.Equal(t, map[string]any{"order": "B1"}, view["input"])
	assert.Equal(t, true, view["input_verified"])
	code, ans := postAuthJSON(t, fmt.Sprintf("%s/v1/approvals/%d", l.URL, seq), alice, `{"decision":"approve"}`)
	require.Equal(t, 201, code, ans)

	ran := g.call(t, "charge", order, nil)
	require.False(t, ran.IsError, text(t, ran))
	assert.Equal(t, 1, sh.runs("charge", "B1"))
	replay := g.call(t, "charge", order, nil)
	assert.Equal(t, true, replay.Meta["io.effect-ledger/replayed"])
	assert.Equal(t, 1, sh.runs("charge", "B1"))

	denied := g.call(t, "create_entity", map[string]any{"id": "BD1"}, nil)
	assert.Equal(t, "denied_by_policy", status(denied), text(t, denied))
	assert.Zero(t, sh.runs("create_entity", "BD1"))

	t.Run("AnsweredWhileWaiting", func(t *testing.T) {
		g := startGatewayEnv(t, env, append([]string{"--ledger", l.URL, "--wait", "30s"}, sh.command()...)...)
		done := make(chan *mcp.CallToolResult, 1)
		go func() {
			res, err := g.CallTool(context.Background(), &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"order": "B2"}})
			if err != nil {
				res = &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
			}
			done <- res
		}()
		var pending float64
		require.Eventually(t, func() bool {
			_, list := getAuthJSON(t, l.URL+"/v1/approvals?state=pending", alice)
			as, _ := list["approvals"].([]any)
			for _, a := range as {
				if m := a.(map[string]any); strings.HasPrefix(fmt.Sprint(m["input_hash"]), "hk1:") && m["tool"] == "test-shop.charge" {
					pending = m["seq"].(float64)
					return true
				}
			}
			return false
		}, 20*time.Second, 50*time.Millisecond)
		code, ans := postAuthJSON(t, fmt.Sprintf("%s/v1/approvals/%d", l.URL, int64(pending)), alice, `{"decision":"approve"}`)
		require.Equal(t, 201, code, ans)
		select {
		case res := <-done:
			require.False(t, res.IsError, text(t, res))
		case <-time.After(30 * time.Second):
			t.Fatal("the waiting call did not run after the approval")
		}
		assert.Equal(t, 1, sh.runs("charge", "B2"))
	})

	t.Run("SentToThePage", func(t *testing.T) {
		// A 2025-11-25 client that takes URL elicitations is sent to the
		// page (SPEC §13); the person approves there while the call waits,
		// and the call runs once.
		var opened atomic.Value
		o := &mcp.ClientOptions{
			Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
			ElicitationHandler: func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				if r.Params.Mode != "url" {
					return &mcp.ElicitResult{Action: "decline"}, nil
				}
				opened.Store(r.Params.URL)
				seq := r.Params.URL[strings.LastIndex(r.Params.URL, "/")+1:]
				go postAuthJSON(t, l.URL+"/v1/approvals/"+seq, alice, `{"decision":"approve","note":"seen on the page"}`)
				return &mcp.ElicitResult{Action: "accept"}, nil
			},
		}
		g := startAgentEnv(t, env, rev1125, o, append([]string{"--ledger", l.URL, "--wait", "20s"}, sh.command()...)...)
		res := g.call(t, "charge", map[string]any{"order": "B7"}, nil)
		require.False(t, res.IsError, "%s\n%s", text(t, res), g.logs.String())
		url, _ := opened.Load().(string)
		assert.Contains(t, url, l.URL+"/ui/#approvals/", "the client was sent to the approval page")
		assert.Equal(t, 1, sh.runs("charge", "B7"))
	})

	t.Run("ClientApproves", func(t *testing.T) {
		r := l.Do("PUT", "/v1/namespaces/default/policy", `{"rules": [
			{"tool": "test-shop.charge", "approval": "required", "approvers": ["mcp-client"]}], "self_approval": "allow"}`,
			"Authorization", "Bearer "+adminTok)
		require.Equal(t, 200, r.Status, r.Raw)
		agent := &elicitAgent{action: "accept"}
		g := startAgentEnv(t, env, rev1125, clientOptions(agent.handle), append([]string{"--ledger", l.URL}, sh.command()...)...)
		res := g.call(t, "charge", map[string]any{"order": "B4"}, nil)
		require.False(t, res.IsError, "%s\n%s", text(t, res), g.logs.String())
		asked, _ := agent.seen()
		assert.Equal(t, 1, asked)
		assert.Equal(t, 1, sh.runs("charge", "B4"))
		_, list := getAuthJSON(t, l.URL+"/v1/approvals?state=consumed", alice)
		var actors []any
		for _, a := range list["approvals"].([]any) {
			if ans, ok := a.(map[string]any)["answer"].(map[string]any); ok {
				actors = append(actors, ans["actor"])
			}
		}
		assert.Contains(t, actors, "gateway/mcp-client:e2e-agent", "relayed by the gateway's token: %v", list)

		// A person's rule: the gateway reads the policy (a writer may read
		// the gate it works behind), so the client is never asked.
		r = l.Do("PUT", "/v1/namespaces/default/policy", `{"rules": [
			{"tool": "test-shop.charge", "approval": "required", "approvers": ["role:approver"]}], "self_approval": "allow"}`,
			"Authorization", "Bearer "+adminTok)
		require.Equal(t, 200, r.Status, r.Raw)
		g = startAgentEnv(t, env, rev1125, clientOptions(agent.handle), append([]string{"--ledger", l.URL, "--wait", "0s"}, sh.command()...)...)
		res = g.call(t, "charge", map[string]any{"order": "B5"}, nil)
		approvalMeta(t, res)
		assert.Contains(t, text(t, res), "needs a person's approval")
		res = g.call(t, "charge", map[string]any{"order": "B6"}, nil)
		approvalMeta(t, res)
		asked, _ = agent.seen()
		assert.Equal(t, 1, asked, "the client is not asked for a person's rule")
		assert.Zero(t, sh.runs("charge", "B5")+sh.runs("charge", "B6"))
	})

	t.Run("GatePolicyRefused", func(t *testing.T) {
		policy := writePolicy(t, `[{"tool": "charge", "effect": "external", "approval": "required"}]`)
		cmd := exec.Command(filepath.Join(binDir, "ledger-mcp"), append([]string{"--ledger", l.URL, "--policy", policy}, sh.command()...)...)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		err := cmd.Run()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
		assert.Equal(t, 2, ee.ExitCode(), errb.String())
		assert.Contains(t, errb.String(), "ledgerctl policy set")
		// The same file without the gate's members is the classification only.
		plain := writePolicy(t, `[{"tool": "charge", "effect": "external"}]`)
		g := startGatewayEnv(t, env, append([]string{"--ledger", l.URL, "--policy", plain, "--wait", "0s"}, sh.command()...)...)
		seq, _ := approvalMeta(t, g.call(t, "charge", map[string]any{"order": "B3"}, nil))
		assert.NotZero(t, seq)
	})
}
