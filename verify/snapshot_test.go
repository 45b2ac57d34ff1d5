package verify_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/testkit/storetest"
	"github.com/effect-ledger/effect-ledger/verify"
)

// TestVerifier_incrementalBesideWriter: incremental runs of a database that
// ledgerd appends to meanwhile check the chain and the key states up to
// one head (see checkIncrementalBesideWriter).
func TestVerifier_incrementalBesideWriter(t *testing.T) {
	db := ledgertest.Open(t)
	rd, err := sqlite.OpenReader(context.Background(), db.Path(), sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	checkIncrementalBesideWriter(t, db, true, func(opts verify.Opts) *verify.Verifier { return verify.New(rd, opts) })
}

// TestVerifier_remoteIncrementalBesideWriter: the same over the API, where
// the chain and each touched key's history are read by separate requests.
// Its repeated failures are not checked: an online incremental run sees
// the failures of the keys it touched only, and the first failure here is
// older.
func TestVerifier_remoteIncrementalBesideWriter(t *testing.T) {
	db := ledgertest.Open(t)
	srv := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	t.Cleanup(srv.Close)
	remote := server(t, srv.URL)
	checkIncrementalBesideWriter(t, db, false, func(opts verify.Opts) *verify.Verifier {
		return verify.NewRemote(remote, opts)
	})
}

// checkIncrementalBesideWriter runs incremental verifications, each from
// the head of the one before, while a writer appends keys that are
// reserved and then fail. A run from pin P to head H must list exactly
// the failed keys whose commit is in (P, H]: one fewer means a receipt
// pinned unchecked (the next run starts after it), one more, or one past
// H, a key state read beyond the chain checked. With repeats, the repeated
// failures are checked too (checkRepeats).
func checkIncrementalBesideWriter(t *testing.T, db *ledgertest.DB, repeats bool, newVerifier func(verify.Opts) *verify.Verifier) {
	ctx := context.Background()
	first := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-first", "exec-1"))
	ledgertest.MustCommit(t, db, testkit.Fail("key-first", first.Reservation, false))
	rep, err := newVerifier(verify.Opts{}).Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep.Violations)

	storetest.UntilDone(t, storetest.AppendFailures(t, db.Namespace, 400), func(runs int) {
		pin := rep.Head
		rep, err = newVerifier(verify.Opts{Pinned: &pin, Incremental: true}).Check(ctx)
		require.NoError(t, err)
		require.True(t, rep.OK, "run %d: %+v", runs, rep.Violations)
		for _, f := range rep.Audit.Failed {
			require.True(t, f.Seq > pin.Seq && f.Seq <= rep.Head.Seq, "run %d from %d to %d lists failed key %s at %d",
				runs, pin.Seq, rep.Head.Seq, f.Key, f.Seq)
		}
		// Receipts come in pairs, reserve then commit: the commits are the even seqs.
		require.Len(t, rep.Audit.Failed, int(rep.Head.Seq/2-pin.Seq/2), "run %d from %d to %d", runs, pin.Seq, rep.Head.Seq)
		if repeats {
			checkRepeats(t, rep, pin.Seq, runs)
		}
	})
}

// TestVerifier_fullBesideWriter: a full run of the store ledgerd serves
// from reads the derived key records after the chain, in a newer snapshot:
// keys ledgerd changed meanwhile differ, however many they are, and are
// re-checked, never reported (the bound on re-checks is lowered to 2 here
// so that a few appends exceed it). Its repeated failures are those up to
// its head: an incremental run pinned there lists only later ones.
func TestVerifier_fullBesideWriter(t *testing.T) {
	ctx := context.Background()
	db := ledgertest.Open(t)
	verify.SetMaxSuspects(t, 2)
	first := ledgertest.MustReserve(t, db, testkit.ReserveReq("key-first", "exec-1"))
	ledgertest.MustCommit(t, db, testkit.Fail("key-first", first.Reservation, false))
	storetest.UntilDone(t, storetest.AppendFailures(t, db.Namespace, 600), func(runs int) {
		rep, err := verify.New(db.Namespace.Audit(), verify.Opts{}).Check(ctx)
		require.NoError(t, err)
		require.True(t, rep.OK, "run %d to %d: %+v", runs, rep.Head.Seq, rep.Violations)
		checkRepeats(t, rep, 0, runs)
	})
}

// checkRepeats checks a run's repeated failures: every key runs the same
// call, so each reserve after the first failure (seq 2), at the odd seqs
// from 3, repeats it. A run from pin (0: a full run) to its head lists the
// one group when a repeat falls in that range, with every repeat up to
// the head.
func checkRepeats(t *testing.T, rep *verify.Report, pin uint64, run int) {
	t.Helper()
	head := rep.Head.Seq
	repeatsTo := func(seq uint64) int { return int(max(seq, 1)-1) / 2 } // the repeats at seqs up to seq
	if repeatsTo(head) == repeatsTo(pin) {
		require.Empty(t, rep.Audit.RepeatedFailures, "run %d from %d to %d", run, pin, head)
		return
	}
	require.Len(t, rep.Audit.RepeatedFailures, 1, "run %d from %d to %d", run, pin, head)
	g := rep.Audit.RepeatedFailures[0]
	require.Len(t, g.Keys, 1+repeatsTo(head), "run %d from %d to %d: seqs %v", run, pin, head, g.Seqs)
	require.LessOrEqual(t, g.Seqs[len(g.Seqs)-1], head, "run %d from %d to %d", run, pin, head)
}
