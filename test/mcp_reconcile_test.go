package test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// payShop is the test upstream with its payment tools (--payments): pay
// stores the idempotency key ledger-mcp sends in _meta, find_payment
// (read-only) looks a payment up by key or order.
type payShop struct{ *shop }

func newPayShop(t *testing.T) payShop { return payShop{newShop(t)} }

func (s payShop) command() []string { return append(s.shop.command(), "--payments") }

// touch makes the file name in the shop's directory; unlink removes it.
func (s payShop) touch(name, content string) {
	require.NoError(s.t, os.WriteFile(filepath.Join(s.dir, name), []byte(content), 0o600))
}

func (s payShop) unlink(name string) { require.NoError(s.t, os.Remove(filepath.Join(s.dir, name))) }

// payPolicy writes a --policy file whose rule for pay names the lookup
// find_payment with args, settling settle ms.
func payPolicy(t *testing.T, args string, settleMS int) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "policy.json")
	p := `[{"tool": "pay", "lookup": {"tool": "find_payment", "arguments": ` + args + `}, ` +
		`"reconcile": {"allow": true, "settle_ms": ` + strconv.Itoa(settleMS) + `}}]`
	require.NoError(t, os.WriteFile(file, []byte(p), 0o600))
	return file
}

// interrupt makes a pay of order whose outcome is unknown (the upstream
// dies before or after it stores the payment, crash = "before" or
// "after") and returns its key, once the lease has ended.
func interrupt(t *testing.T, g *gateway, sh payShop, order, crash string) string {
	t.Helper()
	sh.touch("crash-"+crash+"-"+order, "")
	res := g.call(t, "pay", map[string]any{"order": order}, nil)
	require.Equal(t, mcpgate.StatusOutcomeUnknown, status(res), text(t, res))
	key, _ := res.Meta[mcpgate.MetaKey].(string)
	require.NotEmpty(t, key)
	return key
}

// keyReceipt is the first receipt of kind of key in the ledger db.
func keyReceipt(t *testing.T, db, key, kind string) map[string]any {
	t.Helper()
	out, errOut, code := ledgerctl(t, "receipts", "--db", db, "--json")
	require.Equal(t, 0, code, errOut)
	var all struct{ Receipts []map[string]any }
	require.NoError(t, json.Unmarshal([]byte(out), &all))
	for _, r := range all.Receipts {
		if r["idempotency_key"] == key && r["kind"] == kind {
			return r
		}
	}
	t.Fatalf("no %s receipt of %s in\n%s", kind, key, out)
	return nil
}

// TestLedgerMCP_reconcile (SPEC §15, issue 48): a pay interrupted with no
// outcome is decided by its lookup, find_payment by the idempotency key
// ledger-mcp passed to the upstream in _meta: found → the recorded
// outcome is replayed, not run, with no person; not found → the call
// runs once, after settle_ms; an answer that is no evidence → the key
// waits for a person (unsafe_resume), and is reconciled on a later try.
func TestLedgerMCP_reconcile(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, reconcileByLookup)
}

