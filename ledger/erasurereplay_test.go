package ledger_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/verify"
)

var (
	hashA = strings.Repeat("a", 64)
	hashB = strings.Repeat("b", 64)
)

// erasureFile is a valid erasures file with one erasure whose members are
// those given (JSON text after "seq":9,).
func erasureFile(members string) string {
	return `{"format":"effect-ledger/erasures/v1","exported_at":1,"namespaces":[{"namespace":"default","erasures":[` +
		`{"seq":9,` + members + `}],"pending":[]}]}`
}

// TestParseErasureFile: a valid file parses; every broken rule of the
// format is refused with ErrBadErasureFile.
func TestParseErasureFile(t *testing.T) {
	ok := `"hash":"` + hashA + `","fields":["result","note"],"retention":false,"subjects":["` + hashB + `"],` +
		`"erased":[{"seq":2,"hash":"` + hashB + `","fields":["result"]},{"seq":4,"hash":"` + hashA + `","fields":["result","note"]}]`
	f, err := ledger.ParseErasureFile(strings.NewReader(erasureFile(ok)))
	require.NoError(t, err)
	require.Len(t, f.Namespaces, 1)
	assert.Len(t, f.Namespaces[0].Erasures[0].Erased, 2)
	f, err = ledger.ParseErasureFile(strings.NewReader(strings.Replace(erasureFile(ok), `"pending":[]`,
		`"pending":[{"key":"refund-order-1","first_seq":1,"hash":"`+hashA+`","erase_seq":0,"fields":["result"]}]`, 1)))
	require.NoError(t, err)
	assert.Len(t, f.Namespaces[0].Pending, 1)

	for _, tc := range []struct{ desc, text string }{
		{"not JSON", `{`},
		{"text after", erasureFile(ok) + `{}`},
		{"another format", strings.Replace(erasureFile(ok), "erasures/v1", "erasures/v2", 1)},
		{"unknown member", strings.Replace(erasureFile(ok), `"exported_at":1`, `"exported_at":1,"x":1`, 1)},
		{"no namespaces", `{"format":"effect-ledger/erasures/v1","exported_at":1}`},
		{"bad namespace name", strings.Replace(erasureFile(ok), `"namespace":"default"`, `"namespace":"Default!"`, 1)},
		{"namespace twice", `{"format":"effect-ledger/erasures/v1","exported_at":1,"namespaces":[{"namespace":"a","erasures":[],"pending":[]},{"namespace":"a","erasures":[],"pending":[]}]}`},
		{"erasures out of order", `{"format":"effect-ledger/erasures/v1","exported_at":1,"namespaces":[{"namespace":"a","erasures":[` +
			`{"seq":9,` + ok + `},{"seq":9,` + ok + `}]}]}`},
		{"upper-case hash", strings.Replace(erasureFile(ok), hashA, strings.ToUpper(hashA), 1)},
		{"short hash", strings.Replace(erasureFile(ok), hashA, "abc", 1)},
		{"unknown field", strings.Replace(erasureFile(ok), `["result","note"],"retention"`, `["colour"],"retention"`, 1)},
		{"fields not in order", strings.Replace(erasureFile(ok), `["result","note"],"retention"`, `["note","result"],"retention"`, 1)},
		{"no fields", strings.Replace(erasureFile(ok), `"fields":["result"]`, `"fields":[]`, 1)},
		{"erased field not the erasure's", strings.Replace(erasureFile(ok), `"fields":["result"]`, `"fields":["external_ref"]`, 1)},
		{"bad subject", strings.Replace(erasureFile(ok), `"subjects":["`+hashB+`"]`, `"subjects":["zz"]`, 1)},
		{"subject twice", strings.Replace(erasureFile(ok), `"subjects":["`+hashB+`"]`, `"subjects":["`+hashB+`","`+hashB+`"]`, 1)},
		{"no subjects", strings.Replace(erasureFile(ok), `"subjects":["`+hashB+`"],`, ``, 1)},
		{"erased out of order", strings.Replace(erasureFile(ok), `"seq":4`, `"seq":2`, 1)},
		{"erased at the erasure's seq", strings.Replace(erasureFile(ok), `"seq":4`, `"seq":9`, 1)},
		{"no pending", strings.Replace(erasureFile(ok), `,"pending":[]`, ``, 1)},
		{"pending of a bad key", strings.Replace(erasureFile(ok), `"pending":[]`, `"pending":[{"key":"x","first_seq":1,"hash":"`+hashA+`","erase_seq":0,"fields":["result"]}]`, 1)},
		{"pending at seq 0", strings.Replace(erasureFile(ok), `"pending":[]`, `"pending":[{"key":"refund-order-1","first_seq":0,"hash":"`+hashA+`","erase_seq":0,"fields":["result"]}]`, 1)},
		{"pending twice", strings.Replace(erasureFile(ok), `"pending":[]`, `"pending":[{"key":"refund-order-1","first_seq":1,"hash":"`+hashA+`","erase_seq":0,"fields":["result"]},{"key":"refund-order-1","first_seq":1,"hash":"`+hashA+`","erase_seq":0,"fields":["result"]}]`, 1)},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := ledger.ParseErasureFile(strings.NewReader(tc.text))
			assert.ErrorIs(t, err, ledger.ErrBadErasureFile)
		})
	}
}

