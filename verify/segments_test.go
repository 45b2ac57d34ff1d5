package verify_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/archive"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/verify"
)

// readChain returns the receipts of the default chain of the file at path.
func readChain(t *testing.T, path string) []chain.Receipt {
	t.Helper()
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	rs, _, err := rd.ListReceipts(context.Background(), ledger.ReceiptFilter{Limit: 1000})
	require.NoError(t, err)
	return rs
}

// appendPrunes appends a prune receipt for each result to the default
// chain of the file at path, linked to its head as the ledger links
// them (a forged prune: nothing is archived or deleted by it).
func appendPrunes(t *testing.T, path string, res ...chain.PruneResult) {
	t.Helper()
	rs := readChain(t, path)
	last := rs[len(rs)-1]
	testkit.EditLedger(t, path, func(db *sql.DB) {
		// Only a namespace with a key TTL prunes (prune_invalid otherwise).
		_, err := db.Exec(`DROP TRIGGER IF EXISTS ns_settings_fixed; UPDATE ns_settings SET key_ttl_ms = 86400000 WHERE ns = 0`)
		require.NoError(t, err)
		for _, p := range res {
			r := chain.Link(last.Seq, last.Hash, chain.Receipt{Kind: chain.KindPrune, Actor: "admin", Result: p.Text(), RecordedAt: last.RecordedAt + 1})
			_, err := db.Exec(`INSERT INTO receipts (seq, kind, idempotency_key, key_generated, execution_id, attempt, tool,
				effect, idempotent, input_hash, outcome, external_ref, result, error_code, error_message,
				retryable, lease_expires_at, ref_seq, actor, note, recorded_at, prev_hash, hash)
				VALUES (?, ?, '', 0, '', 0, '', '', 0, '', '', '', ?, '', '', 0, 0, 0, ?, '', ?, ?, ?)`,
				r.Seq, r.Kind, r.Result, r.Actor, r.RecordedAt, r.PrevHash[:], r.Hash[:])
			require.NoError(t, err)
			last = r
		}
	})
}

// digestOf is the digest of the segment at path, which checks alone.
func digestOf(t *testing.T, path string) string {
	t.Helper()
	got, err := archive.Check(path, nil)
	require.NoError(t, err)
	return got.Digest
}

// forged returns a copy of rs with receipt seq's note changed and the
// chain relinked from there.
func forged(rs []chain.Receipt, seq uint64) []chain.Receipt {
	out := append([]chain.Receipt(nil), rs...)
	out[seq-1].Note = "forged"
	testkit.Relink(out, seq)
	return out
}

