package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/archive"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/testkit"
)

// exportChain reads the default chain of the stopped ledger db with
// ledgerctl export.
func exportChain(t *testing.T, db string) []chain.Receipt {
	t.Helper()
	out, stderr, code := ledgerctl(t, "export", "--db", db)
	require.Equal(t, 0, code, stderr)
	var rs []chain.Receipt
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r chain.Receipt
		require.NoError(t, json.Unmarshal([]byte(line), &r))
		rs = append(rs, r)
	}
	return rs
}

// forgePrune appends to the default chain of the stopped ledger db a
// prune receipt (SPEC §16) with result res, linked to the head and the
// head moved onto it, the way someone with write access to the database
// would forge one: nothing is archived or deleted by it. It returns the
// receipt's seq.
func forgePrune(t *testing.T, db string, res chain.PruneResult) uint64 {
	t.Helper()
	rs := exportChain(t, db)
	last := rs[len(rs)-1]
	r := chain.Link(last.Seq, last.Hash, chain.Receipt{Kind: chain.KindPrune, Actor: "admin", Result: res.Text(), RecordedAt: last.RecordedAt + 1})
	const cols = `seq, kind, idempotency_key, key_generated, execution_id, attempt, tool, effect, idempotent, input_hash,
		outcome, external_ref, result, error_code, error_message, retryable, lease_expires_at, ref_seq, actor, note,
		recorded_at, prev_hash, hash`
	if strings.HasPrefix(db, "postgres") {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, db)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `INSERT INTO receipts (namespace, `+cols+`) VALUES ('default', $1, $2, '', false, '', 0, '', '', false, '',
			'', '', $3, '', '', false, 0, 0, $4, '', $5, $6, $7)`,
			int64(r.Seq), r.Kind, r.Result, r.Actor, int64(r.RecordedAt), r.PrevHash[:], r.Hash[:])
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `UPDATE head SET seq = $1, hash = $2, recorded_at = $3 WHERE namespace = 'default'`, int64(r.Seq), r.Hash[:], int64(r.RecordedAt))
		require.NoError(t, err)
		return r.Seq
	}
	sdb, err := sql.Open("sqlite3", "file:"+db)
	require.NoError(t, err)
	defer sdb.Close()
	// The link trigger checks seq and prev_hash, and moves the head.
	_, err = sdb.Exec(`INSERT INTO ns_receipts (ns, `+cols+`) VALUES (0, ?, ?, '', 0, '', 0, '', '', 0, '',
		'', '', ?, '', '', 0, 0, 0, ?, '', ?, ?, ?)`,
		r.Seq, r.Kind, r.Result, r.Actor, r.RecordedAt, r.PrevHash[:], r.Hash[:])
	require.NoError(t, err)
	return r.Seq
}

