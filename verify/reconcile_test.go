package verify_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/verify"
)

// lateRerun is a ledger where the original call's commit of a reserve
// reconciled not_applied lands after the key's rerun (SPEC §15).
type lateRerun struct {
	c                   *calls
	reserveSeq          uint64 // the reconciled reserve
	reconcileSeq        uint64
	rerunSeq, rerunDone uint64 // the rerun's reserve and commit
	lateSeq             uint64 // the original call's late commit
	pin                 verify.Pin
}

// newLateRerun records, through the ledger: a few keys that succeed (so
// that the spilled single pass has levels), an interrupted charge
// reconciled not_applied, its rerun reserved and committed, and then the
// original call's commit with the old token. With renew, the key
// outlives its lifetime between the reconcile and the rerun, which then
// starts a new generation (SPEC §12).
func newLateRerun(t *testing.T, renew bool) *lateRerun {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	store := sqlite.Options{}
	if renew {
		store.KeyTTL = uint64(time.Hour / time.Millisecond)
	}
	db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithStore(store))
	c := &calls{t: t, path: path, db: db, clock: db.Clock, tokens: map[string]string{}}
	_, err := db.SetPolicy(ctx, json.RawMessage(`{"rules":[{"tool":"payments.*","reconcile":{"allow":true,"settle_ms":0}}]}`), "ops")
	require.NoError(t, err)
	for i := range 6 {
		key := fmt.Sprintf("key-%04d", i)
		c.reserve(key, "exec-"+key, "payments.refund", i, idempotent())
		c.succeed(key)
	}
	l := &lateRerun{c: c}
	const key = "pay-key-0001"
	c.reserve(key, "exec-1", "payments.charge", 100, lease(10))
	original := c.tokens[key]
	l.reserveSeq = db.Head().Seq
	c.clock.Advance(time.Second)
	rec, err := db.Reconcile(ctx, ledger.ReconcileRequest{IdempotencyKey: key, Outcome: "not_applied",
		Error: &ledger.FailureDetail{Code: "NOT_FOUND"}, Evidence: json.RawMessage(`{"lookup":"payments.find_charge","answer":{"applied":false}}`)})
	require.NoError(t, err)
	l.reconcileSeq = rec.Receipt.Seq
	if renew {
		c.clock.Advance(2 * time.Hour)
	}
	c.reserve(key, "exec-2", "payments.charge", 100)
	l.rerunSeq = db.Head().Seq
	c.succeed(key)
	l.rerunDone = db.Head().Seq
	h := db.Head()
	l.pin = verify.Pin{Seq: h.Seq, Hash: h.Hash.String()}
	c.clock.Advance(time.Second)
	res := ledgertest.MustCommit(t, db, ledger.CommitRequest{IdempotencyKey: key, Reservation: original,
		Outcome: "succeeded", ExternalRef: "ch_orig"})
	require.NotNil(t, res.ReconciledEarlier, "appended as the original call's late commit")
	assert.Equal(t, l.reconcileSeq, res.ReconciledEarlier.Seq)
	l.lateSeq = res.Receipt.Seq
	return l
}

// TestVerifier_lateCommitAfterRerun: the original call's commit of a
// reserve reconciled not_applied, landing after the key's rerun reserved
// and committed, is a late commit (SPEC §15) however the ledger is read:
// the key-ordered passes, the single pass in memory and spilled,
// incremental from a head pinned before it, and a server. None reports a
// violation, and each lists it as contradicted. The same after the key
// outlived its lifetime and the rerun started a new generation.
func TestVerifier_lateCommitAfterRerun(t *testing.T) {
	for _, renew := range []bool{false, true} {
		t.Run(fmt.Sprintf("renew=%t", renew), func(t *testing.T) {
			l := newLateRerun(t, renew)
			ctx := context.Background()
			opts := verify.Opts{Now: l.c.clock.Now}
			want := verify.ReconcileContradiction{Key: "pay-key-0001", Tool: "payments.charge", ReconcileSeq: l.reconcileSeq,
				ReconciledOutcome: "not_applied", CommitSeq: l.lateSeq, Outcome: "succeeded", ExternalRef: "ch_orig"}
			check := func(how string, rep *verify.Report) {
				t.Helper()
				require.True(t, rep.OK, "%s: %+v", how, rep.Violations)
				require.Len(t, rep.Audit.ReconcileContradicted, 1, how)
				got := rep.Audit.ReconcileContradicted[0]
				got.RecordedAt = 0
				assert.Equal(t, want, got, how)
			}
			check("three ways", threeWays(t, l.c.path, opts))

			rd, err := sqlite.OpenReader(ctx, l.c.path, sqlite.Options{})
			require.NoError(t, err)
			defer rd.Close()
			inc := opts
			inc.Pinned, inc.Incremental = &l.pin, true
			rep, err := verify.New(rd, inc).Check(ctx)
			require.NoError(t, err)
			check("incremental", rep)

			srv := httptest.NewServer(api.NewServer(l.c.db.Ledger, api.Config{Logger: quiet}))
			defer srv.Close()
			rep, err = verify.NewRemote(server(t, srv.URL), opts).Check(ctx)
			require.NoError(t, err)
			check("online", rep)
		})
	}
}

