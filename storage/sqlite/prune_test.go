package sqlite_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// prunedFile makes a ledger file at path whose namespace ns (keys expire
// after an hour) pruned its first 2×pairs+1 receipts, bodies deleted; the
// namespace's open key "pruned-open" pins the rest.
func prunedFile(t *testing.T, path, ns string, pairs int) {
	t.Helper()
	ctx := context.Background()
	clock := testkit.NewClock()
	opts := quiet
	opts.Now, opts.KeyTTL = clock.Now, uint64(time.Hour.Milliseconds())
	st, err := sqlite.OpenStore(ctx, path, opts, false)
	require.NoError(t, err)
	archive := filepath.Join(filepath.Dir(path), "archive")
	require.NoError(t, os.MkdirAll(archive, 0o755))
	l := ledger.New(st, ledger.Config{Now: clock.Now, ArchiveDir: archive, Logger: quiet.Logger})
	if ns != ledger.DefaultNamespace {
		require.NoError(t, l.CreateNamespace(ctx, ns, ledger.NamespaceSettings{KeyTTL: opts.KeyTTL}))
	}
	n, err := l.NS(ctx, ns)
	require.NoError(t, err)
	_, err = n.SetPolicy(ctx, json.RawMessage(`{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`), "ops")
	require.NoError(t, err)
	for i := range pairs {
		key := fmt.Sprintf("pruned-%04d", i)
		r := testkit.MustReserve(t, n, testkit.ReserveReq(key, "e1"))
		testkit.MustCommit(t, n, testkit.Succeed(key, r.Reservation))
	}
	clock.Advance(time.Hour + 2*time.Minute)
	testkit.MustReserve(t, n, testkit.ReserveReq("pruned-open", "e1"))
	skey, _, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	signer, err := note.NewSigner(skey)
	require.NoError(t, err)
	_, err = (&tlog.Checkpointer{Store: n, Signer: signer, Origin: "ex.test/" + ns}).SignOnce(ctx)
	require.NoError(t, err)
	res, err := n.Prune(ctx, ledger.PruneRequest{Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, uint64(2*pairs+1), res.Through)
	require.NoError(t, n.DeletePruned(ctx))
	require.NoError(t, l.Close())
}

// TestPrune_triggers: the file refuses to lose a receipt no prune covers
// or whose kept hash differs from its own, and to thin a checkpoint no
// prune covers.
func TestPrune_triggers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l.db")
	prunedFile(t, path, ledger.DefaultNamespace, 300)
	raw, err := sql.Open("sqlite3", path)
	require.NoError(t, err)
	defer raw.Close()
	var kept int
	require.NoError(t, raw.QueryRow(`SELECT count(*) FROM ns_receipts WHERE ns = 0 AND seq <= 601`).Scan(&kept))
	require.Zero(t, kept, "the bodies are gone")
	_, err = raw.Exec(`DELETE FROM ns_receipts WHERE ns = 0 AND seq = 603`)
	require.ErrorContains(t, err, "only a pruned receipt whose hash is kept may go")
	_, err = raw.Exec(`DELETE FROM ns_checkpoints WHERE ns = 0 AND size > 601`)
	require.ErrorContains(t, err, "only those a prune covers may be thinned")
	// A prune row covering 602 whose kept tile lacks its hash.
	_, err = raw.Exec(`DROP TRIGGER ns_prunes_progress`)
	require.NoError(t, err)
	_, err = raw.Exec(`UPDATE ns_prunes SET through = 602, deleted_through = 601 WHERE ns = 0`)
	require.NoError(t, err)
	_, err = raw.Exec(`DELETE FROM ns_receipts WHERE ns = 0 AND seq = 602`)
	require.ErrorContains(t, err, "only a pruned receipt whose hash is kept may go")
}

