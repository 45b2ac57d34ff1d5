package test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPrune_kill (SPEC §16, "kill -9 during each step"): ledgerd killed
// with SIGKILL (the test build's LEDGERD_TEST_KILL_AT) right after each
// step of a prune — the segment written, the prune receipt committed,
// the first and the second deletion batch — leaves the archive directory
// and the ledger each whole or absent: the segment directory is there and
// passes ledgerctl verify --segment (a half-written .segment-* temporary
// planted beside it is never taken for a segment), and ledgerctl verify
// --db is clean on the ledger as the kill left it. Restarted without the
// seam, ledgerd has the prune receipt if and only if GET …/prune lists
// its prune; the deletion resumes by itself until kept_through reaches
// pruned_through; a pruned receipt and a key pruned whole are 410; and
// ledgerctl verify --db --segments joins the segment clean. After a kill
// at segment-written (no receipt), a new POST prunes the same range and
// reuses the orphan segment. On SQLite and PostgreSQL.
func TestPrune_kill(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testPruneKill)
}

// pruneKillPoint is a step a prune is killed at, in a namespace of its
// own holding pairs reserve+commit pairs.
type pruneKillPoint struct {
	step, ns string
	pairs    int
}

// pruneKillPoints: batch-2 needs a range of two batches at least (a batch
// starts at 512 receipts and adapts, up to 8,192, to take about 5 ms):
// 801 receipts give two, the second the last (where the checkpoints are
// thinned).
var pruneKillPoints = []pruneKillPoint{
	{"segment-written", "ksegment", prunePairs},
	{"receipt-committed", "kreceipt", prunePairs},
	{"batch-1", "kbatch1", prunePairs},
	{"batch-2", "kbatch2", 400},
}

