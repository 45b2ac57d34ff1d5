package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/storage"
)

// fourNamespaces fills namespaces a, b, c and d of the ledger db with
// three reserved keys each, through a ledgerd that is stopped again.
func fourNamespaces(t *testing.T, db string) {
	t.Helper()
	l := StartLedgerd(t, db)
	for _, ns := range []string{"a", "b", "c", "d"} {
		require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"`+ns+`"}`).Status)
		for i := 1; i <= 3; i++ {
			r := l.Do("POST", "/v1/ns/"+ns+"/effects/reserve", nsReserve(fmt.Sprintf("key-%s-%04d", ns, i), "exec-"+ns, "tool."+ns))
			require.Equal(t, 201, r.Status, r.Raw)
		}
	}
	require.NoError(t, l.Stop())
}

// TestLedgerctl_verifyAllNamespacesReportsEach: of four namespaces, a
// cannot be read (a value the verifier cannot scan on SQLite; a read that
// fails on PostgreSQL), b is intact, c is tampered (a forged
// external_ref) and d cannot be read either. verify --all-namespaces
// reports every one of them, as text and as JSON, and exits with the
// worst status (2), naming the namespaces it could not verify on stderr.
func TestLedgerctl_verifyAllNamespacesReportsEach(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		fourNamespaces(t, db)
		src := db
		if storage.IsPostgres(db) {
			src = unreadableNamespacesPG(t, db, "a", "d")
		} else {
			// (a seq edited into text is a violation, not an unreadable
			// namespace: TestLedgerctl_textSeqReported)
			editLedger(t, db, `DROP TRIGGER ns_receipts_no_update`, `DROP TRIGGER ns_settings_fixed`,
				`UPDATE ns_settings SET key_ttl_ms = 'x' WHERE ns = (SELECT id FROM namespaces WHERE name = 'a')`,
				`UPDATE ns_receipts SET external_ref = 'forged' WHERE ns = (SELECT id FROM namespaces WHERE name = 'c') AND seq = 1`,
				`UPDATE ns_head SET seq = 'x' WHERE ns = (SELECT id FROM namespaces WHERE name = 'd')`)
		}

		out, stderr, code := ledgerctl(t, "verify", "--db", src, "--all-namespaces")
		assert.Equal(t, 2, code, out+stderr)
		for _, want := range []string{
			"== namespace a ==\nERROR: could not be verified: ",
			"== namespace b ==\nOK: 3 receipts",
			"== namespace c ==\nFAILED: ",
			"== namespace d ==\nERROR: could not be verified: ",
			"== namespace default ==\nOK: 0 receipts",
			"5 namespaces verified, 1 with violations, 2 could not be verified\n",
		} {
			assert.Contains(t, out, want)
		}
		assert.Contains(t, out, "hash_mismatch")
		assert.Contains(t, stderr, "namespace a: ")
		assert.Contains(t, stderr, "namespace d: ")
		assert.NotContains(t, stderr, "namespace b")

		out, _, code = ledgerctl(t, "verify", "--db", src, "--all-namespaces", "--json")
		assert.Equal(t, 2, code, out)
		var all struct {
			OK         bool `json:"ok"`
			Namespaces map[string]struct {
				OK              bool   `json:"ok"`
				Error           string `json:"error"`
				ViolationsTotal int    `json:"violations_total"`
			} `json:"namespaces"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &all), out)
		assert.False(t, all.OK)
		require.Len(t, all.Namespaces, 5, out)
		for _, ns := range []string{"a", "d"} {
			assert.False(t, all.Namespaces[ns].OK, ns)
			assert.NotEmpty(t, all.Namespaces[ns].Error, ns)
		}
		assert.True(t, all.Namespaces["b"].OK)
		assert.Empty(t, all.Namespaces["b"].Error)
		assert.False(t, all.Namespaces["c"].OK)
		assert.Positive(t, all.Namespaces["c"].ViolationsTotal)
		assert.True(t, all.Namespaces["default"].OK)

		// The tampered namespace alone: exit 1.
		out, _, code = ledgerctl(t, "verify", "--db", src, "--namespace", "c")
		assert.Equal(t, 1, code, out)
	})
}

