package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// prunedSQLite is a SQLite file whose namespace "reports" the domain
// pruned through 601 and whose bodies it deleted (SPEC §16), as
// testkit/storetest/prune.go makes one, with a copy of the file taken at
// seq 301 (before the prune), the archive directory, the log's verifier
// key and its latest checkpoint, each in a file.
type prunedSQLite struct {
	path, early, archive, vkey, checkpoint string
}

func buildPrunedSQLite(t *testing.T) *prunedSQLite {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	p := &prunedSQLite{path: filepath.Join(dir, "ledger.db"), early: filepath.Join(dir, "early.db"),
		archive: filepath.Join(dir, "archive"), vkey: filepath.Join(dir, "log.vkey"), checkpoint: filepath.Join(dir, "checkpoint.txt")}
	require.NoError(t, os.Mkdir(p.archive, 0o700))
	clock := testkit.NewClock()
	st, err := sqlite.OpenStore(ctx, p.path, sqlite.Options{Now: clock.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, false)
	require.NoError(t, err)
	l := ledger.New(st, ledger.Config{Now: clock.Now, ArchiveDir: p.archive})
	require.NoError(t, l.CreateNamespace(ctx, "reports", ledger.NamespaceSettings{KeyTTL: uint64(time.Hour.Milliseconds())}))
	n, err := l.NS(ctx, "reports")
	require.NoError(t, err)
	_, err = n.SetPolicy(ctx, []byte(`{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`), "ops") // 1
	require.NoError(t, err)
	skey, vkey, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p.vkey, []byte(vkey+"\n"), 0o600))
	signer, err := note.NewSigner(skey)
	require.NoError(t, err)
	cp := &tlog.Checkpointer{Store: n, Signer: signer, Origin: "ex.test/reports"}
	for i := range 300 { // 2 … 601
		key := fmt.Sprintf("prune-%03d", i)
		r := testkit.MustReserve(t, n, testkit.ReserveReq(key, "e1"))
		testkit.MustCommit(t, n, testkit.Succeed(key, r.Reservation))
		if i == 149 {
			_, err := sqlite.Backup(ctx, p.path, p.early, sqlite.BackupOptions{})
			require.NoError(t, err)
		}
	}
	clock.Advance(time.Hour + 2*time.Minute)
	open := testkit.MustReserve(t, n, testkit.ReserveReq("prune-open", "e1")) // 602
	_, err = cp.SignOnce(ctx)
	require.NoError(t, err)
	res, err := n.Prune(ctx, ledger.PruneRequest{Actor: "ops"}) // 603
	require.NoError(t, err)
	require.Equal(t, uint64(601), res.Through)
	require.NoError(t, n.DeletePruned(ctx))
	testkit.MustCommit(t, n, testkit.Succeed("prune-open", open.Reservation)) // 604
	again := testkit.MustReserve(t, n, testkit.ReserveReq("prune-007", "e2")) // 605: a key pruned whole is new
	testkit.MustCommit(t, n, testkit.Succeed("prune-007", again.Reservation)) // 606
	s, err := cp.SignOnce(ctx)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p.checkpoint, []byte(s.Note), 0o600))
	require.NoError(t, l.Close())
	return p
}

// prunedReport is what these tests read of ledgerctl verify --json.
type prunedReport struct {
	verifyReport
	UnverifiedPruned []uint64 `json:"unverified_pruned"`
	SegmentsJoined   int      `json:"segments_joined"`
	Audit            struct {
		PrunedRanges []struct {
			Seq, From, Through uint64
			Segment            string
		} `json:"pruned_ranges"`
	} `json:"audit"`
}

func verifyPruned(t *testing.T, args ...string) (prunedReport, int) {
	t.Helper()
	out, stderr, code := ledgerctl(t, append([]string{"verify", "--json", "--no-progress", "--namespace", "reports"}, args...)...)
	var rep prunedReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "stdout %q stderr %q", out, stderr)
	return rep, code
}

