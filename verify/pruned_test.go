package verify_test

import (
	"context"
	"database/sql"
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

	"github.com/effect-ledger/effect-ledger/archive"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/tlog"
	"github.com/effect-ledger/effect-ledger/verify"
)

// prunedFile is a SQLite ledger whose namespace "reports" was pruned
// through 601 by the domain (SPEC §16), as testkit/storetest/prune.go
// makes one: the pins taken before the prune, the file before the
// deletion of the bodies, and the archive directory.
type prunedFile struct {
	path, beforeDelete, archive string
	now                         time.Time
	pin300, pin602              verify.Pin
	vkey                        string
	before, after               []byte // the checkpoints at 602 (before the prune) and 606
}

// buildPruned makes a prunedFile: 300 finished keys (2 … 601), an open
// one (602), a checkpoint, the prune (603), the deletion, then a commit,
// a key pruned whole reserved anew and committed (604 … 606) and a
// checkpoint over the kept hashes.
func buildPruned(t *testing.T) *prunedFile {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	pf := &prunedFile{path: filepath.Join(dir, "ledger.db"), beforeDelete: filepath.Join(dir, "before.db"),
		archive: filepath.Join(dir, "archive")}
	require.NoError(t, os.Mkdir(pf.archive, 0o700))
	clock := testkit.NewClock()
	st, err := sqlite.OpenStore(ctx, pf.path, sqlite.Options{Now: clock.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, false)
	require.NoError(t, err)
	l := ledger.New(st, ledger.Config{Now: clock.Now, ArchiveDir: pf.archive})
	require.NoError(t, l.CreateNamespace(ctx, "reports", ledger.NamespaceSettings{KeyTTL: uint64(time.Hour.Milliseconds())}))
	n, err := l.NS(ctx, "reports")
	require.NoError(t, err)
	_, err = n.SetPolicy(ctx, []byte(`{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`), "ops") // 1
	require.NoError(t, err)
	skey, vkey, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	signer, err := note.NewSigner(skey)
	require.NoError(t, err)
	cp := &tlog.Checkpointer{Store: n, Signer: signer, Origin: "ex.test/reports"}
	for i := range 300 {
		key := fmt.Sprintf("prune-%03d", i)
		r := testkit.MustReserve(t, n, testkit.ReserveReq(key, "e1"))
		testkit.MustCommit(t, n, testkit.Succeed(key, r.Reservation))
	}
	clock.Advance(time.Hour + 2*time.Minute)
	open := testkit.MustReserve(t, n, testkit.ReserveReq("prune-open", "e1")) // 602
	before, err := cp.SignOnce(ctx)
	require.NoError(t, err)
	pf.vkey, pf.before = vkey, []byte(before.Note)
	for _, p := range []struct {
		pin *verify.Pin
		seq uint64
	}{{&pf.pin300, 300}, {&pf.pin602, 602}} {
		r, err := n.GetReceipt(ctx, p.seq)
		require.NoError(t, err)
		*p.pin = verify.Pin{Seq: p.seq, Hash: r.Hash.String()}
	}
	res, err := n.Prune(ctx, ledger.PruneRequest{Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, uint64(601), res.Through)
	_, err = sqlite.Backup(ctx, pf.path, pf.beforeDelete, sqlite.BackupOptions{})
	require.NoError(t, err)
	require.NoError(t, n.DeletePruned(ctx))
	testkit.MustCommit(t, n, testkit.Succeed("prune-open", open.Reservation)) // 604
	again := testkit.MustReserve(t, n, testkit.ReserveReq("prune-007", "e2")) // 605
	testkit.MustCommit(t, n, testkit.Succeed("prune-007", again.Reservation)) // 606
	after, err := cp.SignOnce(ctx)
	require.NoError(t, err)
	pf.after = []byte(after.Note)
	require.NoError(t, l.Close())
	pf.now = clock.Now()
	return pf
}

// checkPruned verifies namespace reports of path with opts, in both
// strategies of a full run (or the incremental one), and requires both to
// report alike.
func checkPruned(t *testing.T, path string, opts verify.Opts) *verify.Report {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.OpenStore(ctx, path, sqlite.Options{}, true)
	require.NoError(t, err)
	defer st.Close()
	c, err := st.Chain(ctx, "reports")
	require.NoError(t, err)
	rep, err := verify.New(c, opts).Check(ctx)
	require.NoError(t, err)
	byKey, err := verify.NewKeyOrdered(c, opts).Check(ctx)
	require.NoError(t, err)
	assert.Equal(t, rules(rep), rules(byKey), "the two strategies: %+v / %+v", rep.Violations, byKey.Violations)
	assert.Equal(t, rep.UnverifiedPruned, byKey.UnverifiedPruned)
	return rep
}

// TestVerifier_pruned: a ledger whose bodies ≤ 601 are deleted verifies
// clean, before and after the deletion, from the kept hash of 601; a pin
// taken before the prune still verifies, and the pruned receipts after it
// are reported unverified unless the segment is joined; --incremental
// works across the prune.
func TestVerifier_pruned(t *testing.T) {
	pf := buildPruned(t)
	now := func() time.Time { return pf.now }
	for _, path := range []string{pf.beforeDelete, pf.path} {
		rep := checkPruned(t, path, verify.Opts{Now: now})
		require.True(t, rep.OK, "%s: %+v", path, rep.Violations)
		require.Len(t, rep.Audit.PrunedRanges, 1)
		assert.Equal(t, uint64(1), rep.Audit.PrunedRanges[0].From)
		assert.Equal(t, uint64(601), rep.Audit.PrunedRanges[0].Through)
		assert.Equal(t, "reports-1-601", rep.Audit.PrunedRanges[0].Segment)
		assert.Empty(t, rep.Audit.Failed)
	}
	after := checkPruned(t, pf.path, verify.Opts{Now: now})
	assert.Equal(t, uint64(606), after.Head.Seq)
	assert.Equal(t, uint64(606), after.Receipts)
	assert.Equal(t, uint64(5), after.Checked, "602 … 606 rehashed")

	// docs/auditing.md's recipe: the first live receipt's prev_hash is
	// the kept hash of K.
	db, err := sql.Open("sqlite3", "file:"+pf.path+"?mode=ro")
	require.NoError(t, err)
	defer db.Close()
	const ns = `(SELECT id FROM namespaces WHERE name = 'reports')`
	var k uint64
	var kept, prev string
	require.NoError(t, db.QueryRow(`SELECT max(deleted_through) FROM ns_prunes WHERE ns = `+ns).Scan(&k))
	require.Equal(t, uint64(601), k)
	require.NoError(t, db.QueryRow(fmt.Sprintf(`SELECT hex(substr(hashes, ((%d - 1) %% 256) * 32 + 1, 32)) FROM ns_kept
		WHERE ns = %s AND tile = (%d - 1) / 256`, k, ns, k)).Scan(&kept))
	require.NoError(t, db.QueryRow(`SELECT hex(prev_hash) FROM ns_receipts WHERE ns = `+ns+` ORDER BY seq LIMIT 1`).Scan(&prev))
	require.Equal(t, prev, kept)

	// Pins taken before the prune.
	for _, tc := range []struct {
		desc string
		opts verify.Opts
		want []uint64
	}{
		{"state below P, full", verify.Opts{Pinned: &pf.pin300}, []uint64{301, 601}},
		{"state below P, incremental", verify.Opts{Pinned: &pf.pin300, Incremental: true}, []uint64{301, 601}},
		{"expect-head below P", verify.Opts{ExpectHead: &pf.pin300}, []uint64{301, 601}},
		{"state above P, incremental", verify.Opts{Pinned: &pf.pin602, Incremental: true}, nil},
		{"state below P, segments joined", verify.Opts{Pinned: &pf.pin300,
			Segments: &verify.Segments{Dir: pf.archive, Namespace: "reports"}}, nil},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			tc.opts.Now = now
			for path, head := range map[string]uint64{pf.path: 606, pf.beforeDelete: 603} {
				rep := checkPruned(t, path, tc.opts)
				require.True(t, rep.OK, "%s: %+v", path, rep.Violations)
				assert.Equal(t, tc.want, rep.UnverifiedPruned, path)
				assert.Equal(t, head, rep.Head.Seq)
				if tc.opts.Incremental && path == pf.path {
					assert.Less(t, rep.Checked, uint64(10), "an incremental run rehashes the new receipts only")
				}
			}
		})
	}
	bad := verify.Pin{Seq: 300, Hash: pf.pin602.Hash}
	for _, opts := range []verify.Opts{{ExpectHead: &bad}, {Pinned: &bad}} {
		opts.Now = now
		rep := checkPruned(t, pf.path, opts)
		assert.Equal(t, []string{verify.RuleHeadMismatch}, rules(rep), "%+v", rep.Violations)
	}
	rep := checkPruned(t, pf.path, verify.Opts{Now: now, Pinned: &bad, Incremental: true})
	assert.Equal(t, []string{verify.RuleHeadMismatch}, rules(rep), "a pin whose kept hash differs: a full run, %+v", rep.Violations)

	// --segments: joined, or missing.
	live := checkPruned(t, pf.path, verify.Opts{Now: now})
	rep = checkPruned(t, pf.path, verify.Opts{Now: now, Segments: &verify.Segments{Dir: pf.archive, Namespace: "reports"}})
	require.True(t, rep.OK, "%+v", rep.Violations)
	assert.Equal(t, 1, rep.SegmentsJoined)
	// Joined, the audit covers the pruned receipts too: the 300 keys of
	// one call are duplicate effects of the two live ones, and the key
	// pruned whole and reserved anew is a renewal of its first generation.
	require.Len(t, live.Audit.DuplicateEffects, 1)
	assert.Len(t, live.Audit.DuplicateEffects[0].Keys, 2)
	require.Len(t, rep.Audit.DuplicateEffects, 1)
	assert.Len(t, rep.Audit.DuplicateEffects[0].Keys, 301, "prune-007 once")
	assert.Empty(t, live.Audit.RenewedKeys)
	require.Len(t, rep.Audit.RenewedKeys, 1)
	assert.Equal(t, "prune-007", rep.Audit.RenewedKeys[0].Key)
	assert.Equal(t, live.Audit.PrunedRanges, rep.Audit.PrunedRanges)
	rep = checkPruned(t, pf.path, verify.Opts{Now: now, Segments: &verify.Segments{Dir: t.TempDir(), Namespace: "reports"}})
	assert.Equal(t, []string{verify.RuleSegmentMissing}, rules(rep), "%+v", rep.Violations)
}

