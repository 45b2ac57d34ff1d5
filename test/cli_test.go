package test

import (
	"database/sql"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ledgerctlEnv runs ledgerctl with extra environment.
func ledgerctlEnv(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "ledgerctl"), args...)
	cmd.Env = append(os.Environ(), env...)
	return runCmd(t, cmd)
}

// helpFlags returns the flags a --help text lists, in order.
func helpFlags(help string) []string {
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  --([a-z-]+)`).FindAllStringSubmatch(help, -1) {
		names = append(names, m[1])
	}
	return names
}

// TestLedgerctl_help checks that every command's --help lists exactly the
// flags it takes, spelled --flag, and that no help text points outside
// the repository.
func TestLedgerctl_help(t *testing.T) {
	t.Parallel()
	source := []string{"db", "server", "token", "namespace"}
	hookFlags := []string{"agent", "server", "token", "namespace", "policy", "scope", "fail-open", "lease", "timeout"}
	for _, tc := range []struct {
		cmd  []string
		want []string
	}{
		{[]string{"verify"}, append(source, "json", "expect-head", "state", "incremental", "max-violations", "no-progress", "receipts-only", "all-namespaces", "checkpoint", "vkey", "segment", "segments")},
		{[]string{"audit"}, append(source, "json", "since", "tool")},
		{[]string{"receipts"}, append(source, "json", "after", "limit", "key", "execution-id", "tool", "kind")},
		{[]string{"show"}, append(source, "json", "history")},
		{[]string{"head"}, append(source, "json")},
		{[]string{"export"}, append(source, "json", "after")},
		{[]string{"resolve"}, []string{"server", "token", "namespace", "json", "outcome", "ref", "result", "error-code", "error-message", "retryable", "note"}},
		{[]string{"erase"}, []string{"server", "token", "namespace", "json", "key", "subject", "field", "reason", "replay", "db", "by"}},
		{[]string{"erasures", "export"}, append(source, "out")},
		{[]string{"token", "create"}, []string{"db", "role", "name", "namespace", "json"}},
		{[]string{"token", "list"}, []string{"db", "json"}},
		{[]string{"token", "revoke"}, []string{"db"}},
		{[]string{"backup"}, []string{"db", "json", "out", "force"}},
		{[]string{"archive"}, []string{"db", "namespace", "json", "from", "through", "dir", "vkey"}},
		{[]string{"prune"}, append(source, "json", "through", "auto", "dry-run", "archive-dir")},
		{[]string{"compact"}, []string{"db", "json"}},
		{[]string{"rebuild-index"}, []string{"db", "namespace", "json"}},
		{[]string{"rebuild-keys"}, []string{"db", "namespace", "json"}},
		{[]string{"keygen"}, []string{"origin", "out", "from"}},
		{[]string{"checkpoint"}, append(source, "json")},
		{[]string{"prove"}, append(source, "json", "erased-by")},
		{[]string{"check-proof"}, []string{"vkey", "namespace", "witness-vkey", "quorum", "json"}},
		{[]string{"namespace", "create"}, []string{"db", "server", "token", "json", "key-ttl", "payloads"}},
		{[]string{"namespace", "list"}, []string{"db", "server", "token", "json"}},
		{[]string{"policy", "set"}, []string{"server", "token", "json"}},
		{[]string{"policy", "show"}, []string{"server", "token", "json"}},
		{[]string{"approvals", "list"}, []string{"server", "token", "namespace", "json", "state", "after", "limit"}},
		{[]string{"approvals", "show"}, []string{"server", "token", "namespace", "json"}},
		{[]string{"approvals", "approve"}, []string{"server", "token", "namespace", "json", "note"}},
		{[]string{"approvals", "reject"}, []string{"server", "token", "namespace", "json", "note"}},
		{[]string{"hook"}, hookFlags},
		{[]string{"hook", "install"}, append([]string{"project", "user", "command"}, hookFlags...)},
	} {
		t.Run(strings.Join(tc.cmd, " "), func(t *testing.T) {
			out, help, code := ledgerctlEnv(t, []string{"LEDGERCTL_TOKEN=elt_secret_in_env"}, append(tc.cmd, "--help")...)
			assert.Equal(t, 0, code)
			assert.Empty(t, out)
			got := helpFlags(help)
			slices.Sort(got)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			assert.Equal(t, want, got, "%s", help)
			assert.Contains(t, help, "Examples:")
			assert.NotContains(t, help, "elt_secret_in_env", "help never shows a token from the environment")
			assert.NotContains(t, help, "shared/")
			assert.NotContains(t, help, "SPEC")
		})
	}
	out, _, code := ledgerctl(t, "--help")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "backup")
	assert.Contains(t, out, "docs/spec.md")
	assert.NotContains(t, out, "shared/")
	_, stderr, code := ledgerctl(t, "token", "--help")
	assert.Equal(t, 0, code)
	assert.Contains(t, stderr, "ledgerctl token revoke --db FILE|URL NAME")
	_, stderr, code = ledgerctl(t, "namespace", "--help")
	assert.Equal(t, 0, code)
	assert.Contains(t, stderr, "ledgerctl namespace create (--db FILE|URL | --server URL) NAME")
	assert.Contains(t, stderr, "shared tables", "namespaces live in the ledger file's shared tables")

	help, _ := exec.Command(filepath.Join(binDir, "ledgerd"), "--help").CombinedOutput()
	assert.Contains(t, string(help), "Usage: ledgerd")
	assert.NotContains(t, string(help), "SPEC", "ledgerd --help stands alone too")
	assert.NotContains(t, string(help), "shared/")
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
		{"erase"}, {"check-proof"}, {"rebuild-index"}, {"token", "create"},
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

// TestLedgerctl_missingDB gives every command that reads a file a --db
// that does not exist, in an existing and in a missing directory: one
// clear line, exit 2, and nothing created.
func TestLedgerctl_missingDB(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, db := range []string{filepath.Join(dir, "none.db"), filepath.Join(dir, "no-such-dir", "ledger.db")} {
		for _, args := range [][]string{
			{"verify"}, {"audit"}, {"receipts"}, {"show", "some-key-1"}, {"head"}, {"export"},
			{"token", "create", "--role", "admin", "--name", "ops"}, {"token", "list"}, {"token", "revoke", "ops"},
			{"backup", "--out", filepath.Join(dir, "copy.db")}, {"rebuild-keys"}, {"rebuild-index"},
			{"namespace", "create", "payments"}, {"namespace", "list"}, {"verify", "--all-namespaces"}, {"head", "--namespace", "payments"},
		} {
			args = append(args, "--db", db)
			out, stderr, code := ledgerctl(t, args...)
			assert.Equal(t, 2, code, "%q", args)
			assert.Empty(t, out, "%q", args)
			assert.Equal(t, "ledgerctl: no ledger database at "+db+" (start ledgerd --db "+db+" to create one)\n", stderr, "%q", args)
		}
	}
	es, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, es, "no database, lock, journal or copy was created")
}

// TestLedgerctl_errorsPrintOnce checks that a fatal error is one line on
// stderr, whichever command fails and how.
func TestLedgerctl_errorsPrintOnce(t *testing.T) {
	t.Parallel()
	l := startPopulated(t)
	dir := t.TempDir()
	notLedger := filepath.Join(dir, "other.db")
	sdb, err := sql.Open("sqlite3", notLedger)
	require.NoError(t, err)
	_, err = sdb.Exec(`CREATE TABLE t (x)`)
	require.NoError(t, err)
	require.NoError(t, sdb.Close())
	existing := filepath.Join(dir, "existing.db")
	require.NoError(t, os.WriteFile(existing, []byte("keep"), 0o600))
	closed := closedAddr(t)

	for _, args := range [][]string{
		{"show", "no-such-key-1", "--server", l.URL},
		{"show", "no-such-key-1", "--db", l.DB},
		{"head", "--server", closed},
		{"verify", "--server", closed},
		{"verify", "--db", notLedger},
		{"audit", "--db", notLedger},
		{"token", "list", "--db", notLedger},
		{"token", "revoke", "--db", l.DB, "nobody"},
		{"backup", "--db", l.DB, "--out", existing},
		{"backup", "--db", notLedger, "--out", filepath.Join(dir, "copy.db")},
		{"resolve", "no-such-key-1", "--server", l.URL, "--outcome", "succeeded", "--note", "checked"},
	} {
		_, stderr, code := ledgerctl(t, args...)
		assert.Equal(t, 2, code, "%q", args)
		assert.Equal(t, 1, strings.Count(stderr, "\n"), "%q printed once:\n%s", args, stderr)
		assert.True(t, strings.HasPrefix(stderr, "ledgerctl: "), "%q: %s", args, stderr)
	}
	raw, err := os.ReadFile(existing)
	require.NoError(t, err)
	assert.Equal(t, "keep", string(raw))
	_, stderr, _ := ledgerctl(t, "backup", "--db", l.DB, "--out", existing)
	assert.Contains(t, stderr, "give --force to replace it")
}

// closedAddr returns the URL of a loopback port nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return "http://" + addr
}

// TestLedgerctl_serverURL accepts a bare HOST:PORT as http:// and explains
// what it cannot use.
func TestLedgerctl_serverURL(t *testing.T) {
	t.Parallel()
	l := startPopulated(t)
	want, stderr, code := ledgerctl(t, "head", "--server", l.URL)
	require.Equal(t, 0, code, stderr)
	bare := strings.TrimPrefix(l.URL, "http://")
	for _, server := range []string{bare, l.URL + "/"} {
		out, stderr, code := ledgerctl(t, "head", "--server", server)
		assert.Equal(t, 0, code, "%s: %s", server, stderr)
		assert.Equal(t, want, out, server)
	}
	out, stderr, code := ledgerctlEnv(t, []string{"LEDGERCTL_SERVER=" + bare}, "head")
	assert.Equal(t, 0, code, stderr)
	assert.Equal(t, want, out, "LEDGERCTL_SERVER may be bare too")
	out, stderr, code = ledgerctlEnv(t, []string{"LEDGERCTL_SERVER=" + bare}, "head", "--db", l.DB)
	assert.Equal(t, 0, code, "--db wins over LEDGERCTL_SERVER: %s", stderr)
	assert.Equal(t, want, out)

	plain, _, code := ledgerctl(t, "export", "--server", bare)
	require.Equal(t, 0, code)
	withJSON, _, code := ledgerctl(t, "export", "--server", bare, "--json")
	require.Equal(t, 0, code, "export takes --json like every read command")
	assert.Equal(t, plain, withJSON)

	for _, server := range []string{"ftp://" + bare, "http://", "http://" + bare + "?x=1"} {
		_, stderr, code := ledgerctl(t, "head", "--server", server)
		assert.Equal(t, 2, code, server)
		assert.Contains(t, stderr, "--server", server)
		assert.Contains(t, stderr, "http://HOST:PORT", server)
	}
}

// TestLedgerctl_plurals checks counts in words: 1 receipt, 2 receipts,
// 1 violation.
func TestLedgerctl_plurals(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	r := l.Do("POST", "/v1/effects/reserve", reserve("plural-key-1", "exec-1", 1, true))
	require.Equal(t, 201, r.Status, r.Raw)
	out, stderr, code := ledgerctl(t, "verify", "--db", l.DB)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "OK: 1 receipt, head 1:")
	assert.Contains(t, out, "audit: 0 runtime retries, 0 re-invocations, 0 duplicate effects")
	require.NoError(t, l.Stop())

	clock := newPastClock(t)
	l = clock.start(t, l.DB)
	populate(t, l, clock)
	out, stderr, code = ledgerctl(t, "verify", "--db", l.DB)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "OK: 7 receipts")
	assert.Contains(t, out, "audit: 1 runtime retry, 1 re-invocation, 0 duplicate effects")
	require.NoError(t, l.Stop())

	// One violation: an edited actor breaks only the hash (moving seq 7's
	// recorded_at later would also make its 10 ms lease shorter than any
	// ledger writes, earlier could put it before seq 6's).
	tampered := copyLedger(t, l.DB, `UPDATE receipts SET actor = actor || 'x' WHERE seq = 7`)
	out, _, code = ledgerctl(t, "verify", "--db", tampered)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "FAILED: 1 violation in 7 receipts")
	_, stderr, code = ledgerctl(t, "audit", "--db", tampered)
	assert.Equal(t, 1, code)
	assert.Equal(t, "ledgerctl audit: the chain has 1 violation; run ledgerctl verify\n", stderr)
}

// TestLedgerctl_resolveNamesFlags checks that resolve's messages name the
// flags the operator typed, and that a refused resolve appends nothing.
func TestLedgerctl_resolveNamesFlags(t *testing.T) {
	t.Parallel()
	clock := newWallClock(t)
	l := clock.start(t, filepath.Join(t.TempDir(), "ledger.db"))
	r := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"charge-0077","execution_id":"exec-1","tool":"payments.charge","effect":"write","lease_ms":10}`)
	require.Equal(t, 201, r.Status, r.Raw)
	clock.advance(20 * time.Millisecond) // the lease ends: interrupted
	base := []string{"resolve", "charge-0077", "--server", l.URL}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--outcome", "failed", "--note", "checked"}, "--outcome failed needs --error-code"},
		{[]string{"--outcome", "failed", "--error-code", "not_charged", "--note", "checked"}, "--error-code must be"},
		{[]string{"--outcome", "succeeded", "--retryable", "--note", "checked"}, "--retryable"},
		{[]string{"--outcome", "succeeded", "--error-message", "x", "--note", "checked"}, "--error-message"},
		{[]string{"--outcome", "succeeded", "--result", "{bad", "--note", "checked"}, "--result is not valid JSON"},
		{[]string{"--outcome", "succeeded"}, "--note is required"},
		{[]string{"--outcome", "maybe", "--note", "checked"}, "--outcome must be succeeded, failed or not_applied"},
		{[]string{"--outcome", "succeeded", "--note", "checked", "--db", l.DB}, "give --server URL, not --db"},
	} {
		_, stderr, code := ledgerctl(t, append(slices.Clone(base), tc.args...)...)
		assert.Equal(t, 2, code, "%q", tc.args)
		assert.Contains(t, stderr, tc.want, "%q", tc.args)
		assert.NotContains(t, stderr, "error.code", "%q", tc.args)
	}
	assert.Equal(t, float64(1), l.Do("GET", "/v1/head", "").Body["seq"], "nothing appended")
	out, stderr, code := ledgerctl(t, append(base, "--outcome", "failed", "--error-code", "NOT_CHARGED", "--note", "no charge at the PSP")...)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "now failed")
}

