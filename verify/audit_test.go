package verify_test

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/verify"
)

func TestVerifier_audit(t *testing.T) {
	path, now := buildLedger(t)
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	opts := verify.Opts{Now: func() time.Time { return now }}
	rep, err := verify.New(rd, opts).Check(context.Background())
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep.Violations)
	a := rep.Audit

	t.Run("runtime retries", func(t *testing.T) {
		require.Len(t, a.RuntimeRetries, 1)
		rr := a.RuntimeRetries[0]
		assert.Equal(t, "mail-key-001", rr.Key)
		assert.Equal(t, "exec-3", rr.ExecutionID)
		assert.Equal(t, []uint64{1, 2}, rr.Attempts)
		assert.Equal(t, []string{"TIMEOUT"}, rr.ErrorCodes)
		assert.Equal(t, []uint64{6}, rr.Seqs)
	})
	t.Run("re-invocations", func(t *testing.T) {
		require.Len(t, a.ReInvocations, 1)
		ri := a.ReInvocations[0]
		assert.Equal(t, "pay-key-0001", ri.Key)
		assert.Equal(t, uint64(3), ri.Seq)
		assert.Equal(t, "deduped", ri.Outcome)
		assert.Equal(t, "exec-2", ri.ExecutionID)
		assert.Equal(t, "exec-1", ri.FirstExecutionID)
	})
	t.Run("interrupted", func(t *testing.T) {
		require.Len(t, a.Interrupted, 1)
		assert.Equal(t, "open-key-001", a.Interrupted[0].Key)
		assert.False(t, a.Interrupted[0].Idempotent)
		assert.True(t, a.Interrupted[0].AwaitingPerson)
		assert.Equal(t, uint64(10), a.Interrupted[0].ReserveSeq)
	})
	t.Run("failed", func(t *testing.T) {
		require.Len(t, a.Failed, 1)
		assert.Equal(t, "charge-key-1", a.Failed[0].Key)
		assert.Equal(t, "NOT_CHARGED", a.Failed[0].ErrorCode)
	})
	t.Run("resolutions", func(t *testing.T) {
		require.Len(t, a.Resolutions, 1)
		assert.Equal(t, "charge-key-1", a.Resolutions[0].Key)
		assert.Equal(t, "checked the PSP", a.Resolutions[0].Note)
		assert.Equal(t, "failed", a.Resolutions[0].Outcome)
	})
	t.Run("no duplicates", func(t *testing.T) { assert.Empty(t, a.DuplicateEffects) })
	t.Run("online audit is the same", func(t *testing.T) {
		db := ledgertest.Open(t, ledgertest.WithPath(path))
		srv := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
		defer func() { srv.Close(); _ = db.Close() }()
		online, err := verify.NewRemote(server(t, srv.URL), opts).Check(context.Background())
		require.NoError(t, err)
		assert.Equal(t, a, online.Audit)
		assert.Equal(t, rep.Head, online.Head)
	})
	t.Run("tool filter", func(t *testing.T) {
		o := opts
		o.Filter.Tool = "email.send"
		rep, err := verify.New(rd, o).Check(context.Background())
		require.NoError(t, err)
		assert.Len(t, rep.Audit.RuntimeRetries, 1)
		assert.Empty(t, rep.Audit.ReInvocations)
		assert.Empty(t, rep.Audit.Failed)
		assert.Empty(t, rep.Audit.Interrupted)
	})
	t.Run("since filter", func(t *testing.T) {
		o := opts
		o.Filter.Since = now
		rep, err := verify.New(rd, o).Check(context.Background())
		require.NoError(t, err)
		assert.Empty(t, rep.Audit.RuntimeRetries)
		assert.Empty(t, rep.Audit.Resolutions)
	})
}

// TestVerifier_duplicateEffects: two keys, same tool and input, both
// succeeded — the refund called twice under different keys.
func TestVerifier_duplicateEffects(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path))
	ctx := context.Background()
	for _, k := range []string{"refund-a-0001", "refund-b-0002", "refund-c-0003"} {
		res, err := db.Reserve(ctx, ledger.ReserveRequest{IdempotencyKey: k, ExecutionID: "exec-" + k,
			Tool: "payments.refund", Effect: "write", Input: []byte(`{"order":1234}`)})
		require.NoError(t, err)
		outcome := "succeeded"
		var fd *ledger.FailureDetail
		if k == "refund-c-0003" {
			outcome, fd = "failed", &ledger.FailureDetail{Code: "DECLINED"}
		}
		_, err = db.Commit(ctx, ledger.CommitRequest{IdempotencyKey: k, Reservation: res.Reservation, Outcome: outcome, Error: fd})
		require.NoError(t, err)
	}
	rd, err := sqlite.OpenReader(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	rep, err := verify.New(rd, verify.Opts{}).Check(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Audit.DuplicateEffects, 1)
	d := rep.Audit.DuplicateEffects[0]
	assert.Equal(t, "payments.refund", d.Tool)
	assert.Equal(t, []string{"refund-a-0001", "refund-b-0002"}, d.Keys)
	assert.Equal(t, []uint64{2, 4}, d.Seqs)

	srv := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	defer func() { srv.Close(); _ = db.Close() }()
	for range 5 { // the online pass finishes keys in map order: the keys must still come in seq order
		online, err := verify.NewRemote(server(t, srv.URL), verify.Opts{}).Check(ctx)
		require.NoError(t, err)
		assert.Equal(t, rep.Audit.DuplicateEffects, online.Audit.DuplicateEffects, "online")
	}
	for _, f := range []verify.AuditFilter{{SinceSeq: 4}, {SinceSeq: 5}, {Tool: "payments.charge"}} {
		offline, err := verify.New(rd, verify.Opts{Filter: f}).Check(ctx)
		require.NoError(t, err)
		online, err := verify.NewRemote(server(t, srv.URL), verify.Opts{Filter: f}).Check(ctx)
		require.NoError(t, err)
		assert.Equal(t, offline.Audit.DuplicateEffects, online.Audit.DuplicateEffects, "%+v", f)
		assert.Equal(t, f.SinceSeq == 4, len(offline.Audit.DuplicateEffects) == 1, "%+v", f)
	}
}
