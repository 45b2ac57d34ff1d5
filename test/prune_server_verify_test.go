package test

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/verify"
)

// servedPruneReport is what these tests read of the pruned prefix in
// ledgerctl verify --server --json.
type servedPruneReport struct {
	prunedReport
	Pruned *verify.PrunedProof `json:"pruned"`
}

func verifyServedPruned(t *testing.T, args ...string) (servedPruneReport, int) {
	t.Helper()
	out, stderr, code := ledgerctl(t, append([]string{"verify", "--json", "--no-progress", "--namespace", "reports"}, args...)...)
	var rep servedPruneReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "stdout %q stderr %q", out, stderr)
	return rep, code
}

// TestLedgerctl_verifyServerPruned runs the real ledgerctl verify
// --server against the real ledgerd serving a SQLite file pruned through
// 601 (SPEC §16): clean from the hash of 601, proven by one inclusion
// proof in the latest served checkpoint (its signature checked with
// --vkey, and said unchecked without); a checkpoint signed by no key
// given is a violation; a --state pinned at 301 before the prune reports
// 302…601 unverified_pruned, a pin at 601 with the proven hash is intact
// and one with another hash head_mismatch. The lying server is
// verify.TestVerifier_servedPrune's.
func TestLedgerctl_verifyServerPruned(t *testing.T) {
	t.Parallel()
	p := buildPrunedSQLite(t)
	l := StartLedgerd(t, p.path)
	url := l.URL

	rep, code := verifyServedPruned(t, "--server", url)
	require.Equal(t, 0, code, "%+v", rep.Violations)
	assert.Equal(t, uint64(606), rep.Head.Seq)
	assert.Equal(t, uint64(5), rep.Checked, "602 … 606 rehashed")
	require.NotNil(t, rep.Pruned)
	assert.Equal(t, verify.PrunedProof{Through: 601, Hash: rep.Pruned.Hash, TreeSize: 606, Signed: false, Proven: true}, *rep.Pruned)
	require.Len(t, rep.Audit.PrunedRanges, 1)
	assert.Equal(t, uint64(603), rep.Audit.PrunedRanges[0].Seq)

	out, stderr, code := ledgerctl(t, "verify", "--no-progress", "--namespace", "reports", "--server", url)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "OK: 606 receipts")
	assert.Contains(t, out, "pruned: receipts 1…601 were pruned")
	assert.Contains(t, out, "proven in the latest checkpoint the server serves, its signature unchecked")
	out, stderr, code = ledgerctl(t, "verify", "--no-progress", "--namespace", "reports", "--server", url, "--vkey", p.vkey)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "proven in the latest checkpoint the server serves, signed by a key of --vkey")

	_, other := keygen(t, t.TempDir(), "ex.test")
	rep, code = verifyServedPruned(t, "--server", url, "--vkey", other)
	assert.Equal(t, 1, code)
	assert.Equal(t, map[string]int{"checkpoint_key_unknown": 1}, rep.rules(), "%+v", rep.Violations)

	// A state file saved at seq 301, before the prune.
	for _, incremental := range [][]string{nil, {"--incremental"}} {
		state := filepath.Join(t.TempDir(), "state.json")
		rep, code = verifyServedPruned(t, "--db", p.early, "--state", state)
		require.Equal(t, 0, code, "%+v", rep.Violations)
		require.Equal(t, uint64(301), rep.Head.Seq)
		rep, code = verifyServedPruned(t, append([]string{"--server", url, "--state", state}, incremental...)...)
		require.Equal(t, 0, code, "%v: %+v", incremental, rep.Violations)
		assert.Equal(t, []uint64{302, 601}, rep.UnverifiedPruned)
		assert.Equal(t, uint64(606), rep.Head.Seq)
	}
	hash601 := rep.Pruned.Hash
	for _, incremental := range [][]string{nil, {"--incremental"}} {
		state := filepath.Join(t.TempDir(), "state.json")
		require.NoError(t, verify.WriteState(state, verify.Pin{Seq: 601, Hash: hash601}))
		rep, code = verifyServedPruned(t, append([]string{"--server", url, "--state", state}, incremental...)...)
		require.Equal(t, 0, code, "%v: %+v", incremental, rep.Violations)
		assert.Empty(t, rep.UnverifiedPruned)
		other := []byte(hash601)
		if other[0] = '0'; hash601[0] == '0' {
			other[0] = '1'
		}
		require.NoError(t, verify.WriteState(state, verify.Pin{Seq: 601, Hash: string(other)}))
		rep, code = verifyServedPruned(t, append([]string{"--server", url, "--state", state}, incremental...)...)
		assert.Equal(t, 1, code)
		assert.Equal(t, map[string]int{"head_mismatch": 1}, rep.rules(), "%v: %+v", incremental, rep.Violations)
	}
}