// TestLedgerctl_flagValues checks that bad flag values are usage errors
// that name the flag, for a file and for a server alike.
func TestLedgerctl_flagValues(t *testing.T) {
	t.Parallel()
	l := startPopulated(t)
	for _, src := range [][]string{{"--db", l.DB}, {"--server", l.URL}} {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"receipts", "--limit", "0"}, "--limit must be from 1 to 1000, got 0"},
			{[]string{"receipts", "--limit", "-1"}, "--limit must be from 1 to 1000, got -1"},
			{[]string{"receipts", "--limit", "1001"}, "--limit must be from 1 to 1000, got 1001"},
			{[]string{"receipts", "--kind", "bogus"}, `--kind must be reserve, commit, replay, resolve, reconcile, policy, ask, approval, deny, key, erase or prune, got "bogus"`},
			{[]string{"verify", "--max-violations", "0"}, "--max-violations must be at least 1"},
			{[]string{"audit", "--since", "yesterday"}, "--since: want an RFC 3339 time"},
		} {
			args := append(slices.Clone(tc.args), src...)
			out, stderr, code := ledgerctl(t, args...)
			assert.Equal(t, 2, code, "%q", args)
			assert.Empty(t, out, "%q", args)
			assert.Contains(t, stderr, tc.want, "%q", args)
		}
	}
}