// TestVerifier_prunedTampered: a kept hash swapped in ns_kept is
// kept_hash_mismatch naming its tile; a prune row without its receipt is
// prune_invalid; a checkpoint check reads the kept hashes.
func TestVerifier_prunedTampered(t *testing.T) {
	pf := buildPruned(t)
	now := func() time.Time { return pf.now }
	edit := func(sqls ...string) string {
		path := filepath.Join(t.TempDir(), "tampered.db")
		testkit.CopyFile(t, pf.path, path)
		testkit.EditLedger(t, path, func(db *sql.DB) {
			for _, q := range sqls {
				_, err := db.Exec(q)
				require.NoError(t, err, q)
			}
		})
		return path
	}
	const reports = `(SELECT id FROM namespaces WHERE name = 'reports')`
	// swap is the SQL that swaps leaves i and j of kept tile tile (j < 0:
	// replaces leaf i with other bytes).
	swap := func(tile, i, j int) string {
		db, err := sql.Open("sqlite3", "file:"+pf.path+"?mode=ro")
		require.NoError(t, err)
		defer db.Close()
		var hs []byte
		require.NoError(t, db.QueryRow(`SELECT hashes FROM ns_kept WHERE ns = `+reports+` AND tile = ?`, tile).Scan(&hs))
		if j < 0 {
			hs[i*32] ^= 1
		} else {
			a := append([]byte(nil), hs[i*32:i*32+32]...)
			copy(hs[i*32:], hs[j*32:j*32+32])
			copy(hs[j*32:], a)
		}
		return fmt.Sprintf(`UPDATE ns_kept SET hashes = x'%x' WHERE ns = %s AND tile = %d`, hs, reports, tile)
	}
	for _, tc := range []struct {
		desc   string
		sqls   []string
		want   []string
		detail string
	}{
		{"two kept hashes swapped in tile 1", []string{`DROP TRIGGER ns_kept_grows`, swap(1, 32, 33)},
			[]string{verify.RuleKeptHashMismatch}, "kept tile 1 (receipts 257…512)"},
		{"a kept hash replaced in the last, partial tile", []string{`DROP TRIGGER ns_kept_grows`, swap(2, 32, -1)},
			[]string{verify.RuleKeptHashMismatch}, "the stored checkpoint of size 602"},
		{"a prune row without its receipt", []string{
			`INSERT INTO ns_prunes VALUES (` + reports + `, 605, 602, 602, 'sha256:` + fmt.Sprintf("%064x", 0) + `', 'reports-602-602', 601)`},
			[]string{verify.RulePruneInvalid}, "not a prune receipt of the chain"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			rep := checkPruned(t, edit(tc.sqls...), verify.Opts{Now: now})
			assert.Equal(t, tc.want, rules(rep), "%+v", rep.Violations)
			if len(rep.Violations) > 0 {
				assert.Contains(t, rep.Violations[0].Detail, tc.detail)
			}
		})
	}
}

