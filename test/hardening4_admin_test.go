package test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate"
	"github.com/effect-ledger/effect-ledger/testkit/pgtest"
)

// adminTokenBanner starts the line on stderr above the admin token that
// ledger-mcp shows once, when it made it.
const adminTokenBanner = "ledger-mcp: the admin token of "

// adminGateway is a ledger-mcp with --admin-listen on an embedded ledger,
// started with the same arguments again by restart.
type adminGateway struct {
	*gateway
	args      []string
	url       string // the admin listener's base URL
	tokenFile string
}

// startAdminGateway runs ledger-mcp on db with --admin-listen: a SQLite
// file keeps its admin token beside it, a PostgreSQL URL in a file named
// by --admin-token-file.
func startAdminGateway(t *testing.T, sh *shop, db string, extra ...string) *adminGateway {
	t.Helper()
	a := &adminGateway{tokenFile: db + ".admin-token"}
	a.args = append([]string{"--db", db, "--admin-listen", "127.0.0.1:0"}, extra...)
	if strings.HasPrefix(db, "postgres") {
		a.tokenFile = filepath.Join(t.TempDir(), "admin.token")
		a.args = append(a.args, "--admin-token-file", a.tokenFile)
	}
	a.args = append(a.args, sh.command()...)
	a.restart(t)
	return a
}

// restart starts the gateway again with the same arguments.
func (a *adminGateway) restart(t *testing.T) {
	t.Helper()
	a.gateway = startGateway(t, a.args...)
	a.url = "http://" + a.logAddr(t, "admin API ready")
}

// token reads the admin token from its file, checking the file's mode.
func (a *adminGateway) token(t *testing.T) string {
	t.Helper()
	st, err := os.Stat(a.tokenFile)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the admin token's file is the user's only")
	b, err := os.ReadFile(a.tokenFile)
	require.NoError(t, err)
	tok := strings.TrimSpace(string(b))
	require.True(t, strings.HasPrefix(tok, "elt_"), "%q", tok)
	return tok
}

// interrupt makes an interrupted call of the slow tool (not idempotent):
// its key, which waits for a person.
func (a *adminGateway) interrupt(t *testing.T, sh *shop, id string) string {
	t.Helper()
	lost := a.call(t, "slow", map[string]any{"id": id}, nil)
	require.Equal(t, "outcome_unknown", status(lost), text(t, lost))
	sh.release(id)
	var refused *mcp.CallToolResult
	require.Eventually(t, func() bool {
		refused = a.call(t, "slow", map[string]any{"id": id}, nil)
		return status(refused) == "unsafe_resume"
	}, 30*time.Second, 50*time.Millisecond)
	key, _ := refused.Meta[mcpgate.MetaKey].(string)
	require.NotEmpty(t, key)
	return key
}

