package storetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/tlog"
)

func testReads(t *testing.T, f Factory) {
	ctx := context.Background()
	_, _, n := openDefault(t, f)
	for i := range 5 {
		key := fmt.Sprintf("read-key-%d", i)
		r := testkit.MustReserve(t, n, testkit.ReserveReq(key, fmt.Sprintf("exec-%d", i%2)))
		testkit.MustCommit(t, n, testkit.Succeed(key, r.Reservation))
	}
	page, next, err := n.Reader().ListReceipts(ctx, ledger.ReceiptFilter{Limit: 4})
	require.NoError(t, err)
	require.Len(t, page, 4)
	require.NotNil(t, next)
	require.Equal(t, uint64(4), *next)
	rest, next, err := n.Reader().ListReceipts(ctx, ledger.ReceiptFilter{After: *next, Limit: 100})
	require.NoError(t, err)
	require.Len(t, rest, 6)
	require.Nil(t, next)
	byKey, _, err := n.Reader().ListReceipts(ctx, ledger.ReceiptFilter{Key: "read-key-3"})
	require.NoError(t, err)
	require.Len(t, byKey, 2)
	commits, _, err := n.Reader().ListReceipts(ctx, ledger.ReceiptFilter{Kind: chain.KindCommit, ExecutionID: "exec-0"})
	require.NoError(t, err)
	require.Len(t, commits, 3)
	v, err := n.GetKey(ctx, "read-key-3")
	require.NoError(t, err)
	require.Equal(t, ledger.StateSucceeded, v.State)
	require.Len(t, v.Receipts, 2)
	r := receipt(t, n, 7)
	require.Equal(t, uint64(7), r.Seq)
	_, err = n.GetReceipt(ctx, 99)
	require.Equal(t, ledger.ECodeUnknownReceipt, code(err))
	var keys []string
	require.NoError(t, auditDB(t, n).Keys(ctx, func(k *ledger.KeyRecord) error {
		keys = append(keys, k.Key)
		return nil
	}))
	require.Equal(t, []string{"read-key-0", "read-key-1", "read-key-2", "read-key-3", "read-key-4"}, keys)
	verifyClean(t, n, 10)
}

func testCheckpoints(t *testing.T, f Factory) {
	ctx := context.Background()
	_, _, n := openDefault(t, f)
	for i := range 3 {
		testkit.MustReserve(t, n, testkit.ReserveReq(fmt.Sprintf("ckpt-key-%d", i), "e"))
	}
	c, err := n.LatestCheckpoint(ctx)
	require.NoError(t, err)
	require.Nil(t, c)
	root, err := sumdb.TreeHash(3, n.HashReader(ctx))
	require.NoError(t, err)
	require.NoError(t, n.StoreCheckpoint(ctx, &tlog.Signed{Size: 3, Root: root, Note: "note 3\n"}))
	err = n.StoreCheckpoint(ctx, &tlog.Signed{Size: 3, Root: root, Note: "note 3\n"})
	require.ErrorIs(t, err, ledger.ErrStaleCheckpoint)
	require.Error(t, n.StoreCheckpoint(ctx, &tlog.Signed{Size: 9, Root: root, Note: "beyond\n"}))
	got, err := n.LatestCheckpoint(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), got.Size)
	require.Equal(t, "note 3\n", got.Note)
	p, err := n.InclusionProof(ctx, 2, 3)
	require.NoError(t, err)
	r := receipt(t, n, 2)
	hs := make([]tlog.Hash, len(p.Hashes))
	for i, h := range p.Hashes {
		hs[i] = tlog.Hash(h)
	}
	require.NoError(t, sumdb.CheckRecord(hs, 3, root, 1, tlog.LeafHash(r.Hash)))

	// The first and the largest checkpoint covering a receipt (SPEC §9.2:
	// a key receipt is proven under the first).
	testkit.MustReserve(t, n, testkit.ReserveReq("ckpt-key-3", "e"))
	root4, err := sumdb.TreeHash(4, n.HashReader(ctx))
	require.NoError(t, err)
	require.NoError(t, n.StoreCheckpoint(ctx, &tlog.Signed{Size: 4, Root: root4, Note: "note 4\n"}))
	chainOf := n.Reader()
	for _, tt := range []struct {
		seq         int64
		first, last int64
	}{{1, 3, 4}, {3, 3, 4}, {4, 4, 4}, {5, 0, 0}} {
		first, err := chainOf.FirstCheckpointCovering(ctx, tt.seq)
		require.NoError(t, err)
		last, err := chainOf.CheckpointCovering(ctx, tt.seq)
		require.NoError(t, err)
		for _, c := range []struct {
			got  *tlog.Signed
			want int64
		}{{first, tt.first}, {last, tt.last}} {
			if c.want == 0 {
				require.Nil(t, c.got, "seq %d", tt.seq)
			} else {
				require.NotNil(t, c.got, "seq %d", tt.seq)
				require.Equal(t, c.want, c.got.Size, "seq %d", tt.seq)
			}
		}
	}
}

func testTokens(t *testing.T, f Factory) {
	ctx := context.Background()
	l, _ := open(t, f)
	toks := ledger.NewTokens(l.Store().Tokens())
	on, err := l.AuthEnabled(ctx)
	require.NoError(t, err)
	require.False(t, on)
	admin, err := toks.Create(ctx, "ops", ledger.RoleAdmin)
	require.NoError(t, err)
	scoped, err := toks.Create(ctx, "pay-gw", ledger.RoleWriter, "payments", "mail")
	require.NoError(t, err)
	_, err = toks.Create(ctx, "ops", ledger.RoleReader)
	require.ErrorIs(t, err, ledger.ErrTokenExists)
	for _, name := range []string{"agent/mcp-client:x", "a:b", ledger.ApproverMCPClient} {
		_, err = toks.Create(ctx, name, ledger.RoleApprover)
		require.Error(t, err, "%q could pose as an answer relayed from an MCP client (SPEC §13)", name)
	}
	p, err := l.Authenticate(ctx, scoped)
	require.NoError(t, err)
	require.Equal(t, []string{"mail", "payments"}, p.Namespaces)
	require.True(t, p.AllowsNamespace("payments"))
	require.False(t, p.AllowsNamespace("default"))
	pa, err := l.Authenticate(ctx, admin)
	require.NoError(t, err)
	require.True(t, pa.AllowsNamespace("anything"))
	list, err := toks.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.NoError(t, toks.Revoke(ctx, "pay-gw"))
	_, err = l.Authenticate(ctx, scoped)
	require.ErrorIs(t, err, ledger.ErrBadToken)
	last := "0"
	if admin[len(admin)-1] == '0' {
		last = "1"
	}
	_, err = l.Authenticate(ctx, admin[:len(admin)-1]+last)
	require.ErrorIs(t, err, ledger.ErrBadToken)
	require.ErrorIs(t, toks.Revoke(ctx, "nobody"), ledger.ErrTokenUnknown)
}