// TestCheckpointCheck_pruned: a signed checkpoint is checked against the
// tree of the kept hashes and the live ones; a kept hash swapped changes
// the roots.
func TestCheckpointCheck_pruned(t *testing.T) {
	pf := buildPruned(t)
	ctx := context.Background()
	v, err := tlog.NewVerifier(pf.vkey)
	require.NoError(t, err)
	check := func(path string) *verify.CheckpointResult {
		st, err := sqlite.OpenStore(ctx, path, sqlite.Options{}, true)
		require.NoError(t, err)
		defer st.Close()
		c, err := st.Chain(ctx, "reports")
		require.NoError(t, err)
		cc := &verify.CheckpointCheck{Note: pf.after, Previous: pf.before, Verifier: v, Namespace: "reports", Pruned: c}
		res, err := cc.Check(ctx, c)
		require.NoError(t, err)
		return res
	}
	res := check(pf.path)
	assert.Empty(t, res.Violations)
	assert.Equal(t, int64(606), res.Checkpoint.Size)

	path := filepath.Join(t.TempDir(), "tampered.db")
	testkit.CopyFile(t, pf.path, path)
	testkit.EditLedger(t, path, func(db *sql.DB) {
		var hs []byte
		require.NoError(t, db.QueryRow(`SELECT hashes FROM ns_kept WHERE tile = 0`).Scan(&hs))
		hs[5*32] ^= 1
		_, err := db.Exec(`DROP TRIGGER ns_kept_grows`)
		require.NoError(t, err)
		_, err = db.Exec(`UPDATE ns_kept SET hashes = ? WHERE tile = 0`, hs)
		require.NoError(t, err)
	})
	res = check(path)
	require.Len(t, res.Violations, 2, "%+v", res.Violations)
	assert.Equal(t, verify.RuleCheckpointMismatch, res.Violations[0].Rule)
}