func reconcileByLookup(t *testing.T, db string) {
	sh := newPayShop(t)
	policy := payPolicy(t, `{"key": "{{key}}"}`, 300)
	g := startGateway(t, append([]string{"--db", db, "--lease", "300ms", "--wait", "5s", "--policy", policy}, sh.command()...)...)

	t.Run("KeyGoesUpstream", func(t *testing.T) {
		res := g.call(t, "pay", map[string]any{"order": "M1"}, nil)
		require.False(t, res.IsError, text(t, res))
		key, err := mcpgate.DeriveKey(fileDerivationKey(t, db), "test-shop.pay", []byte(`{"order":"M1"}`), "")
		require.NoError(t, err)
		assert.Equal(t, key, res.StructuredContent.(map[string]any)["key"], "pay got the key in _meta")
	})

	t.Run("FoundIsReplayed", func(t *testing.T) {
		key := interrupt(t, g, sh, "F1", "after")
		res := g.call(t, "pay", map[string]any{"order": "F1"}, nil)
		require.False(t, res.IsError, text(t, res))
		assert.Equal(t, true, res.Meta["io.effect-ledger/replayed"], text(t, res))
		assert.Contains(t, text(t, res), "reconciled")
		assert.Contains(t, text(t, res), "NOT run again")
		assert.Contains(t, text(t, res), "pay_F1_1")
		texts := resultTexts(res)
		require.Len(t, texts, 2, "the notice, then the result recorded with the reconcile")
		assert.Contains(t, texts[1], `Reconciled, not run again: an earlier identical call was interrupted, and the tool server's read-only lookup "find_payment" found that it applied, external reference "pay_F1_1".`)
		assert.Equal(t, 1, sh.runs("pay", "F1"), "not run again")
		assert.Equal(t, 1, sh.runs("find_payment", key), "the lookup is asked once")
		rc := keyReceipt(t, db, key, "reconcile")
		assert.Equal(t, "succeeded", rc["outcome"])
		assert.Equal(t, "pay_F1_1", rc["external_ref"])
		assert.JSONEq(t, `{"lookup": "test-shop.find_payment", "answer": {"applied": true, "external_ref": "pay_F1_1"}}`, rc["note"].(string))
		again := g.call(t, "pay", map[string]any{"order": "F1"}, nil)
		assert.Equal(t, true, again.Meta["io.effect-ledger/replayed"], text(t, again))
		assert.Equal(t, 1, sh.runs("find_payment", key), "a final key needs no lookup")
	})

	t.Run("NotFoundRunsOnceAfterSettling", func(t *testing.T) {
		key := interrupt(t, g, sh, "N1", "before")
		start := time.Now()
		res := g.call(t, "pay", map[string]any{"order": "N1"}, nil)
		require.False(t, res.IsError, text(t, res))
		assert.Nil(t, res.Meta["io.effect-ledger/replayed"])
		assert.Equal(t, "pay_N1_2", res.StructuredContent.(map[string]any)["payment_id"], "ran once more")
		assert.Equal(t, 2, sh.runs("pay", "N1"))
		assert.Less(t, time.Since(start), 5*time.Second)
		assert.GreaterOrEqual(t, sh.runs("find_payment", key), 1)
		rc, rsv := keyReceipt(t, db, key, "reconcile"), keyReceipt(t, db, key, "reserve")
		assert.Equal(t, "not_applied", rc["outcome"])
		assert.Equal(t, "LOOKUP_NOT_FOUND", rc["error_code"])
		assert.GreaterOrEqual(t, rc["recorded_at"].(float64), rsv["lease_expires_at"].(float64)+300, "recorded settle_ms after the lease")
		again := g.call(t, "pay", map[string]any{"order": "N1"}, nil)
		assert.Equal(t, true, again.Meta["io.effect-ledger/replayed"], text(t, again))
		assert.Equal(t, 2, sh.runs("pay", "N1"))
	})

	t.Run("NoEvidenceLeavesUnsafeResume", func(t *testing.T) {
		sh.touch("lookup-answer", `{"status": "pending"}`)
		key := interrupt(t, g, sh, "U1", "after")
		res := g.call(t, "pay", map[string]any{"order": "U1"}, nil)
		assert.Equal(t, "unsafe_resume", status(res), text(t, res))
		assert.Equal(t, 1, sh.runs("find_payment", key))
		out, _, code := ledgerctl(t, "show", key, "--db", db, "--json")
		require.Equal(t, 0, code)
		assert.Contains(t, out, `"interrupted"`)
		assert.NotContains(t, out, `"reconcile"`)
		sh.unlink("lookup-answer")
		res = g.call(t, "pay", map[string]any{"order": "U1"}, nil)
		assert.Equal(t, true, res.Meta["io.effect-ledger/replayed"], "reconciled on the next try: %s", text(t, res))
		assert.Equal(t, 1, sh.runs("pay", "U1"))
	})
	g.stop(t)
	verified(t, db)
}

