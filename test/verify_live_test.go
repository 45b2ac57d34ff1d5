package test

import (
	"bufio"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// liveRun is what one `ledgerctl verify --json` run reported of interest.
type liveRun struct {
	OK   bool `json:"ok"`
	Head struct {
		Seq uint64 `json:"seq"`
	} `json:"head"`
	Audit struct {
		Failed []struct {
			Seq uint64 `json:"seq"`
		} `json:"failed"`
	} `json:"audit"`
}

// TestLedgerctl_incrementalVerifyWhileWriting: `verify --state
// --incremental` beside a running ledgerd checks each receipt once, up to
// the head it pins. Every key is reserved and then fails; a run from pin
// P to head H lists as failed exactly the keys whose commit is in (P, H]:
// a key left out is never checked (the next run starts after H), one past
// H is listed twice.
func TestLedgerctl_incrementalVerifyWhileWriting(t *testing.T) {
	t.Parallel()
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"))
	state := filepath.Join(t.TempDir(), "verify-state.json")
	w := startLoad(t, l, 4, "live", `"execution_id":"e","tool":"t","effect":"write"`,
		func(int) string { return `"outcome":"failed","error":{"code":"T"}` })
	require.Eventually(t, func() bool { return w.written.Load() >= 20 }, 60*time.Second, time.Millisecond, "the clients write")
	var runs []liveRun
	for range 8 {
		out, stderr, code := ledgerctl(t, "verify", "--db", l.DB, "--state", state, "--incremental", "--json")
		require.Equal(t, 0, code, "%s%s", out, stderr)
		var r liveRun
		require.NoError(t, json.Unmarshal([]byte(out), &r), out)
		runs = append(runs, r)
	}
	w.Stop()
	assert.Zero(t, w.failures.Load(), "writes kept succeeding while verifying")

	failed := failedCommits(t, l.DB)
	var pin uint64
	for i, r := range runs {
		var want, got []uint64
		for _, seq := range failed {
			if seq > pin && seq <= r.Head.Seq {
				want = append(want, seq)
			}
		}
		for _, f := range r.Audit.Failed {
			got = append(got, f.Seq)
		}
		assert.Equal(t, want, got, "run %d from %d to %d", i, pin, r.Head.Seq)
		pin = r.Head.Seq
	}
}

// failedCommits returns the seqs of the failed commits of the ledger at
// db, in order, as ledgerctl export prints them.
func failedCommits(t *testing.T, db string) []uint64 {
	t.Helper()
	out, stderr, code := ledgerctl(t, "export", "--db", db)
	require.Equal(t, 0, code, stderr)
	var seqs []uint64
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r struct {
			Seq     uint64 `json:"seq"`
			Kind    string `json:"kind"`
			Outcome string `json:"outcome"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
		if r.Kind == "commit" && r.Outcome == "failed" {
			seqs = append(seqs, r.Seq)
		}
	}
	require.NoError(t, sc.Err())
	return seqs
}