// forgePrune appends to a copy of pf's file a prune receipt forged over
// receipts 602 … 604 (carrying policy), copies their hashes into the kept
// tiles and deletes their rows (the delete trigger lets a covered, kept
// row go). With segment, their segment is written first into a copy of
// the archive directory, and the forged receipt carries its digest. It
// returns the file and the archive directory.
func forgePrune(t *testing.T, pf *prunedFile, policy *chain.PrunePolicy, segment bool) (string, string) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	path, arch := filepath.Join(dir, "forged.db"), filepath.Join(dir, "archive")
	testkit.CopyFile(t, pf.path, path)
	require.NoError(t, os.CopyFS(arch, os.DirFS(pf.archive)))
	st, err := sqlite.OpenStore(ctx, path, sqlite.Options{}, true)
	require.NoError(t, err)
	c, err := st.Chain(ctx, "reports")
	require.NoError(t, err)
	real, err := c.GetReceipt(ctx, 603)
	require.NoError(t, err)
	head, err := c.GetReceipt(ctx, 606)
	require.NoError(t, err)
	res, err := chain.ParsePruneResult(real.Result)
	require.NoError(t, err)
	hidden, err := c.ReceiptHashes(ctx, 601, 3)
	require.NoError(t, err)
	if segment {
		seg, err := ledger.Log{ChainReader: ledger.KeptChain(c), Payloads: c}.WriteSegment(ctx, "reports", arch, 602, 604, nil)
		require.NoError(t, err)
		checked, err := archive.Check(seg, nil)
		require.NoError(t, err)
		res.Digest = checked.Digest
	}
	require.NoError(t, st.Close())
	forged := *real
	forged.Seq, forged.RecordedAt = 607, head.RecordedAt
	res.From, res.Through = 602, 604
	if policy != nil {
		res.Policy = *policy
	}
	forged.Result = res.Text()
	forged.PrevHash = head.Hash
	forged.Hash = forged.ComputeHash(head.Hash)

	const ns = `(SELECT id FROM namespaces WHERE name = 'reports')`
	testkit.EditLedger(t, path, func(db *sql.DB) {
		var kept []byte
		require.NoError(t, db.QueryRow(`SELECT hashes FROM ns_kept WHERE ns = `+ns+` AND tile = 2`).Scan(&kept))
		for _, h := range hidden {
			kept = append(kept, h[:]...)
		}
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{`INSERT INTO ns_receipts SELECT ns, 607, kind, idempotency_key, key_generated, execution_id, attempt, tool, effect,
				idempotent, input_hash, outcome, external_ref, ?, error_code, error_message, retryable, lease_expires_at, ref_seq,
				actor, note, ?, ?, ? FROM ns_receipts WHERE ns = ` + ns + ` AND seq = 603`,
				[]any{forged.Result, forged.RecordedAt, forged.PrevHash[:], forged.Hash[:]}},
			{`UPDATE ns_kept SET hashes = ? WHERE ns = ` + ns + ` AND tile = 2`, []any{kept}},
			{`INSERT INTO ns_prunes VALUES (` + ns + `, 607, 602, 604, ?, 'reports-602-604', 604)`, []any{res.Digest}},
			{`DELETE FROM ns_receipts WHERE ns = ` + ns + ` AND seq BETWEEN 602 AND 604`, nil},
		} {
			_, err := db.Exec(q.sql, q.args...)
			require.NoError(t, err, q.sql)
		}
	})
	return path, arch
}