// TestLedgerMCP_reconcileNoEvidence: a lookup by other arguments than
// the key that finds nothing is no evidence that nothing applied, nor is
// a lookup that does not answer within --upstream-timeout: the key waits
// for a person. A lookup by order that finds the payment reconciles it.
func TestLedgerMCP_reconcileNoEvidence(t *testing.T) {
	t.Parallel()
	sh := newPayShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	policy := payPolicy(t, `{"order": "{{arguments.order}}"}`, 0)
	g := startGateway(t, append([]string{"--db", db, "--lease", "300ms", "--wait", "5s", "--upstream-timeout", "1s",
		"--policy", policy}, sh.command()...)...)
	interrupt(t, g, sh, "O1", "before")
	res := g.call(t, "pay", map[string]any{"order": "O1"}, nil)
	assert.Equal(t, "unsafe_resume", status(res), text(t, res))
	assert.Equal(t, 1, sh.runs("find_payment", "O1"), "asked by order")
	assert.Equal(t, 1, sh.runs("pay", "O1"))

	interrupt(t, g, sh, "O2", "after")
	sh.touch("lookup-hold", "")
	res = g.call(t, "pay", map[string]any{"order": "O2"}, nil)
	assert.Equal(t, "unsafe_resume", status(res), "the lookup timed out: %s", text(t, res))
	sh.unlink("lookup-hold")
	res = g.call(t, "pay", map[string]any{"order": "O2"}, nil)
	assert.Equal(t, true, res.Meta["io.effect-ledger/replayed"], text(t, res))
	assert.Equal(t, 1, sh.runs("pay", "O2"))
	assert.Equal(t, 2, sh.runs("find_payment", "O2"), "asked again on the next try")
	g.stop(t)
	verified(t, db)
}

// TestLedgerMCP_reconcileTooEarly: a lookup that finds nothing before
// the interrupted call's lease plus settle_ms has passed records nothing
// (the call may still land); the model is told when to call again, and
// the call then runs once.
func TestLedgerMCP_reconcileTooEarly(t *testing.T) {
	t.Parallel()
	sh := newPayShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	policy := payPolicy(t, `{"key": "{{key}}"}`, 1500)
	g := startGateway(t, append([]string{"--db", db, "--lease", "300ms", "--wait", "100ms", "--policy", policy}, sh.command()...)...)
	interrupt(t, g, sh, "T1", "before")
	res := pollStatus(t, g, "pay", map[string]any{"order": "T1"}, "in_progress")
	require.Equal(t, "reconcile_too_early", status(res), text(t, res))
	assert.Contains(t, text(t, res), "Call it again after")
	assert.Equal(t, 1, sh.runs("pay", "T1"))
	res = pollStatus(t, g, "pay", map[string]any{"order": "T1"}, "reconcile_too_early")
	require.False(t, res.IsError, text(t, res))
	assert.Equal(t, 2, sh.runs("pay", "T1"), "runs once, after settling")
	g.stop(t)
	verified(t, db)
}

// TestLedgerMCP_reconcileKilled: ledger-mcp killed (kill -9) while its
// lookup is asked leaves the key interrupted, with nothing recorded; the
// next try, by a new ledger-mcp, asks again and reconciles it.
func TestLedgerMCP_reconcileKilled(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, reconcileKilled)
}

func reconcileKilled(t *testing.T, db string) {
	sh := newPayShop(t)
	policy := payPolicy(t, `{"key": "{{key}}"}`, 0)
	args := append([]string{"--db", db, "--lease", "300ms", "--wait", "5s", "--policy", policy}, sh.command()...)
	first, cmd := startGatewayCmd(t, args...)
	key := interrupt(t, first, sh, "K1", "after")
	sh.touch("lookup-hold", "")
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = first.CallTool(ctx, &mcp.CallToolParams{Name: "pay", Arguments: map[string]any{"order": "K1"}})
	}()
	require.Eventually(t, func() bool { return sh.runs("find_payment", key) == 1 }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_, _ = cmd.Process.Wait()
	sh.unlink("lookup-hold")
	out, _, code := ledgerctl(t, "show", key, "--db", db, "--json")
	require.Equal(t, 0, code)
	assert.Contains(t, out, `"interrupted"`)
	assert.NotContains(t, out, `"reconcile"`)

	second := startGateway(t, args...)
	res := second.call(t, "pay", map[string]any{"order": "K1"}, nil)
	require.False(t, res.IsError, text(t, res))
	assert.Equal(t, true, res.Meta["io.effect-ledger/replayed"], text(t, res))
	assert.Equal(t, 1, sh.runs("pay", "K1"))
	assert.Equal(t, 2, sh.runs("find_payment", key))
	second.stop(t)
	verified(t, db)
}

