package verify_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"strings"
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

// erasedAudit is a committed ledger (SPEC §14) whose audit shows payload
// values: an approver's note (the ask answered before pin, consumed
// after), an operator's resolution note, and a reconcile's lookup and
// external_ref contradicted by the original call's late commit.
type erasedAudit struct {
	c   *calls
	pin verify.Pin
}

const (
	approverNote = "approved: the order is real"
	resolveNote  = "checked the mail server: nothing sent"
	smsLookup    = "sms.find_message"
)

func newErasedAudit(t *testing.T) *erasedAudit {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithStore(sqlite.Options{Payloads: ledger.PayloadsCommitted}))
	c := &calls{t: t, path: path, db: db, clock: db.Clock, tokens: map[string]string{}}
	_, err := db.SetPolicy(ctx, json.RawMessage(`{"rules":[{"tool":"payments.*","approval":"required"},`+
		`{"tool":"sms.*","reconcile":{"allow":true,"settle_ms":0}}]}`), "ops")
	require.NoError(t, err)

	charge := ledger.ReserveRequest{IdempotencyKey: "pay-key-0001", ExecutionID: "exec-1", Tool: "payments.charge",
		Effect: "write", Input: input(1), ApprovalSummary: "charge the order"}
	held := ledgertest.MustReserve(t, db, charge)
	require.NotNil(t, held.Ask)
	c.clock.Advance(time.Second)
	_, _, err = db.Answer(ctx, ledger.AnswerRequest{Seq: held.Ask.Seq, Decision: "approve", Note: approverNote})
	require.NoError(t, err)
	h := db.Head()
	e := &erasedAudit{c: c, pin: verify.Pin{Seq: h.Seq, Hash: h.Hash.String()}}
	c.clock.Advance(time.Second)
	res := ledgertest.MustReserve(t, db, charge)
	require.Equal(t, ledger.StatusReserved, res.Status)
	c.tokens[charge.IdempotencyKey] = res.Reservation
	c.succeed(charge.IdempotencyKey)

	c.reserve("mail-key-0001", "exec-2", "mail.send", 2, lease(10))
	c.clock.Advance(time.Hour)
	_, err = db.Resolve(ctx, ledger.ResolveRequest{IdempotencyKey: "mail-key-0001", Outcome: "failed",
		Error: &ledger.FailureDetail{Code: "NOT_SENT"}, Note: resolveNote, Actor: "ops-alice"})
	require.NoError(t, err)

	c.reserve("sms-key-0001", "exec-3", "sms.send", 3, lease(10))
	original := c.tokens["sms-key-0001"]
	c.clock.Advance(time.Hour)
	_, err = db.Reconcile(ctx, ledger.ReconcileRequest{IdempotencyKey: "sms-key-0001", Outcome: "succeeded",
		ExternalRef: "sm_found", Evidence: json.RawMessage(`{"lookup":"` + smsLookup + `","answer":{"id":"sm_found"}}`), Admin: true})
	require.NoError(t, err)
	c.clock.Advance(time.Second)
	ledgertest.MustCommit(t, db, ledger.CommitRequest{IdempotencyKey: "sms-key-0001", Reservation: original,
		Outcome: "succeeded", ExternalRef: "sm_sent"})
	return e
}

// audits returns the audit of every way of reading the ledger: the three
// full passes of the file, an incremental run from the pin, and a server.
func (e *erasedAudit) audits() map[string]*verify.Audit {
	t := e.c.t
	t.Helper()
	ctx := context.Background()
	opts := verify.Opts{Now: e.c.clock.Now}
	out := map[string]*verify.Audit{}
	rep := threeWays(t, e.c.path, opts)
	require.True(t, rep.OK, "%+v", rep.Violations)
	out["file"] = rep.Audit
	rd, err := sqlite.OpenReader(ctx, e.c.path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	inc := opts
	inc.Pinned, inc.Incremental = &e.pin, true
	rep, err = verify.New(rd, inc).Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep.Violations)
	out["incremental"] = rep.Audit
	srv := httptest.NewServer(api.NewServer(e.c.db.Ledger, api.Config{Logger: quiet}))
	defer srv.Close()
	rep, err = verify.NewRemote(server(t, srv.URL), opts).Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep.Violations)
	out["server"] = rep.Audit
	return out
}