// TestPrune_reopenAndRebuild: a pruned file opens, and its key index,
// rebuilt from the live receipts, serves the same answers.
func TestPrune_reopenAndRebuild(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "l.db")
	prunedFile(t, path, ledger.DefaultNamespace, 300)
	for _, rebuild := range []bool{false, true} {
		if rebuild {
			require.NoError(t, os.RemoveAll(sqlite.IndexPath(path)))
		}
		st, err := sqlite.OpenStore(ctx, path, quiet, false)
		require.NoError(t, err)
		l := ledger.New(st, ledger.Config{Logger: quiet.Logger})
		n, err := l.Default(ctx)
		require.NoError(t, err)
		_, err = n.Key(ctx, "pruned-0007", false)
		require.Equal(t, ledger.ECodePruned, ledger.ErrorCode(err), "rebuild %v: %v", rebuild, err)
		v, err := n.Key(ctx, "pruned-open", false)
		require.NoError(t, err)
		require.Equal(t, uint64(602), v.FirstSeq)
		r := testkit.MustReserve(t, n, testkit.ReserveReq(fmt.Sprintf("pruned-%04d", 10+btoi(rebuild)), "e9"))
		require.Equal(t, ledger.StatusReserved, r.Status, "a key pruned whole is new")
		require.NoError(t, l.Close())
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestPrune_forget: a pruned namespace forgotten is copied to a ledger
// file of its own that opens, pruned as it was.
func TestPrune_forget(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "l.db")
	prunedFile(t, path, "reports", 100)
	res, err := sqlite.ForgetNamespace(ctx, path, "reports", "ops", "moved out")
	require.NoError(t, err)
	require.True(t, res.Kept)
	st, err := sqlite.OpenStore(ctx, res.MovedTo, quiet, false)
	require.NoError(t, err)
	l := ledger.New(st, ledger.Config{Logger: quiet.Logger})
	defer l.Close()
	n, err := l.Default(ctx)
	require.NoError(t, err)
	h, err := n.Head(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(203), h.Seq)
	_, err = n.GetReceipt(ctx, 7)
	require.Equal(t, ledger.ECodePruned, ledger.ErrorCode(err))
	v, err := n.Key(ctx, "pruned-open", false)
	require.NoError(t, err)
	require.Equal(t, uint64(202), v.FirstSeq)
}

// TestPrune_secondWhileDeleting: a prune recorded while an earlier one's
// deletion is unfinished keeps the deleted prefix at the earlier one's
// progress (the later row starts after bodies still stored), and reads
// stay right throughout.
func TestPrune_secondWhileDeleting(t *testing.T) {
	ctx := context.Background()
	clock := testkit.NewClock()
	opts := quiet
	opts.Now, opts.KeyTTL = clock.Now, uint64(time.Hour.Milliseconds())
	st, err := sqlite.OpenStore(ctx, filepath.Join(t.TempDir(), "l.db"), opts, false)
	require.NoError(t, err)
	gate := make(chan struct{})
	batches := 0
	l := ledger.New(st, ledger.Config{Now: clock.Now, ArchiveDir: t.TempDir(), Logger: quiet.Logger, PruneStep: func(step string) {
		if step == "batch" {
			if batches++; batches == 1 {
				<-gate // the first deletion stops after its first batch
			}
		}
	}})
	defer l.Close()
	n, err := l.Default(ctx)
	require.NoError(t, err)
	_, err = n.SetPolicy(ctx, json.RawMessage(`{"archive":{"keep_ms":60000,"min_keep_ms":60000}}`), "ops")
	require.NoError(t, err)
	pairs := func(from, to int) {
		for i := from; i < to; i++ {
			key := fmt.Sprintf("second-%04d", i)
			r := testkit.MustReserve(t, n, testkit.ReserveReq(key, "e1"))
			testkit.MustCommit(t, n, testkit.Succeed(key, r.Reservation))
		}
	}
	skey, _, err := tlog.GenerateKey("ex.test")
	require.NoError(t, err)
	signer, err := note.NewSigner(skey)
	require.NoError(t, err)
	cp := &tlog.Checkpointer{Store: n, Signer: signer, Origin: "ex.test/default"}
	pairs(0, 600) // 2 … 1201
	clock.Advance(time.Hour + 2*time.Minute)
	testkit.MustReserve(t, n, testkit.ReserveReq("second-open", "e1")) // 1202
	_, err = cp.SignOnce(ctx)
	require.NoError(t, err)
	first, err := n.Prune(ctx, ledger.PruneRequest{Through: 700, Actor: "ops"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		m, err := n.Reader().Pruned(ctx)
		return err == nil && m.Kept > 0
	}, 5*time.Second, 5*time.Millisecond)
	m, err := n.Reader().Pruned(ctx)
	require.NoError(t, err)
	require.Less(t, m.Kept, uint64(700), "one batch deleted")
	_, err = cp.SignOnce(ctx)
	require.NoError(t, err)
	second, err := n.Prune(ctx, ledger.PruneRequest{Through: 1201, Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, uint64(701), second.From)
	m2, err := n.Reader().Pruned(ctx)
	require.NoError(t, err)
	require.Equal(t, m.Kept, m2.Kept, "the deleted prefix is still the first prune's progress")
	require.Equal(t, uint64(1201), m2.Through)
	tree, err := tlog.TreeHash(1203, n.HashReader(ctx))
	require.NoError(t, err)
	close(gate)
	require.NoError(t, n.DeletePruned(ctx))
	m3, err := n.Reader().Pruned(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1201), m3.Kept)
	after, err := tlog.TreeHash(1203, n.HashReader(ctx))
	require.NoError(t, err)
	require.Equal(t, tree, after)
	_, err = n.GetReceipt(ctx, 900)
	require.Equal(t, ledger.ECodePruned, ledger.ErrorCode(err))
	require.Equal(t, uint64(1203), first.Receipt.Seq)
}
