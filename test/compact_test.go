package test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLedgerctl_compact runs the real ledgerctl compact on a pruned SQLite
// file (SPEC §16: the bodies ≤ 601 deleted): the file shrinks, ledgerctl
// verify --db is as clean after as before; it is refused while ledgerd
// holds the file, and on a PostgreSQL --db (exit 2 each).
func TestLedgerctl_compact(t *testing.T) {
	t.Parallel()
	p := buildPrunedSQLite(t)

	l := StartLedgerd(t, p.path)
	_, stderr, code := ledgerctl(t, "compact", "--db", p.path)
	assert.Equal(t, 2, code, "refused while ledgerd holds the file")
	assert.Contains(t, stderr, "already open for writing")
	require.NoError(t, l.Stop())

	out, stderr, code := ledgerctl(t, "compact", "--db", p.path, "--json")
	require.Equal(t, 0, code, stderr)
	var res struct {
		DB            string
		Before, After int64
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	assert.Equal(t, p.path, res.DB)
	assert.Less(t, res.After, res.Before, "the pages the deletion freed go back to the file system")
	rep, code := verifyPruned(t, "--db", p.path)
	require.Equal(t, 0, code, "%+v", rep.Violations)
	assert.Equal(t, uint64(606), rep.Head.Seq)

	out, stderr, code = ledgerctl(t, "compact", "--db", p.path)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "compacted "+p.path)

	_, stderr, code = ledgerctl(t, "compact", "--db", "postgres://ledger@/postgres?host=/nonexistent")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "VACUUM FULL")
	assert.Contains(t, stderr, "operator's call")
}