// TestLedgerctl_verifySegments: ledgerctl verify --segments joins the
// archived segments to the ledger through the real binaries (SPEC §16).
// A segment written by ledgerctl archive joins its prune receipt (here a
// forged one: the prune itself is not built yet); a pruned range without
// its segment is segment_missing; a segment of other receipts with another
// digest, or one whose receipt was changed and the chain re-hashed with
// the digest forged along (it checks alone), is segment_mismatch.
func TestLedgerctl_verifySegments(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, func(t *testing.T, db string) {
		dir := t.TempDir()
		key := newRotationKey(t, dir, "log.key", "ex.test")
		// The chain is edited: the namespace keeps its payloads inline;
		// it has a key TTL, as a namespace that prunes must.
		l := StartLedgerd(t, db, "--signing-key", key.file, "--log-origin", "ex.test", "--checkpoint-interval", "20ms",
			"--default-payloads", "inline", "--default-key-ttl", "24h")
		for i := range 10 {
			k := "segs-key-" + string(rune('a'+i))
			tok := l.Reserve(t, `{"idempotency_key":"`+k+`","execution_id":"e","tool":"mail.send","effect":"write"}`)
			l.Commit(t, k, `{"reservation":"`+tok+`","outcome":"succeeded","result":{"n":`+string(rune('0'+i))+`}}`)
		}
		waitCheckpoint(t, l, key.vkey, 20)
		archiveDir := filepath.Join(dir, "archive")
		require.NoError(t, os.Mkdir(archiveDir, 0o755))
		out, stderr, code := ledgerctl(t, "archive", "--db", db, "--through", "12", "--dir", archiveDir, "--vkey", key.vkeyFile)
		require.Equal(t, 0, code, stderr)
		seg := filepath.Join(archiveDir, "default-1-12")
		require.Contains(t, out, seg)
		require.NoError(t, l.Stop())
		archived, err := archive.Check(seg, nil)
		require.NoError(t, err)

		// No prune receipt: nothing to join.
		rep, code := verifyJSON(t, "--db", db, "--segments", archiveDir)
		require.Equal(t, 0, code, "%+v", rep.Violations)

		rs := exportChain(t, db)
		require.Len(t, rs, 20)
		pruneSeq := forgePrune(t, db, chain.PruneResult{From: 1, Through: 12, Digest: archived.Digest})
		require.Equal(t, uint64(21), pruneSeq)

		out, stderr, code = ledgerctl(t, "verify", "--db", db, "--segments", archiveDir, "--vkey", key.vkeyFile)
		require.Equal(t, 0, code, "%s%s", out, stderr)
		assert.Contains(t, out, "segments: 1 segment joined to the ledger")
		rep, code = verifyJSON(t, "--db", db, "--segments", archiveDir)
		require.Equal(t, 0, code, "%+v", rep.Violations)

		// No segment for the pruned range.
		empty := t.TempDir()
		rep, code = verifyJSON(t, "--db", db, "--segments", empty)
		require.Equal(t, 1, code)
		require.Equal(t, map[string]int{"segment_missing": 1}, rep.rules(), "%+v", rep.Violations)
		assert.Equal(t, pruneSeq, rep.Violations[0].Seq)
		assert.Contains(t, rep.Violations[0].Detail, "default-1-12")
		assert.Contains(t, rep.Violations[0].Detail, "1…12 that prune receipt 21")
		out, _, code = ledgerctl(t, "verify", "--db", db, "--segments", empty)
		require.Equal(t, 1, code)
		assert.Contains(t, out, "segment_missing")

		// A segment of other receipts under the name: another digest.
		other := t.TempDir()
		changed := append([]chain.Receipt(nil), rs...)
		changed[4].Note = "forged"
		testkit.Relink(changed, 5)
		testkit.SegmentOf(t, other, "default", changed, 1, 12)
		rep, code = verifyJSON(t, "--db", db, "--segments", other)
		require.Equal(t, 1, code)
		require.Equal(t, map[string]int{"segment_mismatch": 1}, rep.rules(), "%+v", rep.Violations)
		assert.Contains(t, rep.Violations[0].Detail, "is not the prune receipt's "+archived.Digest)

		// A second prune receipt whose digest is that of a segment with
		// receipt 15 changed and the chain re-hashed: the segment checks
		// alone, its hashes are not the ledger's.
		changed = append([]chain.Receipt(nil), rs...)
		changed[14].Note = "forged"
		testkit.Relink(changed, 15)
		forgedSeg := testkit.SegmentOf(t, archiveDir, "default", changed, 13, 20)
		_, stderr, code = ledgerctl(t, "verify", "--segment", forgedSeg)
		require.Equal(t, 0, code, "it checks alone: %s", stderr)
		forged, err := archive.Check(forgedSeg, nil)
		require.NoError(t, err)
		second := forgePrune(t, db, chain.PruneResult{From: 13, Through: 20, Digest: forged.Digest})
		rep, code = verifyJSON(t, "--db", db, "--segments", archiveDir)
		require.Equal(t, 1, code)
		require.Equal(t, map[string]int{"segment_mismatch": 1}, rep.rules(), "%+v", rep.Violations)
		assert.Equal(t, second, rep.Violations[0].Seq)
		assert.Contains(t, rep.Violations[0].Detail, "receipt 15 has hash "+changed[14].Hash.String()+", the ledger keeps "+rs[14].Hash.String())
		// Without --segments the forged prunes are well formed.
		rep, code = verifyJSON(t, "--db", db)
		require.Equal(t, 0, code, "%+v", rep.Violations)
	})
}

// TestLedgerctl_verifySegmentsUsage: --segments joins segments to a
// database on a full run of one namespace; anything else is a usage
// error (exit 2).
func TestLedgerctl_verifySegmentsUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--segments", dir}, "--segments needs --db"},
		{[]string{"--segments", dir, "--server", "http://127.0.0.1:1"}, "leave out --server"},
		{[]string{"--segments", dir, "--db", db, "--all-namespaces"}, "leave out --all-namespaces"},
		{[]string{"--segments", dir, "--db", db, "--state", filepath.Join(dir, "s.json"), "--incremental"}, "leave out --incremental"},
		{[]string{"--segments", dir, "--segment", dir}, "leave out --segments"},
	} {
		_, stderr, code := ledgerctlEnv(t, []string{"LEDGERCTL_SERVER="}, append([]string{"verify"}, tc.args...)...)
		assert.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		assert.Contains(t, stderr, tc.want, tc.args)
	}
}
