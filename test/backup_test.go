package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// backupReport is the JSON that ledgerctl backup prints.
type backupReport struct {
	OK       bool   `json:"ok"`
	Out      string `json:"out"`
	Bytes    int64  `json:"bytes"`
	Receipts uint64 `json:"receipts"`
	Head     struct {
		Seq  uint64 `json:"seq"`
		Hash string `json:"hash"`
	} `json:"head"`
	Violations      []map[string]any `json:"violations"`
	ViolationsTotal int              `json:"violations_total"`
}

// TestLedgerctl_backup copies a ledger while a real ledgerd writes it: the
// copy verifies, its head is a receipt of the live chain, an existing
// --out is kept unless --force, and ledgerd starts on the copy.
func TestLedgerctl_backup(t *testing.T) {
	t.Parallel()
	l := startPopulated(t)
	w := startLoad(t, l, 4, "backup-load", `"execution_id":"e","tool":"t","effect":"write","idempotent":true`,
		func(int) string { return `"outcome":"succeeded"` })
	require.Eventually(t, func() bool { return l.Do("GET", "/v1/head", "").Body["seq"].(float64) >= 60 }, 60*time.Second, 20*time.Millisecond)

	dir := t.TempDir()
	out := filepath.Join(dir, "ledger-backup.db")
	var reps []backupReport
	for i, args := range [][]string{
		{"backup", "--db", l.DB, "--out", out, "--json"},
		{"backup", "--db", l.DB, "--out", out, "--json", "--force"},
	} {
		before := uint64(l.Do("GET", "/v1/head", "").Body["seq"].(float64))
		stdout, stderr, code := ledgerctl(t, args...)
		require.Equal(t, 0, code, "%q: %s%s", args, stdout, stderr)
		var rep backupReport
		require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
		assert.True(t, rep.OK)
		assert.Equal(t, out, rep.Out)
		assert.Empty(t, rep.Violations)
		after := uint64(l.Do("GET", "/v1/head", "").Body["seq"].(float64))
		assert.GreaterOrEqual(t, rep.Head.Seq, before, "run %d: the copy holds at least what was there before", i)
		assert.LessOrEqual(t, rep.Head.Seq, after, "run %d: the copy's head ≤ the live head", i)
		assert.Equal(t, rep.Head.Seq, rep.Receipts)
		live := l.Do("GET", fmt.Sprintf("/v1/receipts/%d", rep.Head.Seq), "")
		require.Equal(t, 200, live.Status)
		assert.Equal(t, live.Body["hash"], rep.Head.Hash, "run %d: the copy's head is a receipt of the live chain", i)
		reps = append(reps, rep)
	}
	assert.GreaterOrEqual(t, reps[1].Head.Seq, reps[0].Head.Seq)

	// An existing --out is refused without --force and left as it was.
	kept, err := os.ReadFile(out)
	require.NoError(t, err)
	_, stderr, code := ledgerctl(t, "backup", "--db", l.DB, "--out", out)
	assert.Equal(t, 2, code)
	assert.Equal(t, "ledgerctl: --out "+out+" exists; give --force to replace it\n", stderr)
	now, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, kept, now)

	// The text form names the file and the head.
	out2 := filepath.Join(dir, "second.db")
	stdout, stderr, code := ledgerctl(t, "backup", "--db", l.DB, "--out", out2)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "backup: wrote "+out2)
	assert.Contains(t, stdout, "verified: OK, head ")

	w.Stop()
	assert.Zero(t, w.failures.Load(), "writes kept succeeding during the backups")

	es, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{"ledger-backup.db", "second.db"}, names, "no temporary file, journal or WAL is left")

	// The copy is a ledger: it verifies against its pinned head, and
	// ledgerd starts on it and appends after that head.
	pin := fmt.Sprintf("%d:%s", reps[1].Head.Seq, reps[1].Head.Hash)
	_, stderr, code = ledgerctl(t, "verify", "--db", out, "--expect-head", pin)
	assert.Equal(t, 0, code, stderr)
	restored := StartLedgerd(t, out)
	r := restored.Do("POST", "/v1/effects/reserve", reserve("after-restore-1", "exec-1", 1, false))
	require.Equal(t, 201, r.Status, r.Raw)
	assert.Equal(t, float64(reps[1].Head.Seq+1), r.Body["receipt"].(map[string]any)["seq"])
	require.NoError(t, restored.Stop())
	_, stderr, code = ledgerctl(t, "verify", "--db", out, "--expect-head", pin)
	assert.Equal(t, 0, code, "the restored ledger extends the backup's head: %s", stderr)
}

// TestLedgerctl_backupErrors checks the exit codes: 1 when the copy does
// not verify, 2 for usage and I/O errors.
func TestLedgerctl_backupErrors(t *testing.T) {
	t.Parallel()
	l := startPopulated(t, "--default-payloads", "inline") // external_ref is edited in the chain
	require.NoError(t, l.Stop())
	dir := t.TempDir()

	tampered := copyLedger(t, l.DB, `UPDATE receipts SET external_ref = 'msg_forged' WHERE seq = 4`)
	stdout, _, code := ledgerctl(t, "backup", "--db", tampered, "--out", filepath.Join(dir, "copy.db"))
	assert.Equal(t, 1, code, stdout)
	assert.Contains(t, stdout, "verified: FAILED, 1 violation")
	assert.Contains(t, stdout, "hash_mismatch")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"backup", "--db", l.DB}, "give --out FILE"},
		{[]string{"backup", "--out", filepath.Join(dir, "x.db")}, "give --db FILE"},
		{[]string{"backup", "--db", l.DB, "--out", filepath.Join(dir, "no-such-dir", "x.db")}, "no directory"},
		{[]string{"backup", "--db", l.DB, "--out", dir}, "is a directory"},
		{[]string{"backup", "--db", l.DB, "--out", l.DB, "--force"}, "the ledger itself"},
		{[]string{"backup", "--db", l.DB, "--out", filepath.Join(dir, "x.db"), "extra"}, "unexpected arguments"},
		{[]string{"backup", "--db", l.DB, "--out", filepath.Join(dir, "x.db"), "--server", "http://127.0.0.1:1"}, "not defined: -server"},
	} {
		_, stderr, code := ledgerctl(t, tc.args...)
		assert.Equal(t, 2, code, "%q", tc.args)
		assert.Contains(t, stderr, tc.want, "%q", tc.args)
	}
	_, err := os.Stat(filepath.Join(dir, "x.db"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, stderr, code := ledgerctl(t, "verify", "--db", l.DB)
	assert.Equal(t, 0, code, "the ledger survived --out naming itself: %s", stderr)
}