// TestLedgerctl_tokenCommands checks the token subcommands' usage errors.
func TestLedgerctl_tokenCommands(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"token"}, "want create, list or revoke"},
		{[]string{"token", "bogus"}, "unknown token command"},
		{[]string{"token", "create", "--db", l.DB, "--role", "root", "--name", "x"}, "--role must be reader, writer, approver or admin"},
		{[]string{"token", "create", "--db", l.DB, "--role", "admin", "--name", "two words"}, "--name must be"},
		{[]string{"token", "create", "--db", l.DB, "--role", "admin"}, "give --role and --name"},
		{[]string{"token", "revoke", "--db", l.DB}, "want exactly one NAME"},
		{[]string{"token", "list"}, "give --db FILE"},
		{[]string{"token", "list", "--db", l.DB, "--role", "admin"}, "flag provided but not defined: -role"},
	} {
		_, stderr, code := ledgerctl(t, tc.args...)
		assert.Equal(t, 2, code, "%q", tc.args)
		assert.Contains(t, stderr, tc.want, "%q", tc.args)
	}
	out, _, code := ledgerctl(t, "token", "list", "--db", l.DB, "--json")
	assert.Equal(t, 0, code)
	assert.Equal(t, "[]\n", out, "no token was created")
}

// TestLedgerd_commitReservationToken checks what a commit with a wrong
// reservation token says: malformed (400) or not the latest (409).
func TestLedgerd_commitReservationToken(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	tok := l.Reserve(t, reserve("token-key-1", "exec-1", 1, true))
	for _, bad := range []string{"rsv_…", "null", tok[:len(tok)-2], tok + "00", "elt_" + tok[4:]} {
		r := l.Do("POST", "/v1/effects/token-key-1/commit", `{"reservation":"`+bad+`","outcome":"succeeded"}`)
		assert.Equal(t, 400, r.Status, "%q: %s", bad, r.Raw)
		assert.Equal(t, "invalid_request", r.Code(), bad)
		e, _ := r.Body["error"].(map[string]any)
		assert.Contains(t, e["message"], "not a reservation token of this ledger (malformed: expected rsv_ and 64 lowercase hex digits", bad)
		d, _ := e["details"].(map[string]any)
		assert.Equal(t, "reservation", d["field"], bad)
	}
	r := l.Do("POST", "/v1/effects/token-key-1/commit", `{"reservation":"rsv_`+strings.Repeat("0", 64)+`","outcome":"succeeded"}`)
	assert.Equal(t, 409, r.Status, r.Raw)
	assert.Equal(t, "stale_reservation", r.Code())
	e, _ := r.Body["error"].(map[string]any)
	assert.Equal(t, "this reservation token is not the key's latest reservation (it was taken over, retried, or never issued for this key)", e["message"])
	r = l.Do("POST", "/v1/effects/token-key-1/commit", `{"reservation":"`+tok+`","outcome":"succeeded"}`)
	assert.Equal(t, 201, r.Status, r.Raw)
}

