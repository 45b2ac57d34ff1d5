package test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/mcpgate"
)

// TestLedgerMCP_resolveHowNamesToken (issue 44): the command the model is
// given to have a key resolved names the admin token (never where it is
// kept: the text reaches the agent), so that it works as printed with it.
func TestLedgerMCP_resolveHowNamesToken(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		sh := newShop(t)
		g := startAdminGateway(t, sh, db, "--lease", "300ms", "--wait", "0s")
		key := g.interrupt(t, sh, "tok1")
		refused := g.call(t, "slow", map[string]any{"id": "tok1"}, nil)
		require.Equal(t, "unsafe_resume", status(refused), text(t, refused))
		msg := text(t, refused)
		assert.Contains(t, msg, "LEDGER_TOKEN=<admin token> ledgerctl resolve "+key+" --server "+g.url+" --outcome ")
		assert.NotContains(t, msg, g.tokenFile, "the model is never told where the admin token is kept")
		assert.NotContains(t, msg, filepath.Base(g.tokenFile))
		assert.Contains(t, msg, "or the page "+g.url+"/ui/")

		m := regexp.MustCompile(`LEDGER_TOKEN=<admin token> (ledgerctl resolve \S+ --server \S+) --outcome`).FindStringSubmatch(msg)
		require.Len(t, m, 2, msg)
		args := append(strings.Fields(m[1])[1:], "--outcome", "succeeded", "--note", "checked: it went through")
		out, errOut, code := ledgerctlEnv(t, []string{"LEDGER_TOKEN=" + g.token(t)}, args...)
		require.Equal(t, 0, code, out+errOut)
	})
}

// TestLedgerMCP_upstreamRestartedOnce (issue 44, item 9): over stdio, a
// stdio upstream of an older revision (a 2026-07-28 one always had one
// session) that dies is started again once, for the next call: the
// client's one session is the shared one, at every revision.
func TestLedgerMCP_upstreamRestartedOnce(t *testing.T) {
	t.Parallel()
	for _, rev := range []string{mcpgate.Version20260728, "2025-11-25"} {
		t.Run(rev, func(t *testing.T) {
			t.Parallel()
			sh := newShop(t)
			starts := filepath.Join(sh.dir, "starts")
			script := filepath.Join(t.TempDir(), "upstream.sh")
			require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho started >> '"+starts+"'\nexec '"+sh.bin+"' --dir '"+sh.dir+"' --revision 2025-11-25\n"), 0o700))
			g := startGatewayRev(t, rev, nil, "--db", filepath.Join(t.TempDir(), "mcp.db"), "--", script)
			count := func() int {
				b, err := os.ReadFile(starts)
				require.NoError(t, err)
				return strings.Count(string(b), "started\n")
			}
			res := g.call(t, "charge", map[string]any{"order": "before"}, nil)
			require.False(t, res.IsError, text(t, res))
			assert.Equal(t, 1, count(), "one upstream for the client")

			res = g.call(t, "crash", map[string]any{"id": "C1"}, nil)
			require.Equal(t, "outcome_unknown", status(res), text(t, res))
			res = g.call(t, "charge", map[string]any{"order": "after"}, nil)
			require.False(t, res.IsError, text(t, res))
			assert.Equal(t, 1, sh.runs("charge", "after"))
			assert.Equal(t, 2, count(), "started again once, after it died")
		})
	}
}
