package ledger_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// TestLog_AddErasedBy: a portable receipt gets the proof of its erasure
// once a checkpoint covers the erase receipt (404 not_checkpointed
// before), which check-proof's checks accept; of two erasures of one
// receipt, the earlier of a tie is proven.
func TestLog_AddErasedBy(t *testing.T) {
	ctx := context.Background()
	db := ledgertest.Open(t)
	for _, k := range []string{"refund-order-1234", "refund-order-5678"} {
		res := testkit.MustReserve(t, db, testkit.ReserveReq(k, "exec-1"))
		c := testkit.Succeed(k, res.Reservation)
		c.ExternalRef, c.Result = "re_1", json.RawMessage(`{"to":"someone"}`)
		testkit.MustCommit(t, db, c)
	}
	erase := func(key string, f chain.PayloadField) {
		t.Helper()
		_, err := db.Erase(ctx, ledger.EraseRequest{Keys: []string{key}, Fields: chain.FieldSet(0).With(f), Reason: "request 9"})
		require.NoError(t, err)
	}
	erase("refund-order-1234", chain.FieldResult) // 5
	skey, vkey, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	signer, _, _, err := tlog.LoadSignerText(skey, "ex.test")
	require.NoError(t, err)
	v, err := tlog.NewVerifier(vkey)
	require.NoError(t, err)
	sign := func(n int64) {
		t.Helper()
		root, err := tlog.TreeHash(n, db.HashReader(ctx))
		require.NoError(t, err)
		msg, err := tlog.SignCheckpoint(tlog.Checkpoint{Origin: "ex.test/default", Size: n, Root: root}, []note.Signer{signer})
		require.NoError(t, err)
		require.NoError(t, db.StoreCheckpoint(ctx, &tlog.Signed{Size: n, Root: root, Note: string(msg)}))
	}
	prove := func() (*tlog.PortableReceipt, error) {
		t.Helper()
		p, err := db.PortableReceipt(ctx, 2)
		require.NoError(t, err)
		return p, db.AddErasedBy(ctx, p)
	}

	sign(4)
	_, err = prove()
	assert.Equal(t, ledger.ECodeNotCheckpointed, ledger.ErrorCode(err), "the erase receipt is not under a checkpoint yet: %v", err)

	sign(5)
	p, err := prove()
	require.NoError(t, err)
	require.NotNil(t, p.ErasedBy)
	assert.Equal(t, []chain.Range{{2, 2}}, p.ErasedBy.Ranges)
	assert.True(t, chain.IsCommitment(p.ErasedBy.Receipt.Note), "the reason stays committed")
	c, err := tlog.CheckPortableAny(p, []note.Verifier{v}, "default")
	require.NoError(t, err)
	fields, err := tlog.CheckDisclosures(p, c)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"external_ref": "disclosed", "result": "erased by 5"}, fields)

	erase("refund-order-1234", chain.FieldExternalRef) // 6
	sign(6)
	p, err = prove()
	require.NoError(t, err)
	assert.Equal(t, map[string]uint64{"result": 5, "external_ref": 6}, p.Erased)
	assert.Equal(t, uint64(5), p.ErasedBy.Receipt.Seq, "the earlier of a tie")
	c, err = tlog.CheckPortableAny(p, []note.Verifier{v}, "default")
	require.NoError(t, err)
	fields, err = tlog.CheckDisclosures(p, c)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"external_ref": "not disclosed (issuer says erased by 6)", "result": "erased by 5"}, fields)

	q, err := db.PortableReceipt(ctx, 4) // nothing erased
	require.NoError(t, err)
	require.NoError(t, db.AddErasedBy(ctx, q))
	assert.Nil(t, q.ErasedBy)
}