// TestVerifier_forgedPrune: a prune receipt forged after the head over
// receipts 602 … 604 hides them from every check but the segments':
// --segments finds no segment for the range (segment_missing). With a
// segment of the range, the pass joined from seq 1 checks the policy the
// prune carries against the one in force after its range.
func TestVerifier_forgedPrune(t *testing.T) {
	pf := buildPruned(t)
	now := func() time.Time { return pf.now }
	path, arch := forgePrune(t, pf, nil, false)
	rep := checkPruned(t, path, verify.Opts{Now: now})
	require.True(t, rep.OK, "only the segments tell: %+v", rep.Violations)
	assert.Equal(t, uint64(607), rep.Head.Seq)
	rep = checkPruned(t, path, verify.Opts{Now: now, Segments: &verify.Segments{Dir: arch, Namespace: "reports"}})
	assert.Equal(t, []string{verify.RuleSegmentMissing}, rules(rep), "%+v", rep.Violations)
	assert.Equal(t, uint64(607), rep.Violations[0].Seq)
	assert.Equal(t, 1, rep.SegmentsJoined, "the real prune's segment joins")

	path, arch = forgePrune(t, pf, nil, true)
	rep = checkPruned(t, path, verify.Opts{Now: now, Segments: &verify.Segments{Dir: arch, Namespace: "reports"}})
	require.True(t, rep.OK, "a prune with its segment: %+v", rep.Violations)
	assert.Equal(t, 2, rep.SegmentsJoined)
	path, arch = forgePrune(t, pf, &chain.PrunePolicy{}, true)
	rep = checkPruned(t, path, verify.Opts{Now: now})
	require.True(t, rep.OK, "the policy in force after 604 is pruned: %+v", rep.Violations)
	rep = checkPruned(t, path, verify.Opts{Now: now, Segments: &verify.Segments{Dir: arch, Namespace: "reports"}})
	assert.Equal(t, []string{verify.RulePruneInvalid}, rules(rep), "%+v", rep.Violations)
	assert.Contains(t, rep.Violations[0].Detail, "the policy in force after its range (602…604) is receipt 1's")
}
