package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

var errInjected = fmt.Errorf("injected disk failure: %w", ledger.ErrIO)

// TestDB_failedBatch fails every batch at COMMIT while concurrent requests
// run: each gets ErrUnavailable, nothing is appended, and afterwards the
// writer's in-memory state agrees with the database (reserves, commits and
// replays behave as if the failed requests never happened).
func TestDB_failedBatch(t *testing.T) {
	db, _ := MustOpenDB(t)
	var failing atomic.Bool
	db.SetBeforeCommit(func() error {
		if failing.Load() {
			return errInjected
		}
		return nil
	})
	ctx := context.Background()
	done := mustReserve(t, db, reserveReq("done-key-0001", "exec-1"))
	mustCommit(t, db, succeed("done-key-0001", done.Reservation))
	open := mustReserve(t, db, reserveReq("open-key-0001", "exec-1"))
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
				_, err = db.Reserve(ctx, reserveReq(fmt.Sprintf("new-key-%04d", i), "exec-x"))
			case 1:
				_, err = db.Reserve(ctx, reserveReq("done-key-0001", fmt.Sprintf("exec-%d", i)))
			case 2:
				_, err = db.Commit(ctx, succeed("open-key-0001", open.Reservation))
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
	assert.Error(t, db.Ready(ctx), "not ready while writes fail")

	failing.Store(false)
	// The first check after a failure is never ready: its probe write
	// succeeds and makes the next check ready.
	assert.Error(t, db.Ready(ctx), "the first check after a failed write is not ready")
	require.NoError(t, db.Ready(ctx))
	// The new keys were never recorded: they reserve as new.
	res := mustReserve(t, db, reserveReq("new-key-0000", "exec-x"))
	assert.Equal(t, ledger.StatusReserved, res.Status)
	assert.Equal(t, head.Seq+1, res.Receipt.Seq)
	// The open reservation is still open: its commit is the first one.
	c := mustCommit(t, db, succeed("open-key-0001", open.Reservation))
	assert.False(t, c.Replayed)
	// The succeeded key still replays.
	rep := mustReserve(t, db, reserveReq("done-key-0001", "exec-2"))
	assert.Equal(t, ledger.StatusReplayed, rep.Status)
	verifyChain(t, db)
}

// TestDB_linger: with a long Linger, a lone request on an idle ledger is
// written at once, and requests under load still all commit (the writer
// gathers them into batches; none waits for more than the linger).
func TestDB_linger(t *testing.T) {
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "ledger.db"), sqlite.Options{
		Linger: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer db.Close()
	start := time.Now()
	_, err = db.Reserve(context.Background(), reserveReq("lone-key-01", "e"))
	require.NoError(t, err)
	require.Less(t, time.Since(start), time.Second, "an idle ledger does not linger")

	var wg sync.WaitGroup
	start = time.Now()
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 5 {
				_, err := db.Reserve(context.Background(), reserveReq(fmt.Sprintf("load-key-%d-%d", i, j), "e"))
				assert.NoError(t, err)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, uint64(161), db.Head().Seq)
	// 160 requests in rounds of 32: a round that fills the previous
	// batch's size never waits out the linger.
	assert.Less(t, time.Since(start), 10*time.Second)
}