// TestVerifier_segments: Opts.Segments joins each prune receipt's segment
// to the ledger (SPEC §16): the segments of the very receipts join; a
// range without its segment is segment_missing; a segment that does not
// check alone, of another range or digest, or whose prev_hash or receipt
// hashes are not the ledger's is segment_mismatch, on both strategies.
func TestVerifier_segments(t *testing.T) {
	base, now := buildLedger(t)
	rs := readChain(t, base)
	require.Len(t, rs, 10)
	// The segments the prune receipts at 11 and 12 (ranges 1…4, 5…8) name.
	type prunes struct{ first, second []chain.Receipt } // the receipts of each segment's digest
	cases := []struct {
		desc    string
		digests prunes
		write   func(t *testing.T, dir string) // the archive directory's segments
		want    map[uint64]string              // seq → rule
		detail  string                         // in the first violation's detail
		joined  int
	}{
		{"both segments", prunes{rs, rs}, func(t *testing.T, dir string) {
			testkit.SegmentOf(t, dir, "default", rs, 1, 4)
			testkit.SegmentOf(t, dir, "default", rs, 5, 8)
		}, nil, "", 2},
		{"no segment", prunes{rs, rs}, func(*testing.T, string) {},
			map[uint64]string{11: verify.RuleSegmentMissing, 12: verify.RuleSegmentMissing}, "for the range 1…4 that prune receipt 11 pruned", 0},
		{"the second missing", prunes{rs, rs}, func(t *testing.T, dir string) { testkit.SegmentOf(t, dir, "default", rs, 1, 4) },
			map[uint64]string{12: verify.RuleSegmentMissing}, "no segment default-5-8", 1},
		{"a receipt changed: another digest", prunes{rs, rs}, func(t *testing.T, dir string) {
			testkit.SegmentOf(t, dir, "default", forged(rs, 2), 1, 4)
			testkit.SegmentOf(t, dir, "default", rs, 5, 8)
		}, map[uint64]string{11: verify.RuleSegmentMismatch}, "is not the prune receipt's", 1},
		{"a receipt changed and the digest with it", prunes{rs, forged(rs, 6)}, func(t *testing.T, dir string) {
			testkit.SegmentOf(t, dir, "default", rs, 1, 4)
			testkit.SegmentOf(t, dir, "default", forged(rs, 6), 5, 8)
		}, map[uint64]string{12: verify.RuleSegmentMismatch}, "receipt 6 has hash", 1},
		{"the receipt before changed: prev_hash", prunes{rs, forged(rs, 4)}, func(t *testing.T, dir string) {
			testkit.SegmentOf(t, dir, "default", rs, 1, 4)
			testkit.SegmentOf(t, dir, "default", forged(rs, 4), 5, 8)
		}, map[uint64]string{12: verify.RuleSegmentMismatch}, "prev_hash", 1},
		{"a segment that does not check alone", prunes{rs, rs}, func(t *testing.T, dir string) {
			testkit.SegmentOf(t, dir, "default", rs, 1, 4)
			seg := testkit.SegmentOf(t, dir, "default", rs, 5, 8)
			require.NoError(t, os.Remove(filepath.Join(seg, archive.PayloadsFile)))
		}, map[uint64]string{12: verify.RuleSegmentMismatch}, "does not check alone", 1},
		{"a segment of another range under the name", prunes{rs, rs}, func(t *testing.T, dir string) {
			testkit.SegmentOf(t, dir, "default", rs, 5, 8)
			other := t.TempDir()
			require.NoError(t, os.Rename(testkit.SegmentOf(t, other, "default", rs, 1, 3), filepath.Join(dir, "default-1-4")))
		}, map[uint64]string{11: verify.RuleSegmentMismatch}, "receipts 1…3", 1},
		{"a file under the name", prunes{rs, rs}, func(t *testing.T, dir string) {
			testkit.SegmentOf(t, dir, "default", rs, 5, 8)
			require.NoError(t, os.WriteFile(filepath.Join(dir, "default-1-4"), nil, 0o644))
		}, map[uint64]string{11: verify.RuleSegmentMismatch}, "not a directory", 1},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			// The prune receipts carry the digests of segments written
			// aside, as the ledger would have written them.
			aside := t.TempDir()
			path := filepath.Join(t.TempDir(), "ledger.db")
			testkit.CopyFile(t, base, path)
			appendPrunes(t, path,
				chain.PruneResult{From: 1, Through: 4, Digest: digestOf(t, testkit.SegmentOf(t, aside, "default", tc.digests.first, 1, 4))},
				chain.PruneResult{From: 5, Through: 8, Digest: digestOf(t, testkit.SegmentOf(t, aside, "default", tc.digests.second, 5, 8))})
			dir := t.TempDir()
			tc.write(t, dir)
			rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
			require.NoError(t, err)
			defer rd.Close()
			opts := verify.Opts{Now: func() time.Time { return now }, Segments: &verify.Segments{Dir: dir, Namespace: "default"}}
			for name, v := range map[string]*verify.Verifier{"seq pass": verify.New(rd, opts), "key order": verify.NewKeyOrdered(rd, opts)} {
				rep, err := v.Check(context.Background())
				require.NoError(t, err, name)
				got := map[uint64]string{}
				for _, v := range rep.Violations {
					got[v.Seq] = v.Rule
				}
				if len(rep.Violations) > 0 {
					assert.Contains(t, rep.Violations[0].Detail, tc.detail, name)
				}
				if tc.want == nil {
					tc.want = map[uint64]string{}
				}
				assert.Equal(t, tc.want, got, "%s: %+v", name, rep.Violations)
				assert.Equal(t, tc.joined, rep.SegmentsJoined, name)
			}
			// Without Segments the same ledger verifies: the prune
			// receipts are well formed.
			rep, err := verify.New(rd, verify.Opts{Now: func() time.Time { return now }}).Check(context.Background())
			require.NoError(t, err)
			assert.True(t, rep.OK, "%+v", rep.Violations)
		})
	}
}

// TestVerifier_segmentsFullRun: segments are joined on a full run of a
// database only.
func TestVerifier_segmentsFullRun(t *testing.T) {
	path, _ := buildLedger(t)
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	seg := &verify.Segments{Dir: t.TempDir(), Namespace: "default"}
	_, err = verify.New(rd, verify.Opts{Incremental: true, Pinned: &verify.Pin{Seq: 1}, Segments: seg}).Check(context.Background())
	require.ErrorIs(t, err, verify.ErrSegmentsNeedFullRun)
}
