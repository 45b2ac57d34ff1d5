package storetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/verify"
)

// testVerifyBesideWriter runs full and incremental verifications of the
// default namespace, each incremental one from the head of the run before,
// while a writer appends keys that are reserved and then fail. The
// driver's reads are separate snapshots (the chain, the keys in key order,
// the stored key records, the groupings), and every run must still check
// one head: no violation, and exactly the failed keys whose commit is up
// to that head (after the pin, for an incremental run).
func testVerifyBesideWriter(t *testing.T, f Factory) {
	ctx := context.Background()
	_, _, n := openDefault(t, f)
	r := testkit.MustReserve(t, n, testkit.ReserveReq("key-first", "exec"))
	testkit.MustCommit(t, n, testkit.Fail("key-first", r.Reservation, false))
	rep, err := verify.New(auditDB(t, n), verify.Opts{}).Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep.Violations)

	UntilDone(t, AppendFailures(t, n, 300), func(runs int) {
		opts, pin := verify.Opts{}, rep.Head
		if runs%2 == 1 {
			opts.Pinned, opts.Incremental = &pin, true
		} else {
			pin.Seq = 0
		}
		rep, err = verify.New(auditDB(t, n), opts).Check(ctx)
		require.NoError(t, err)
		require.True(t, rep.OK, "run %d from %d to %d: %+v", runs, pin.Seq, rep.Head.Seq, rep.Violations)
		for _, k := range rep.Audit.Failed {
			require.True(t, k.Seq > pin.Seq && k.Seq <= rep.Head.Seq, "run %d from %d to %d lists failed key %s at %d",
				runs, pin.Seq, rep.Head.Seq, k.Key, k.Seq)
		}
		// Receipts come in pairs, reserve then commit: the commits are the even seqs.
		require.Len(t, rep.Audit.Failed, int(rep.Head.Seq/2-pin.Seq/2), "run %d from %d to %d", runs, pin.Seq, rep.Head.Seq)
	})
}

// UntilDone calls run with 0, 1, … until done, the channel of
// AppendFailures, has the writer's error; then it requires that error to
// be nil and run to have run at least once.
func UntilDone(t *testing.T, done <-chan error, run func(runs int)) {
	t.Helper()
	for runs := 0; ; runs++ {
		select {
		case err := <-done:
			require.NoError(t, err)
			require.Positive(t, runs)
			return
		default:
		}
		run(runs)
	}
}

// AppendFailures appends to n, on a goroutine of its own, keys that are
// reserved and then fail (all the same call), and sends its error (nil when all are written)
// on the channel it returns. The test's cleanup stops it and waits.
func AppendFailures(t *testing.T, n *ledger.Namespace, keys int) <-chan error {
	ctx := context.Background()
	errc, stop, exited := make(chan error, 1), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		errc <- func() error {
			for i := range keys {
				select {
				case <-stop:
					return nil
				default:
				}
				key := fmt.Sprintf("beside-%06d", i)
				r, err := n.Reserve(ctx, testkit.ReserveReq(key, "exec"))
				if err != nil {
					return err
				}
				if _, err := n.Commit(ctx, testkit.Fail(key, r.Reservation, false)); err != nil {
					return err
				}
			}
			return nil
		}()
	}()
	t.Cleanup(func() {
		close(stop)
		<-exited
	})
	return errc
}