// TestAudit_committedValues: in a committed namespace every audit member
// read from a payload field shows its value, never its commitment; once
// erased, "" with erased naming the member and the erase receipt (SPEC
// §14), and the erased external_refs are no longer compared.
func TestAudit_committedValues(t *testing.T) {
	e := newErasedAudit(t)
	for how, a := range e.audits() {
		raw, err := json.Marshal(a)
		require.NoError(t, err)
		assert.NotContains(t, string(raw), `"pc1:`, how)
		require.Len(t, a.Approvals, 1, how)
		require.NotNil(t, a.Approvals[0].Answer, how)
		assert.Equal(t, approverNote, a.Approvals[0].Answer.Note, how)
		assert.Nil(t, a.Approvals[0].Answer.Erased, how)
		if how != "incremental" { // the resolve and the reconcile are before its window
			require.Len(t, a.Resolutions, 1, how)
			assert.Equal(t, resolveNote, a.Resolutions[0].Note, how)
			assert.Nil(t, a.Resolutions[0].Erased, how)
			require.Len(t, a.Reconciliations, 1, how)
			assert.Equal(t, smsLookup, a.Reconciliations[0].Lookup, how)
			assert.Nil(t, a.Reconciliations[0].Erased, how)
		}
		require.Len(t, a.ReconcileContradicted, 1, how)
		assert.Equal(t, "sm_found", a.ReconcileContradicted[0].ReconciledExternalRef, how)
		assert.Equal(t, "sm_sent", a.ReconcileContradicted[0].ExternalRef, how)
	}

	er, err := e.c.db.Erase(context.Background(), ledger.EraseRequest{Keys: []string{"pay-key-0001", "mail-key-0001", "sms-key-0001"},
		Reason: "request 9", Actor: "ops"})
	require.NoError(t, err)
	by := er.Receipt.Seq
	for how, a := range e.audits() {
		raw, err := json.Marshal(a)
		require.NoError(t, err)
		for _, v := range []string{`"pc1:`, "approved:", "nothing sent", smsLookup, "sm_found", "sm_sent"} {
			assert.NotContains(t, string(raw), v, how)
		}
		require.Len(t, a.Approvals, 1, how)
		require.NotNil(t, a.Approvals[0].Answer, how)
		assert.Equal(t, "", a.Approvals[0].Answer.Note, how)
		assert.Equal(t, verify.Erased{"note": by}, a.Approvals[0].Answer.Erased, how)
		if how != "incremental" {
			require.Len(t, a.Resolutions, 1, how)
			assert.Equal(t, "", a.Resolutions[0].Note, how)
			assert.Equal(t, verify.Erased{"note": by}, a.Resolutions[0].Erased, how)
			require.Len(t, a.Reconciliations, 1, how)
			assert.Equal(t, "", a.Reconciliations[0].Lookup, how)
			assert.Equal(t, verify.Erased{"lookup": by}, a.Reconciliations[0].Erased, how)
		}
		assert.Empty(t, a.ReconcileContradicted, "%s: the same outcome, and the external_refs cannot be compared", how)
		require.Len(t, a.Erasures, 1, how)
		assert.Equal(t, "request 9", a.Erasures[0].Reason, how)
	}
	raw, err := json.Marshal(verify.Resolution{Note: "", Erased: verify.Erased{"note": 9}})
	require.NoError(t, err)
	assert.True(t, strings.Contains(string(raw), `"note":"","actor":"","recorded_at":0,"erased":{"note":9}`), string(raw))
}