// TestLedgerMCP_adminToken: ledger-mcp's --admin-listen is never open.
// On first start it makes an admin token of the embedded ledger, shows it
// once on stderr and keeps it in a 0600 file (beside a SQLite --db, or
// --admin-token-file); every route but the health probes and the page's
// files answers 401 without a token — the policy, approvals, resolve,
// reads, metrics — and ledgerctl --server without a token is refused;
// a writer token (the role of an agent's own token) gets 403 on the admin
// routes; the admin token sets the policy, approves and resolves. A
// restart keeps the token (read from the file, not shown again). On
// SQLite and PostgreSQL.
func TestLedgerMCP_adminToken(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		sh := newShop(t)
		policy := writePolicy(t, `{"rules": [{"tool": "charge", "approval": "required", "approvers": ["role:approver"]}]}`)
		g := startAdminGateway(t, sh, db, "--policy", policy, "--lease", "300ms", "--wait", "0s")
		admin := g.token(t)
		assert.Equal(t, 1, strings.Count(g.logs.String(), admin), "shown once on stderr:\n%s", g.logs.String())
		assert.Contains(t, g.logs.String(), adminTokenBanner+g.url)

		seq, _ := approvalMeta(t, g.call(t, "charge", map[string]any{"order": "A1"}, nil))
		key := g.interrupt(t, sh, "u1")
		writer := createToken(t, db, "agent-gw", "writer")

		policyURL := g.url + "/v1/namespaces/default/policy"
		approveURL := fmt.Sprintf("%s/v1/approvals/%d", g.url, seq)
		resolveURL := g.url + "/v1/effects/" + key + "/resolve"
		const resolveBody = `{"outcome":"not_applied","error":{"code":"CHECKED"},"note":"the shop's log shows no write"}`
		type req struct{ method, url, body string }
		writes := []req{
			{"PUT", policyURL, `{"rules":[]}`},
			{"POST", approveURL, `{"decision":"approve","note":"mine"}`},
			{"POST", resolveURL, resolveBody},
		}

		// No token: 401 everywhere but the probes and the page's files.
		for _, r := range append(writes,
			req{"GET", policyURL, ""}, req{"GET", g.url + "/v1/approvals", ""}, req{"GET", g.url + "/v1/effects/" + key, ""},
			req{"GET", g.url + "/v1/head", ""}, req{"GET", g.url + "/v1/receipts", ""}, req{"GET", g.url + "/v1/audit", ""},
			req{"GET", g.url + "/metrics", ""}) {
			code, body := authJSON(t, r.method, r.url, "", bodyOf(r.body))
			assert.Equal(t, 401, code, "%s %s: %v", r.method, r.url, body)
			assert.Equal(t, "unauthorized", errCode(body), "%s %s", r.method, r.url)
		}
		for _, open := range []string{"/healthz", "/readyz", "/ui/", "/ui/app.js"} {
			code, err := httpGet(g.url + open)
			require.NoError(t, err)
			assert.Equal(t, 200, code, open)
		}
		out, errOut, code := ledgerctl(t, "approvals", "approve", "--server", g.url, fmt.Sprint(seq), "--note", "no token")
		assert.NotEqual(t, 0, code, out+errOut)
		assert.Contains(t, errOut, "401", out+errOut)
		out, errOut, code = ledgerctl(t, "resolve", key, "--server", g.url, "--outcome", "succeeded", "--note", "no token")
		assert.NotEqual(t, 0, code, out+errOut)
		assert.Contains(t, errOut, "401", out+errOut)

		// A writer token (an agent's role): 403 on every admin route.
		for _, r := range writes {
			code, body := authJSON(t, r.method, r.url, writer, bodyOf(r.body))
			assert.Equal(t, 403, code, "%s %s: %v", r.method, r.url, body)
			assert.Equal(t, "forbidden", errCode(body), "%s %s: %v", r.method, r.url, body)
		}
		out, errOut, code = ledgerctlEnv(t, []string{"LEDGER_TOKEN=" + writer}, "approvals", "approve", "--server", g.url, fmt.Sprint(seq))
		assert.NotEqual(t, 0, code, out+errOut)
		assert.Contains(t, errOut, "403", out+errOut)

		// The admin token: approve, resolve, then set the policy.
		out, errOut, code = ledgerctlEnv(t, []string{"LEDGER_TOKEN=" + admin}, "approvals", "approve", "--server", g.url, fmt.Sprint(seq), "--note", "ok")
		require.Equal(t, 0, code, out+errOut)
		ran := g.call(t, "charge", map[string]any{"order": "A1"}, nil)
		require.False(t, ran.IsError, text(t, ran))
		assert.Equal(t, 1, sh.runs("charge", "A1"))
		code, body := authJSON(t, "POST", resolveURL, admin, bodyOf(resolveBody))
		require.Equal(t, 201, code, body)
		code, body = authJSON(t, "PUT", policyURL, admin, bodyOf(`{"rules":[]}`))
		require.Equal(t, 200, code, body)
		code, body = getAuthJSON(t, g.url+"/v1/effects/"+key, admin)
		require.Equal(t, 200, code, body)
		assert.Equal(t, "not_applied", body["state"])
		g.stop(t)

		// A restart reads the same token from its file and shows none.
		g.restart(t)
		assert.Equal(t, admin, g.token(t))
		assert.NotContains(t, g.logs.String(), adminTokenBanner)
		assert.NotContains(t, g.logs.String(), admin)
		code, body = getAuthJSON(t, g.url+"/v1/head", admin)
		assert.Equal(t, 200, code, body)
		code, body = getAuthJSON(t, g.url+"/v1/head", "")
		assert.Equal(t, 401, code, body)
		g.stop(t)
		verified(t, db)
	})
}