// TestLedgerctl_verifyPruned runs the real ledgerctl verify --db on a
// pruned SQLite file: clean from the kept hash of 601, with a signed
// checkpoint, with a --state file saved before the prune (full and
// --incremental, the pruned receipts after its pin reported
// unverified_pruned), with --segments (joined; segment_missing without
// the segment), and kept_hash_mismatch for a kept hash swapped in
// ns_kept.
func TestLedgerctl_verifyPruned(t *testing.T) {
	t.Parallel()
	p := buildPrunedSQLite(t)

	rep, code := verifyPruned(t, "--db", p.path)
	require.Equal(t, 0, code, "%+v", rep.Violations)
	assert.Equal(t, uint64(606), rep.Head.Seq)
	assert.Equal(t, uint64(5), rep.Checked, "602 … 606 rehashed")
	require.Len(t, rep.Audit.PrunedRanges, 1)
	assert.Equal(t, "reports-1-601", rep.Audit.PrunedRanges[0].Segment)

	rep, code = verifyPruned(t, "--db", p.path, "--checkpoint", p.checkpoint, "--vkey", p.vkey)
	require.Equal(t, 0, code, "%+v", rep.Violations)

	// A state file saved at seq 301, before the prune.
	for _, incremental := range []bool{false, true} {
		state := filepath.Join(t.TempDir(), "state.json")
		rep, code = verifyPruned(t, "--db", p.early, "--state", state)
		require.Equal(t, 0, code, "%+v", rep.Violations)
		require.Equal(t, uint64(301), rep.Head.Seq)
		text := filepath.Join(t.TempDir(), "state.json")
		testkit.CopyFile(t, state, text)
		extra := []string{}
		if incremental {
			extra = append(extra, "--incremental")
		}
		rep, code = verifyPruned(t, append([]string{"--db", p.path, "--state", state}, extra...)...)
		require.Equal(t, 0, code, "incremental %v: %+v", incremental, rep.Violations)
		assert.Equal(t, []uint64{302, 601}, rep.UnverifiedPruned)
		out, _, code := ledgerctl(t, append([]string{"verify", "--no-progress", "--namespace", "reports", "--db", p.path, "--state", text}, extra...)...)
		require.Equal(t, 0, code)
		assert.Contains(t, out, "pruned: receipts 302…601 after the pinned head were pruned")
		b, err := os.ReadFile(state)
		require.NoError(t, err)
		assert.Contains(t, string(b), `"seq":606`, "the state file moves to the head")
	}

	rep, code = verifyPruned(t, "--db", p.path, "--segments", p.archive, "--vkey", p.vkey)
	require.Equal(t, 0, code, "%+v", rep.Violations)
	assert.Equal(t, 1, rep.SegmentsJoined)
	rep, code = verifyPruned(t, "--db", p.path, "--segments", t.TempDir())
	assert.Equal(t, 1, code)
	assert.Equal(t, map[string]int{"segment_missing": 1}, rep.rules(), "%+v", rep.Violations)

	// A kept hash swapped (the trigger that keeps them dropped).
	swapped := filepath.Join(t.TempDir(), "swapped.db")
	testkit.CopyFile(t, p.path, swapped)
	testkit.EditLedger(t, swapped, func(db *sql.DB) {
		const ns = `(SELECT id FROM namespaces WHERE name = 'reports')`
		var hs []byte
		require.NoError(t, db.QueryRow(`SELECT hashes FROM ns_kept WHERE ns = `+ns+` AND tile = 0`).Scan(&hs))
		a := append([]byte(nil), hs[10*32:11*32]...)
		copy(hs[10*32:], hs[11*32:12*32])
		copy(hs[11*32:], a)
		_, err := db.Exec(`DROP TRIGGER ns_kept_grows`)
		require.NoError(t, err)
		_, err = db.Exec(`UPDATE ns_kept SET hashes = ? WHERE ns = `+ns+` AND tile = 0`, hs)
		require.NoError(t, err)
	})
	rep, code = verifyPruned(t, "--db", swapped)
	assert.Equal(t, 1, code)
	assert.Equal(t, map[string]int{"kept_hash_mismatch": 1}, rep.rules(), "%+v", rep.Violations)
	assert.Contains(t, rep.Violations[0].Detail, "kept tile 0")
}