// unreadableNamespacesPG tampers namespace c of the PostgreSQL ledger db
// (a forged external_ref) and returns the URL of a role that cannot read
// the receipts of namespaces bad: a row-level policy divides by zero on
// their rows (sequential scans off, so that another namespace's scan
// never meets them).
func unreadableNamespacesPG(t *testing.T, db string, bad ...string) string {
	t.Helper()
	ctx := context.Background()
	u, err := url.Parse(db)
	require.NoError(t, err)
	role := "auditor_" + strings.TrimPrefix(u.Path, "/")
	conn, err := pgx.Connect(ctx, db)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, db)
		if err != nil {
			return
		}
		defer func() { _ = c.Close(ctx) }()
		_, _ = c.Exec(ctx, "DROP OWNED BY "+role)
		_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+role)
	})
	for _, q := range []string{
		`ALTER TABLE receipts DISABLE TRIGGER USER`,
		`UPDATE receipts SET external_ref = 'forged' WHERE namespace = 'c' AND seq = 1`,
		`ALTER TABLE receipts ENABLE TRIGGER USER`,
		"CREATE ROLE " + role + " LOGIN",
		"GRANT SELECT ON ALL TABLES IN SCHEMA public TO " + role,
		"ALTER ROLE " + role + " IN DATABASE " + strings.TrimPrefix(u.Path, "/") + " SET enable_seqscan = off",
		`ALTER TABLE receipts ENABLE ROW LEVEL SECURITY`,
		`CREATE POLICY unreadable ON receipts FOR SELECT USING (CASE WHEN namespace IN ('` + strings.Join(bad, "', '") +
			`') THEN 1 / (seq - seq) ELSE 1 END >= 0)`,
	} {
		_, err := conn.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	u.User = url.User(role)
	return u.String()
}

// TestLedgerctl_namespaceShortFlag: every command that takes a namespace
// by flag takes -n as it takes --namespace (verify and audit refused it),
// from the file and from the server, and lists both on one line of its
// help; verify --all-namespaces refuses -n as it refuses --namespace.
func TestLedgerctl_namespaceShortFlag(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	l := StartLedgerd(t, db)
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"pay"}`).Status)
	r := l.Do("POST", "/v1/ns/pay/effects/reserve", nsReserve("short-flag-0001", "exec-1", "tool.pay"))
	require.Equal(t, 201, r.Status, r.Raw)
	r = l.Do("POST", "/v1/ns/pay/effects/short-flag-0001/commit", `{"reservation":"`+r.Body["reservation"].(string)+`","outcome":"succeeded"}`)
	require.Equal(t, 201, r.Status, r.Raw) // no lease to end between two runs

	for _, src := range [][]string{{"--db", db}, {"--server", l.URL}} {
		for _, tc := range []struct {
			cmd  []string
			want string // in what -n pay prints
		}{
			{[]string{"verify", "--json"}, `"receipts":2,`}, {[]string{"audit", "--json"}, `"runtime_retries":[]`},
			{[]string{"receipts", "--json"}, "short-flag-0001"}, {[]string{"show", "short-flag-0001", "--json"}, "short-flag-0001"},
			{[]string{"head"}, "2:"}, {[]string{"export"}, "short-flag-0001"},
		} {
			args := append(slices.Clone(tc.cmd), src...)
			long, lerr, lcode := ledgerctl(t, append(args, "--namespace", "pay")...)
			short, serr, scode := ledgerctl(t, append(args, "-n", "pay")...)
			require.Equal(t, 0, lcode, "%q --namespace pay: %s", args, lerr)
			require.Equal(t, 0, scode, "%q -n pay: %s", args, serr)
			assert.Contains(t, short, tc.want, "%q", args)
			if tc.cmd[0] != "verify" { // verify reports how long it took
				assert.Equal(t, long, short, "%q", args)
			}
			_, serr, scode = ledgerctl(t, append(args, "-n", "nope")...)
			assert.Equal(t, 2, scode, "%q -n nope", args)
			assert.Contains(t, serr, "nope", "%q", args)
		}
	}
	out, _, code := ledgerctl(t, "verify", "--db", db, "-n", "pay")
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "OK: 2 receipts,")
	out, _, code = ledgerctl(t, "approvals", "list", "--server", l.URL, "-n", "pay", "--json")
	assert.Equal(t, 0, code, out)
	_, stderr, code := ledgerctl(t, "verify", "--db", db, "--all-namespaces", "-n", "pay")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "leave out --namespace")

	for _, cmd := range [][]string{
		{"verify"}, {"audit"}, {"receipts"}, {"show"}, {"head"}, {"export"}, {"checkpoint"}, {"prove"}, {"resolve"},
		{"check-proof"}, {"rebuild-index"}, {"token", "create"},
		{"approvals", "list"}, {"approvals", "show"}, {"approvals", "approve"}, {"approvals", "reject"},
	} {
		_, help, code := ledgerctl(t, append(cmd, "--help")...)
		assert.Equal(t, 0, code, "%q", cmd)
		assert.Regexp(t, `(?m)^  --namespace \S+, -n \S+$`, help, "%q lists -n with --namespace", cmd)
		assert.NotRegexp(t, `(?m)^  -n`, help, "%q lists -n once", cmd)
	}
}

// TestLedgerctl_helpTellsTheLayoutAndRoles: the namespace, backup and
// rebuild-index help describe namespaces as they are stored now (in the
// ledger file's shared tables, never <db>.ns/ns-NAME.db), and the token
// help names the approver role.
func TestLedgerctl_helpTellsTheLayoutAndRoles(t *testing.T) {
	t.Parallel()
	for _, cmd := range [][]string{
		{"namespace"}, {"namespace", "create"}, {"namespace", "list"}, {"namespace", "forget"}, {"backup"}, {"rebuild-index"},
	} {
		_, help, code := ledgerctl(t, append(cmd, "--help")...)
		assert.Equal(t, 0, code, "%q", cmd)
		assert.NotContains(t, help, ".ns/", "%q", cmd)
		assert.NotContains(t, help, "ns-NAME", "%q", cmd)
	}
	_, help, _ := ledgerctl(t, "namespace", "--help")
	assert.Contains(t, help, "shared tables")
	for _, cmd := range [][]string{{"token"}, {"token", "create"}} {
		_, help, code := ledgerctl(t, append(cmd, "--help")...)
		assert.Equal(t, 0, code, "%q", cmd)
		assert.Regexp(t, `approver\s+\(every GET, and answering`, help, "%q says what an approver may do", cmd)
	}
	out, _, _ := ledgerctl(t, "--help")
	assert.Contains(t, out, "approver")
	assert.NotContains(t, out, "namespace files")
}

// auditRepeats runs ledgerctl audit --json with args and returns its
// repeated failures.
func auditRepeats(t *testing.T, args ...string) []repeatedFailure {
	t.Helper()
	out, stderr, code := ledgerctl(t, append([]string{"audit", "--json"}, args...)...)
	require.Equal(t, 0, code, stderr)
	var a struct {
		RepeatedFailures []repeatedFailure `json:"repeated_failures"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &a), out)
	return a.RepeatedFailures
}