// TestVerifier_lateCommitAfterRerunTampered: edits of that ledger that
// make the late commit anything but the original call's are reported,
// in every way of reading it: a commit naming a reserve that was never
// reconciled (the reconcile turned into a resolve, or the name moved to
// another key's reserve or to the reconcile itself), another execution,
// another fingerprint, and the late commit twice.
func TestVerifier_lateCommitAfterRerunTampered(t *testing.T) {
	l := newLateRerun(t, false)
	require.NoError(t, l.c.db.Close())
	// The receipt of another key's reserve: key-0000's first.
	var otherKeyReserve uint64 = 2
	cases := []struct {
		desc string
		sql  string
		from uint64 // rehash from
		want []string
	}{
		{"the reconcile turned into a resolve", fmt.Sprintf(
			`UPDATE receipts SET kind = 'resolve', note = 'checked by hand', actor = 'ops' WHERE seq = %d`, l.reconcileSeq),
			l.reconcileSeq, []string{verify.RuleCommitWithoutReserve}},
		{"the late commit names another key's reserve", fmt.Sprintf(
			`UPDATE receipts SET ref_seq = %d WHERE seq = %d`, otherKeyReserve, l.lateSeq),
			l.lateSeq, []string{verify.RuleCommitWithoutReserve}},
		{"the late commit names the reconcile, not its reserve", fmt.Sprintf(
			`UPDATE receipts SET ref_seq = %d WHERE seq = %d`, l.reconcileSeq, l.lateSeq),
			l.lateSeq, []string{verify.RuleCommitWithoutReserve}},
		{"the late commit by another execution", fmt.Sprintf(
			`UPDATE receipts SET execution_id = 'exec-9' WHERE seq = %d`, l.lateSeq),
			l.lateSeq, []string{verify.RuleCommitWithoutReserve}},
		{"the late commit with another fingerprint", fmt.Sprintf(
			`UPDATE receipts SET input_hash = (SELECT input_hash FROM receipts WHERE seq = 2) WHERE seq = %d`, l.lateSeq),
			l.lateSeq, []string{verify.RuleFingerprintChanged}},
		{"the late commit twice", fmt.Sprintf(
			`INSERT INTO receipts SELECT seq + 1, kind, idempotency_key, key_generated, execution_id, attempt, tool, effect,
				idempotent, input_hash, 'failed', '', result, 'X', error_message, retryable, lease_expires_at, ref_seq, actor, note,
				recorded_at + 1000, prev_hash, hash FROM receipts WHERE seq = %d`, l.lateSeq),
			l.lateSeq + 1, []string{verify.RuleDoubleFinalization}},
		{"the rerun's commit names the reconciled reserve", fmt.Sprintf(
			`UPDATE receipts SET ref_seq = %d WHERE seq = %d`, l.reserveSeq, l.rerunDone),
			l.rerunDone, []string{verify.RuleCommitWithoutReserve}},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tampered.db")
			testkit.CopyFile(t, l.c.path, path)
			var c tamperCase
			require.NoError(t, json.Unmarshal(fmt.Appendf(nil, `{"steps":[{"sql":%q},{"rehash_from":%d}]}`, tc.sql, tc.from), &c))
			tamper(t, path, c)
			rep := threeWays(t, path, verify.Opts{Now: l.c.clock.Now})
			got := rules(rep)
			for _, w := range tc.want {
				assert.Contains(t, got, w, "%+v", rep.Violations)
			}
		})
	}
}
