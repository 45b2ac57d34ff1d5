package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

var errInjected = fmt.Errorf("injected disk failure: %w", ledger.ErrIO)

// TestStore_failedBatch fails every batch at COMMIT while concurrent requests
// run: each gets ErrUnavailable, nothing is appended, and afterwards the
// writer's in-memory state agrees with the database (reserves, commits and
// replays behave as if the failed requests never happened).
func TestStore_failedBatch(t *testing.T) {
	db := ledgertest.Open(t)
	var failing atomic.Bool
	db.Store.SetBeforeCommit(func() error {
		if failing.Load() {
			return errInjected
		}
		return nil
	})
	ctx := context.Background()
	done := ledgertest.MustReserve(t, db, testkit.ReserveReq("done-key-0001", "exec-1"))
	ledgertest.MustCommit(t, db, testkit.Succeed("done-key-0001", done.Reservation))
	open := ledgertest.MustReserve(t, db, testkit.ReserveReq("open-key-0001", "exec-1"))
	head := db.Head()

	failing.Store(true)
	var wg sync.WaitGroup
	var unavailable atomic.Int32
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			switch i % 3 {
			case 0:
				_, err = db.Reserve(ctx, testkit.ReserveReq(fmt.Sprintf("new-key-%04d", i), "exec-x"))
			case 1:
				_, err = db.Reserve(ctx, testkit.ReserveReq("done-key-0001", fmt.Sprintf("exec-%d", i)))
			case 2:
				_, err = db.Commit(ctx, testkit.Succeed("open-key-0001", open.Reservation))
			}
			if errors.Is(err, ledger.ErrUnavailable) && ledger.ErrorCode(err) == ledger.ECodeUnavailable {
				unavailable.Add(1)
			} else {
				t.Errorf("request %d: got %v, want unavailable", i, err)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int32(24), unavailable.Load())
	assert.Equal(t, head, db.Head(), "nothing appended")
	assert.Error(t, db.Ledger.Ready(ctx), "not ready while writes fail")

	failing.Store(false)
	// The first check after a failure is never ready: its probe write
	// succeeds and makes the next check ready.
	assert.Error(t, db.Ledger.Ready(ctx), "the first check after a failed write is not ready")
	require.NoError(t, db.Ledger.Ready(ctx))
	// The new keys were never recorded: they reserve as new.
	res := ledgertest.MustReserve(t, db, testkit.ReserveReq("new-key-0000", "exec-x"))
	assert.Equal(t, ledger.StatusReserved, res.Status)
	assert.Equal(t, head.Seq+1, res.Receipt.Seq)
	// The open reservation is still open: its commit is the first one.
	c := ledgertest.MustCommit(t, db, testkit.Succeed("open-key-0001", open.Reservation))
	assert.False(t, c.Replayed)
	// The succeeded key still replays.
	rep := ledgertest.MustReserve(t, db, testkit.ReserveReq("done-key-0001", "exec-2"))
	assert.Equal(t, ledger.StatusReplayed, rep.Status)
	ledgertest.VerifyChain(t, db)
}