// TestLedgerMCP_lookupReadOnly: ledger-mcp refuses at start a lookup the
// upstream does not annotate readOnlyHint: true, in front of the reference
// everything server (pinned by test/mcp-node/package-lock.json), whose
// toggle-simulated-logging says readOnlyHint: false; its read-only
// get-structured-content is accepted.
func TestLedgerMCP_lookupReadOnly(t *testing.T) {
	t.Parallel()
	node, dir := nodeInstall(t)
	everything := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a gateway that does not refuse is killed
	t.Cleanup(cancel)
	start := func(lookup string) (*exec.Cmd, *testkit.Buffer) {
		file := filepath.Join(t.TempDir(), "policy.json")
		require.NoError(t, os.WriteFile(file, []byte(`[{"tool": "toggle-subscriber-updates", "lookup": {"tool": "`+lookup+
			`", "arguments": {"ref": "{{key}}"}}}]`), 0o600))
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "ledger-mcp"), "--log-format", "json", "--listen", "127.0.0.1:0",
			"--db", filepath.Join(t.TempDir(), "mcp.db"), "--policy", file, "--", node, everything, "stdio")
		logs := &testkit.Buffer{}
		cmd.Stderr = logs
		require.NoError(t, cmd.Start())
		return cmd, logs
	}

	cmd, logs := start("toggle-simulated-logging")
	err := cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, logs.String())
	assert.Equal(t, 1, ee.ExitCode())
	assert.Contains(t, logs.String(), `the lookup tool \"toggle-simulated-logging\" is not annotated readOnlyHint: true`)

	cmd, logs = start("get-structured-content")
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	(&gateway{logs: logs}).logAddr(t, "ledger-mcp ready")
}

// TestLedgerMCP_reconcileRemote: with --ledger the reconcile goes through
// the Go client as the gateway's token, the actor of its reserve; the
// ledgerd's policy decides whether it may: without a rule that allows it
// the lookup's finding is refused (reconcile_not_allowed) and the key
// waits for a person, with one the next try reconciles it.
func TestLedgerMCP_reconcileRemote(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	l := StartLedgerd(t, db)
	require.NoError(t, l.Stop())
	adminTok := createToken(t, db, "ops", "admin")
	gw := createToken(t, db, "gateway", "writer")
	l = StartLedgerd(t, db)

	sh := newPayShop(t)
	file := filepath.Join(t.TempDir(), "policy.json")
	require.NoError(t, os.WriteFile(file, []byte(`[{"tool": "pay", "lookup": {"tool": "find_payment", "arguments": {"key": "{{key}}"}}}]`), 0o600))
	g := startGatewayEnv(t, []string{"LEDGER_TOKEN=" + gw},
		append([]string{"--ledger", l.URL, "--lease", "300ms", "--wait", "5s", "--policy", file}, sh.command()...)...)
	key := interrupt(t, g, sh, "R1", "after")
	res := g.call(t, "pay", map[string]any{"order": "R1"}, nil)
	assert.Equal(t, "unsafe_resume", status(res), "no rule allows the reconcile: %s", text(t, res))
	assert.Equal(t, 1, sh.runs("find_payment", key))

	r := l.Do("PUT", "/v1/namespaces/default/policy", `{"rules": [{"tool": "test-shop.pay", "reconcile": {"allow": true}}]}`,
		"Authorization", "Bearer "+adminTok)
	require.Equal(t, 200, r.Status, r.Raw)
	res = g.call(t, "pay", map[string]any{"order": "R1"}, nil)
	require.False(t, res.IsError, text(t, res))
	assert.Equal(t, true, res.Meta["io.effect-ledger/replayed"], text(t, res))
	assert.Equal(t, 1, sh.runs("pay", "R1"))
	out, _, code := ledgerctlEnv(t, []string{"LEDGER_TOKEN=" + adminTok}, "audit", "--server", l.URL, "--json")
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, `"reconciliations"`)
	assert.Contains(t, out, `"gateway"`, "the gateway's token reconciled")
	g.stop(t)
	require.NoError(t, l.Stop())
	verified(t, db)
}