// bodyOf is a request body, nil for none.
func bodyOf(s string) io.Reader {
	if s == "" {
		return nil
	}
	return strings.NewReader(s)
}

// errCode is the contract's error code of an answer.
func errCode(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// runLedgerMCP runs ledger-mcp to its exit (one that fails at start) and
// returns its stderr and exit code.
func runLedgerMCP(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "ledger-mcp"), args...)
	out, errOut, code := runCmd(t, cmd)
	return out + errOut, code
}

// TestLedgerMCP_adminTokenFile: a token file ledger-mcp cannot trust or
// read stops it at start with a message that names the file and what to
// do; a PostgreSQL --db needs --admin-token-file.
func TestLedgerMCP_adminTokenFile(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "mcp.db")
	g := startAdminGateway(t, sh, db)
	admin := g.token(t)
	g.stop(t)
	writer := createToken(t, db, "agent-gw", "writer")

	file := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), mode))
		require.NoError(t, os.Chmod(p, mode))
		return p
	}
	for _, tc := range []struct {
		name string
		file string
		want []string
	}{
		{"OpenToOthers", file("open.token", admin+"\n", 0o644), []string{"other users may read or write it (mode 0644)", "chmod 600"}},
		{"NotAFile", t.TempDir(), []string{"not a regular file"}},
		{"Unreadable", filepath.Join(file("plain", "x", 0o600), "token"), []string{"cannot read it", "not a directory"}},
		{"NotAToken", file("bad.token", "elt_0123456789ab_00\n", 0o600), []string{"not a valid token of this ledger", "delete the file"}},
		{"Empty", file("empty.token", "\n", 0o600), []string{"does not hold one token"}},
		{"WriterToken", file("writer.token", writer+"\n", 0o600), []string{"has the role writer", "needs an admin token"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := runLedgerMCP(t, append([]string{"--db", db, "--admin-listen", "127.0.0.1:0", "--admin-token-file", tc.file}, sh.command()...)...)
			assert.Equal(t, 1, code, out)
			assert.Contains(t, out, "--admin-token-file", out)
			for _, w := range tc.want {
				assert.Contains(t, out, w)
			}
			assert.NotContains(t, out, "admin API ready", "nothing served")
		})
	}

	t.Run("PostgresNeedsFile", func(t *testing.T) {
		out, code := runLedgerMCP(t, append([]string{"--db", pgtest.URL(t), "--admin-listen", "127.0.0.1:0"}, sh.command()...)...)
		assert.Equal(t, 1, code, out)
		assert.Contains(t, out, "needs --admin-token-file FILE")
	})
	t.Run("FileWithoutListen", func(t *testing.T) {
		out, code := runLedgerMCP(t, append([]string{"--db", db, "--admin-token-file", filepath.Join(dir, "x")}, sh.command()...)...)
		assert.Equal(t, 2, code, out)
		assert.Contains(t, out, "--admin-token-file is the token of --admin-listen")
	})
	// The file it made still serves, and an admin token a person wrote
	// into a new file is taken as it is.
	own := file("own.token", createToken(t, db, "ops-alice", "admin")+"\n", 0o600)
	g = startAdminGateway(t, sh, db, "--admin-token-file", own)
	assert.NotContains(t, g.logs.String(), adminTokenBanner)
	code, body := getAuthJSON(t, g.url+"/v1/head", strings.TrimSpace(readFile(t, own)))
	assert.Equal(t, 200, code, body)
	g.stop(t)
}