// TestLedgerctl_tokenEnv: with --server, ledgerctl takes its token from
// --token, else LEDGERCTL_TOKEN, else LEDGER_TOKEN (the variable the
// clients and ledger-mcp read).
func TestLedgerctl_tokenEnv(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	tok := createToken(t, l.DB, "ops", "admin")
	require.Eventually(t, func() bool { return l.Do("GET", "/v1/receipts", "").Status == 401 },
		10*time.Second, 20*time.Millisecond, "a new first token is enforced within a second")
	const bad = "elt_not_a_token"
	for _, tc := range []struct {
		desc          string
		ctl, ledger   string
		flag          []string
		wantOK        bool
		wantNoRequest bool
	}{
		{desc: "no token", wantOK: false},
		{desc: "LEDGER_TOKEN alone", ledger: tok, wantOK: true},
		{desc: "LEDGERCTL_TOKEN alone", ctl: tok, wantOK: true},
		{desc: "LEDGERCTL_TOKEN wins over LEDGER_TOKEN", ctl: tok, ledger: bad, wantOK: true},
		{desc: "LEDGERCTL_TOKEN wins, even when wrong", ctl: bad, ledger: tok, wantOK: false},
		{desc: "--token beats both", ctl: bad, ledger: bad, flag: []string{"--token", tok}, wantOK: true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			env := []string{"LEDGERCTL_TOKEN=" + tc.ctl, "LEDGER_TOKEN=" + tc.ledger}
			out, stderr, code := ledgerctlEnv(t, env, append([]string{"receipts", "--server", l.URL}, tc.flag...)...)
			if tc.wantOK {
				assert.Equal(t, 0, code, "%s %s", out, stderr)
				return
			}
			assert.NotEqual(t, 0, code, out)
			assert.Contains(t, stderr, "401", "refused for its token")
		})
	}
}