// FuzzParseErasureFile: any text is refused with ErrBadErasureFile or
// parses into a file whose every erased receipt lies below its erasure,
// with fields among the erasure's.
func FuzzParseErasureFile(f *testing.F) {
	f.Add(erasureFile(`"hash":"` + hashA + `","fields":["result"],"retention":false,"subjects":[],"erased":[{"seq":1,"hash":"` + hashB + `","fields":["result"]}]`))
	f.Add(`{"format":"effect-ledger/erasures/v1","exported_at":0,"namespaces":[]}`)
	f.Add(`null`)
	f.Add(`{"namespaces":[{"namespace":"a","erasures":null}]}`)
	f.Fuzz(func(t *testing.T, text string) {
		file, err := ledger.ParseErasureFile(strings.NewReader(text))
		if err != nil {
			require.ErrorIs(t, err, ledger.ErrBadErasureFile)
			return
		}
		for _, ns := range file.Namespaces {
			require.True(t, ledger.ValidNamespace(ns.Namespace))
			for _, e := range ns.Erasures {
				for _, x := range e.Erased {
					require.Less(t, x.Seq, e.Seq)
					require.NotEmpty(t, x.Fields)
				}
			}
		}
	})
}

// TestNamespace_ReplayErasures: a copy of a ledger taken before an erase by
// subject loses the same values when the export of the ledger is replayed
// into it: a hash that is not the copy's is skipped, the true one erased
// later, a second replay appends nothing, the replay's erasures record the
// subject, and the copy verifies.
func TestNamespace_ReplayErasures(t *testing.T) {
	ctx := context.Background()
	a := ledgertest.Open(t)
	for _, k := range []string{"refund-order-0001", "refund-order-0002"} {
		req := testkit.ReserveReq(k, "e1")
		req.Subjects = []string{"customer-42"}
		res := testkit.MustReserve(t, a, req)
		testkit.MustCommit(t, a, testkit.Succeed(k, res.Reservation))
	}
	req := testkit.ReserveReq("refund-order-0003", "e1")
	req.Subjects = []string{"customer-42"}
	open := testkit.MustReserve(t, a, req) // still in flight when the subject is erased
	copyPath := filepath.Join(t.TempDir(), "copy.db")
	_, err := sqlite.Backup(ctx, a.Path(), copyPath, sqlite.BackupOptions{})
	require.NoError(t, err)
	er, err := a.Erase(ctx, ledger.EraseRequest{Subject: "customer-42", Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, ledger.StatusErased, er.Status)
	exp, err := a.ExportErasures(ctx)
	require.NoError(t, err)
	require.Len(t, exp.Erasures, 1)
	e := exp.Erasures[0]
	assert.Len(t, e.Subjects, 1, "the subject's MAC is recorded")
	require.Len(t, e.Erased, 2)
	assert.Equal(t, []string{"external_ref", "result"}, e.Erased[0].Fields)
	require.Len(t, exp.Pending, 1)
	assert.Equal(t, "refund-order-0003", exp.Pending[0].Key)

	b := ledgertest.Open(t, ledgertest.WithPath(copyPath))
	tampered := *exp
	tampered.Erasures = []ledger.ErasureRecord{e}
	tampered.Erasures[0].Erased = append([]ledger.ErasedRecord{}, e.Erased...)
	tampered.Erasures[0].Erased[1].Hash = hashA
	res, err := b.ReplayErasures(ctx, &tampered, "ops", "")
	require.NoError(t, err)
	require.Len(t, res.Receipts, 1)
	assert.Equal(t, uint64(1), res.Count)
	assert.Equal(t, []ledger.ReplayItem{{Erasure: e.Seq, Seq: e.Erased[1].Seq, Status: ledger.ReplayHashMismatch}}, res.Skipped())
	assert.Equal(t, []ledger.ReplayPending{{Key: "refund-order-0003", FirstSeq: open.Receipt.Seq, Status: ledger.ReplayMarked}}, res.Pending)

	res, err = b.ReplayErasures(ctx, exp, "ops", "")
	require.NoError(t, err)
	require.Len(t, res.Receipts, 1, "the seq skipped before")
	assert.Equal(t, []ledger.ReplayItem{{Erasure: e.Seq, Seq: e.Erased[0].Seq, Status: ledger.ReplayAlready},
		{Erasure: e.Seq, Seq: e.Erased[1].Seq, Status: ledger.ReplayErased}}, res.Items)
	head := b.Head()
	res, err = b.ReplayErasures(ctx, exp, "ops", "")
	require.NoError(t, err)
	assert.Empty(t, res.Receipts)
	assert.Equal(t, ledger.ReplayAlready, res.Pending[0].Status)
	assert.Equal(t, head, b.Head(), "a second replay appends nothing")

	// The key marked in the copy is erased as it finishes there.
	c := testkit.MustCommit(t, b, testkit.Succeed("refund-order-0003", open.Reservation))
	assert.Equal(t, c.Receipt.Seq+1, b.Head().Seq, "an erase receipt follows the commit")

	got, err := b.ExportErasures(ctx)
	require.NoError(t, err)
	require.Len(t, got.Erasures, 3)
	assert.Empty(t, got.Pending)
	assert.Equal(t, e.Subjects, got.Erasures[0].Subjects, "the replay records the subject too")
	verifyClean(t, b)
}

// verifyClean checks db's default namespace with the verifier: no
// violation.
func verifyClean(t *testing.T, db *ledgertest.DB) {
	t.Helper()
	c, err := db.Store.Chain(context.Background(), ledger.DefaultNamespace)
	require.NoError(t, err)
	rep, err := verify.New(c, verify.Opts{}).Check(context.Background())
	require.NoError(t, err)
	assert.Empty(t, rep.Violations)
}

// TestNamespace_ReplayErasuresAwaitingApproval: the pending mark of a key
// erased while it waited for its approval is exported as its ask's, and
// replayed into a copy where that ask still waits: there the approval is
// consumed and the commit erased as it is appended, and the copy
// verifies.
func TestNamespace_ReplayErasuresAwaitingApproval(t *testing.T) {
	ctx := context.Background()
	a := ledgertest.Open(t)
	_, err := a.SetPolicy(ctx, json.RawMessage(`{"rules":[{"tool":"payments.charge","approval":"required"}]}`), "ops")
	require.NoError(t, err)
	req := testkit.ReserveReq("refund-order-0009", "e1")
	req.Tool = "payments.charge"
	req.ApprovalSummary = "refund the order"
	held := ledgertest.MustReserve(t, a, req)
	require.NotNil(t, held.Ask)
	copyPath := filepath.Join(t.TempDir(), "copy.db")
	_, err = sqlite.Backup(ctx, a.Path(), copyPath, sqlite.BackupOptions{})
	require.NoError(t, err)
	er, err := a.Erase(ctx, ledger.EraseRequest{Keys: []string{"refund-order-0009"}, Actor: "ops"})
	require.NoError(t, err)
	assert.Equal(t, []string{"refund-order-0009"}, er.Pending)
	exp, err := a.ExportErasures(ctx)
	require.NoError(t, err)
	require.Len(t, exp.Pending, 1)
	assert.Equal(t, held.Ask.Seq, exp.Pending[0].FirstSeq, "the ask's mark")

	b := ledgertest.Open(t, ledgertest.WithPath(copyPath))
	res, err := b.ReplayErasures(ctx, exp, "ops", "")
	require.NoError(t, err)
	assert.Equal(t, []ledger.ReplayPending{{Key: "refund-order-0009", FirstSeq: held.Ask.Seq, Status: ledger.ReplayMarked}}, res.Pending)
	v, err := b.Approval(ctx, held.Ask.Seq, true)
	require.NoError(t, err)
	assert.Empty(t, v.Input, "the input shown to the approver goes as it went in the erasing ledger")
	_, _, err = b.Answer(ctx, ledger.AnswerRequest{Seq: held.Ask.Seq, Decision: ledger.DecisionApprove, Note: "fine",
		Actor: "alice", Role: ledger.RoleApprover, Authenticated: true})
	require.NoError(t, err)
	r := ledgertest.MustReserve(t, b, req)
	require.NotNil(t, r.Approval)
	c := testkit.MustCommit(t, b, testkit.Succeed("refund-order-0009", r.Reservation))
	assert.Equal(t, c.Receipt.Seq+1, b.Head().Seq, "an erase receipt follows the commit")
	got, err := b.ExportErasures(ctx)
	require.NoError(t, err)
	assert.Empty(t, got.Pending)
	verifyClean(t, b)
}
