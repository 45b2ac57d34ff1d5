package test

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLedgerMCP_resolveHowNamesToken (issue 44): the command the model is
// given to have a key resolved names the admin token, and where
// --admin-listen keeps it, so that it works as printed.
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
		abs, err := filepath.Abs(g.tokenFile)
		require.NoError(t, err)
		assert.Contains(t, msg, "(the admin token is in "+abs+")")
		assert.Contains(t, msg, "or the page "+g.url+"/ui/")

		m := regexp.MustCompile(`LEDGER_TOKEN=<admin token> (ledgerctl resolve \S+ --server \S+) --outcome`).FindStringSubmatch(msg)
		require.Len(t, m, 2, msg)
		args := append(strings.Fields(m[1])[1:], "--outcome", "succeeded", "--note", "checked: it went through")
		out, errOut, code := ledgerctlEnv(t, []string{"LEDGER_TOKEN=" + g.token(t)}, args...)
		require.Equal(t, 0, code, out+errOut)
	})
}
