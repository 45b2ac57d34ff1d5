package verify_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/verify"
)

// pruneSQL inserts a prune receipt of from…through at seq (SPEC §16).
func pruneSQL(seq, from, through uint64) string {
	return fmt.Sprintf(`INSERT INTO receipts SELECT %d, 'prune', '', 0, '', 0, '', '', 0, '', '', '', `+
		`'{"digest":"sha256:%064x","from":%d,"policy":{"seq":0,"text":""},"through":%d}', '', '', 0, 0, 0, 'admin', '', `+
		`(SELECT max(recorded_at) FROM receipts), randomblob(32), randomblob(32) FROM receipts WHERE seq = 10`, seq, 0xab, from, through)
}

// TestVerifier_pruneIncremental: an incremental run pinned after a prune
// learns the pruned range from the trusted prefix: a later prune that
// follows it is clean, a later receipt naming a pruned one is
// pruned_reference, as in a full run.
func TestVerifier_pruneIncremental(t *testing.T) {
	base, now := buildLedger(t)
	ttl := []string{`DROP TRIGGER ns_settings_fixed`, `UPDATE ns_settings SET key_ttl_ms = 86400000 WHERE ns = 0`}
	replay := `INSERT INTO receipts SELECT 13, kind, idempotency_key, key_generated, execution_id, attempt, tool, effect,
		idempotent, input_hash, outcome, external_ref, result, error_code, error_message, retryable, lease_expires_at,
		ref_seq, actor, note, (SELECT max(recorded_at) FROM receipts), randomblob(32), randomblob(32) FROM receipts WHERE seq = 3`
	for _, tc := range []struct {
		desc  string
		steps []string
		want  []string
	}{
		{"a second prune following the first", []string{pruneSQL(11, 1, 2), pruneSQL(12, 3, 3)}, nil},
		{"a second prune leaving a gap", []string{pruneSQL(11, 1, 2), pruneSQL(12, 4, 4)}, []string{verify.RulePruneInvalid}},
		{"a replay naming a pruned commit", []string{pruneSQL(11, 1, 2), pruneSQL(12, 3, 3), replay}, []string{verify.RulePrunedReference}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			path := tamperedCopy(t, base, ttl, tc.steps, 11)
			rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
			require.NoError(t, err)
			defer rd.Close()
			opts := verify.Opts{Now: func() time.Time { return now }}
			full, err := verify.New(rd, opts).Check(context.Background())
			require.NoError(t, err)
			assert.ElementsMatch(t, tc.want, rules(full), "full: %+v", full.Violations)
			pin, err := rd.GetReceipt(context.Background(), 11)
			require.NoError(t, err)
			opts.Incremental, opts.Pinned = true, &verify.Pin{Seq: 11, Hash: pin.Hash.String()}
			inc, err := verify.New(rd, opts).Check(context.Background())
			require.NoError(t, err)
			assert.ElementsMatch(t, tc.want, rules(inc), "incremental: %+v", inc.Violations)
			if tc.want == nil { // the audit lists the prunes checked, with their ranges
				digest := fmt.Sprintf("sha256:%064x", 0xab)
				require.Len(t, full.Audit.PrunedRanges, 2)
				assert.Equal(t, verify.PrunedRange{Seq: 12, Actor: "admin", RecordedAt: full.Audit.PrunedRanges[1].RecordedAt,
					From: 3, Through: 3, Digest: digest}, full.Audit.PrunedRanges[1])
				assert.Equal(t, []verify.PrunedRange{full.Audit.PrunedRanges[1]}, inc.Audit.PrunedRanges, "after the pin only")
			}
		})
	}
}