// TestLedgerctl_repeatedFailureListsAKeyOnce: a call that applied nothing
// twice (not_applied, SPEC §4.1), then succeeded once fixed, all under one
// key by three executions, is one repeated failure (§4.1: a rerun of the
// same key by another execution is a repeat, whatever its outcome) whose
// keys name that key once, with every run in executions and seqs — from
// the file (the database's grouping) and from the server (the chain
// pass), as JSON and as the table; verify --json's audit agrees.
func TestLedgerctl_repeatedFailureListsAKeyOnce(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		l := StartLedgerd(t, db)
		const key = "observe-alice-0001"
		body := func(exec string) string {
			return `{"idempotency_key":"` + key + `","execution_id":"` + exec + `","tool":"memory.observe","effect":"write","input":{"id":"alice"}}`
		}
		for i, outcome := range []string{"not_applied", "not_applied", "succeeded"} {
			tok := l.Reserve(t, body(fmt.Sprintf("exec-%d", i+1)))
			c := `{"reservation":"` + tok + `","outcome":"succeeded"}`
			if outcome == "not_applied" {
				c = `{"reservation":"` + tok + `","outcome":"not_applied","error":{"code":"NOT_FOUND"}}`
			}
			require.Equal(t, 201, l.Do("POST", "/v1/effects/"+key+"/commit", c).Status)
		}
		for _, src := range [][]string{{"--db", db}, {"--server", l.URL}} {
			got := auditRepeats(t, src...)
			require.Len(t, got, 1, "%v", src)
			assert.Equal(t, []string{key}, got[0].Keys, "%v: the key once", src)
			assert.Equal(t, []string{"exec-1", "exec-2", "exec-3"}, got[0].Executions, "%v: every run", src)
			assert.Equal(t, []uint64{2, 3, 5}, got[0].Seqs, "%v: the failure, then each rerun's reserve", src)
			assert.Equal(t, "NOT_FOUND", got[0].ErrorCode)

			out, _, code := ledgerctl(t, append([]string{"audit"}, src...)...)
			require.Equal(t, 0, code)
			sec := out[strings.Index(out, "Repeated failures"):]
			sec = sec[:strings.Index(sec, "\n\n")]
			assert.Equal(t, 1, strings.Count(sec, key), "%v: %s", src, sec)
			assert.Contains(t, sec, "(the same key again)")
			assert.Contains(t, sec, "exec-1, exec-2, exec-3")

			out, _, code = ledgerctl(t, append([]string{"verify", "--json"}, src...)...)
			require.Equal(t, 0, code, out)
			var v struct {
				Audit struct {
					RepeatedFailures []repeatedFailure `json:"repeated_failures"`
				} `json:"audit"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &v))
			assert.Equal(t, got, v.Audit.RepeatedFailures, "%v", src)
		}
	})
}

// TestLedgerMCP_failedThenFixedAuditedOnce: the probe's case through
// ledger-mcp — a tool that answers an error twice (recorded not_applied),
// then succeeds once its cause is fixed — is one repeated failure naming
// the call's key once, with its three runs.
func TestLedgerMCP_failedThenFixedAuditedOnce(t *testing.T) {
	t.Parallel()
	sh := newShop(t)
	db := filepath.Join(t.TempDir(), "mcp.db")
	g := startGateway(t, append([]string{"--db", db}, sh.command()...)...)
	for range 2 {
		require.True(t, g.call(t, "observe", map[string]any{"id": "alice"}, nil).IsError)
	}
	require.False(t, g.call(t, "create_entity", map[string]any{"id": "alice"}, nil).IsError)
	require.False(t, g.call(t, "observe", map[string]any{"id": "alice"}, nil).IsError)
	g.stop(t)
	got := auditRepeats(t, "--db", db)
	require.Len(t, got, 1)
	assert.Len(t, got[0].Keys, 1, "one call, one key: %v", got[0])
	assert.Len(t, got[0].Executions, 3, "%v", got[0])
	assert.Len(t, got[0].Seqs, 3, "%v", got[0])
}

// gatedLedgerd starts ledgerd on db with a policy that sends every
// payments.* call in namespace default to a person.
func gatedLedgerd(t *testing.T, db string) *Ledgerd {
	t.Helper()
	l := StartLedgerd(t, db)
	policy := filepath.Join(t.TempDir(), "policy.json")
	require.NoError(t, os.WriteFile(policy, []byte(`{"rules":[{"tool":"payments.*","approval":"required","expires_in_ms":600000}]}`), 0o600))
	_, stderr, code := ledgerctl(t, "policy", "set", "--server", l.URL, "default", policy)
	require.Equal(t, 0, code, stderr)
	return l
}

// TestGoClient_approvalRequiredNamesThePage: a call the policy sends to
// a person gives the Go client's ApprovalRequiredError the ask's seq, its
// expiry and the page where a person answers it (<base>/ui/#approvals/SEQ,
// as ledger-mcp names it), as fields and in its message.
func TestGoClient_approvalRequiredNamesThePage(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		l := gatedLedgerd(t, db)
		c, err := client.New(l.URL)
		require.NoError(t, err)
		_, err = c.Reserve(context.Background(), client.ReserveRequest{Key: "charge-order-0001", ExecutionID: "exec-1",
			Tool: "payments.charge", Class: client.ClassExternal, Input: json.RawMessage(`{"amount":1200}`)})
		var are *client.ApprovalRequiredError
		require.ErrorAs(t, err, &are)
		require.NotZero(t, are.Seq)
		assert.False(t, are.ExpiresAt.IsZero())
		page := fmt.Sprintf("%s/ui/#approvals/%d", l.URL, are.Seq)
		assert.Equal(t, page, are.URL)
		for _, want := range []string{fmt.Sprintf("ask %d", are.Seq), "expires " + are.ExpiresAt.UTC().Format(time.RFC3339), page} {
			assert.Contains(t, err.Error(), want)
		}
		r := l.Do("GET", fmt.Sprintf("/v1/approvals/%d", are.Seq), "")
		assert.Equal(t, 200, r.Status, "the seq names the ask: %s", r.Raw)

		// The command the message names answers the ask; the call then runs.
		answer := fmt.Sprintf("ledgerctl approvals approve %d --server %s", are.Seq, l.URL)
		require.Contains(t, err.Error(), "(or: "+answer+")")
		_, stderr, code := ledgerctl(t, strings.Fields(answer)[1:]...)
		require.Equal(t, 0, code, stderr)
		rsv, err := c.Reserve(context.Background(), client.ReserveRequest{Key: "charge-order-0001", ExecutionID: "exec-1",
			Tool: "payments.charge", Class: client.ClassExternal, Input: json.RawMessage(`{"amount":1200}`)})
		require.NoError(t, err)
		assert.Equal(t, &client.ApprovalUse{Seq: are.Seq + 1, AskSeq: are.Seq}, rsv.Approval)
	})
}