// TestLedgerctl_receiptsWholeKeys: the tables print idempotency keys
// whole, so that a key copied from `ledgerctl receipts` or `audit` works
// with `show` and `resolve`.
func TestLedgerctl_receiptsWholeKeys(t *testing.T) {
	t.Parallel()
	clock := newWallClock(t)
	l := clock.start(t, filepath.Join(t.TempDir(), "ledger.db"))
	key := "order-2026-" + strings.Repeat("abcdefghij", 20) + "-end" // 215 bytes
	r := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"`+key+`","execution_id":"exec-1","tool":"payments.charge","effect":"write","lease_ms":10}`)
	require.Equal(t, 201, r.Status, r.Raw)
	clock.advance(20 * time.Millisecond) // the lease ends: interrupted, listed by audit

	out, stderr, code := ledgerctl(t, "receipts", "--server", l.URL)
	require.Equal(t, 0, code, stderr)
	assert.NotContains(t, out, "…")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	fields := strings.Fields(lines[1])
	require.GreaterOrEqual(t, len(fields), 3, lines[1])
	assert.Equal(t, key, fields[2], "the KEY column holds the key whole")

	out, stderr, code = ledgerctl(t, "show", fields[2], "--server", l.URL)
	require.Equal(t, 0, code, "a key copied from receipts works with show: %s", stderr)
	assert.Contains(t, out, key)

	out, stderr, code = ledgerctl(t, "audit", "--server", l.URL)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "  "+key+" ", "audit lists the interrupted key whole")
	assert.NotContains(t, out, "…")

	out, stderr, code = ledgerctl(t, "resolve", key, "--server", l.URL, "--outcome", "failed", "--error-code", "NOT_CHARGED", "--note", "checked the PSP")
	require.Equal(t, 0, code, "%s %s", out, stderr)
}