func testPruneKill(t *testing.T, db string) {
	clock := newTestClock(t, t0)
	key, vkey := keygen(t, t.TempDir(), "ex.test")
	archiveDir := t.TempDir()
	args := []string{"--signing-key", key, "--log-origin", "ex.test", "--checkpoint-interval", "20ms",
		"--archive-dir", archiveDir, "--prune-interval", "0"}
	l := clock.start(t, db, args...)
	heads := map[string]int64{}
	for _, k := range pruneKillPoints {
		require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"`+k.ns+`","key_ttl_ms":60000}`).Status)
		require.Equal(t, 200, l.Do("PUT", "/v1/namespaces/"+k.ns+"/policy", `{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`).Status)
		appendPairs(t, l, "/v1/ns/"+k.ns, "kill", k.pairs)
		heads[k.ns] = num(t, l.Do("GET", "/v1/ns/"+k.ns+"/head", "").Body, "seq")
	}
	clock.advance(3 * time.Minute) // past the key TTL and keep_ms
	for _, k := range pruneKillPoints {
		waitCheckpointNS(t, l, vkey, k.ns, heads[k.ns])
	}
	require.NoError(t, l.Stop())
	// A segment whose write a crash cut short: a hidden temporary, never
	// a segment of any prune.
	half := filepath.Join(archiveDir, ".segment-0123456789")
	require.NoError(t, os.Mkdir(half, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(half, "receipts.jsonl"), []byte(`{"seq":1,"kind":"pol`), 0o644))

	for _, k := range pruneKillPoints {
		t.Logf("%s: prune of %s (receipts 1…%d)", k.step, k.ns, heads[k.ns])
		pruneKilled(t, clock, db, args, vkey, archiveDir, k, heads[k.ns])
	}
	_, err := os.Stat(filepath.Join(half, "receipts.jsonl"))
	assert.NoError(t, err, "the half-written temporary is left alone")
}

// pruneKilled prunes k.ns through head with ledgerd killed at k.step,
// then checks what the kill left and what a restart makes of it.
func pruneKilled(t *testing.T, clock *testClock, db string, args []string, vkey, archiveDir string, k pruneKillPoint, head int64) {
	segment := fmt.Sprintf("%s-1-%d", k.ns, head)
	l := startLedgerdEnv(t, []string{clock.env(), "LEDGERD_TEST_KILL_AT=" + k.step}, db, args...)
	// The answer may never come: the kill can beat it.
	st, b, err := rawPost(l.URL+"/v1/ns/"+k.ns+"/prune", `{}`)
	if err == nil {
		require.Equal(t, 201, st, "%s", b)
	}
	waitKilled(t, l, k.step)

	// The kill's leftovers: the segment whole (it was written before
	// every step), the ledger clean as it is.
	segmentsWhole(t, archiveDir, vkey, segment)
	out, stderr, code := ledgerctl(t, "verify", "--json", "--no-progress", "--db", db, "--namespace", k.ns)
	require.Equal(t, 0, code, "%s: the ledger as the kill left it: %s%s", k.step, out, stderr)
	var rep verifyReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	// The receipts rehashed: those whose bodies the deletion had not
	// reached when killed, and the prune receipt.
	t.Logf("%s: killed with %d receipts of %d rehashed", k.step, rep.Checked, head+1)
	if k.step == "batch-1" {
		assert.Less(t, rep.Checked, uint64(head), "a first batch deletes 512 receipts")
		assert.Greater(t, rep.Checked, uint64(1), "the deletion was cut short")
	}

	l = clock.start(t, db, args...)
	do := func(method, path string) Resp {
		t.Helper()
		body := ""
		if method == "POST" {
			body = "{}"
		}
		return l.Do(method, "/v1/ns/"+k.ns+path, body)
	}
	ps := do("GET", "/prune")
	require.Equal(t, 200, ps.Status, ps.Raw)
	prunes, _ := ps.Body["prunes"].([]any)
	h := num(t, do("GET", "/head").Body, "seq")
	receipt := h == head+1
	if receipt {
		rc := do("GET", fmt.Sprintf("/receipts/%d", h))
		require.Equal(t, 200, rc.Status, rc.Raw)
		assert.Equal(t, "prune", rc.Body["kind"], rc.Raw)
	} else {
		require.Equal(t, head, h, "%s: nothing but the prune receipt is ever appended", k.step)
	}
	require.Equal(t, receipt, len(prunes) == 1, "%s: the prune receipt is there (head %d) if and only if its prune is listed: %s", k.step, h, ps.Raw)
	require.Equal(t, k.step != "segment-written", receipt, "%s: the receipt was committed before the kill", k.step)

	if !receipt {
		// Nothing pruned: the receipts are there; a new prune reuses
		// the orphan segment, which holds the same receipts.
		assert.Equal(t, 200, do("GET", "/receipts/5").Status)
		b, err := os.ReadFile(filepath.Join(archiveDir, segment, "manifest.json"))
		require.NoError(t, err)
		var m struct{ Digest string }
		require.NoError(t, json.Unmarshal(b, &m))
		r := do("POST", "/prune")
		require.Equal(t, 201, r.Status, r.Raw)
		assert.Equal(t, segment, r.Body["segment"], r.Raw)
		assert.Equal(t, float64(head), r.Body["through"], r.Raw)
		assert.Equal(t, m.Digest, r.Body["digest"], "the orphan holds the very receipts pruned: %s", r.Raw)
	}
	var st2 Resp
	require.Eventually(t, func() bool {
		st2 = do("GET", "/prune")
		return st2.Status == 200 && st2.Body["kept_through"] == float64(head)
	}, 60*time.Second, 20*time.Millisecond, "%s: the deletion resumes to the prune's through: %s", k.step, st2.Raw)
	assert.Equal(t, float64(head), st2.Body["pruned_through"], st2.Raw)
	p := st2.Body["prunes"].([]any)[0].(map[string]any)
	assert.Equal(t, false, p["deleting"], st2.Raw)
	assert.Equal(t, segment, p["segment"], st2.Raw)
	for _, path := range []string{"/receipts/5", fmt.Sprintf("/receipts/%d", head), "/effects/kill-0007"} {
		r := do("GET", path)
		assert.Equal(t, 410, r.Status, "%s: %s", path, r.Raw)
		assert.Equal(t, "pruned", r.Code(), r.Raw)
	}
	assert.Equal(t, float64(head+1), do("GET", "/head").Body["seq"], "%s: the prune receipt, nothing more", k.step)
	require.NoError(t, l.Stop())

	segmentsWhole(t, archiveDir, vkey, segment)
	out, stderr, code = ledgerctl(t, "verify", "--no-progress", "--db", db, "--namespace", k.ns, "--segments", archiveDir, "--vkey", vkey)
	require.Equal(t, 0, code, "%s: %s%s", k.step, out, stderr)
}

// waitKilled waits for l to die of SIGKILL after step.
func waitKilled(t *testing.T, l *Ledgerd, step string) {
	t.Helper()
	select {
	case err := <-l.exit:
		l.exit <- err // for Kill at cleanup
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "ledgerd exited (%v), not killed, at %s:\n%s", err, step, l.Logs())
		ws, ok := ee.Sys().(syscall.WaitStatus)
		require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "ledgerd exited (%v), not killed, at %s:\n%s", err, step, l.Logs())
	case <-time.After(60 * time.Second):
		t.Fatalf("ledgerd was not killed at %s:\n%s", step, l.Logs())
	}
}

// segmentsWhole checks the archive directory: want is there, and every
// entry but a hidden temporary is a segment that passes ledgerctl verify
// --segment.
func segmentsWhole(t *testing.T, dir, vkey, want string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	found := false
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".segment-") {
			continue
		}
		found = found || e.Name() == want
		out, stderr, code := ledgerctl(t, "verify", "--segment", filepath.Join(dir, e.Name()), "--vkey", vkey)
		assert.Equal(t, 0, code, "segment %s: %s%s", e.Name(), out, stderr)
	}
	assert.True(t, found, "segment %s in %v", want, entries)
}
