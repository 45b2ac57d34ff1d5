package postgres

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Retry bounds of Update: a run that failed with a serialization failure,
// a deadlock or a lost connection (before COMMIT) runs again after a
// jittered backoff of retryBase·2ⁿ (at most retryMaxWait), at most
// retryRuns runs within retryBudget. A lost COMMIT reply is resolved
// within resolveBudget.
var (
	retryRuns     = 6
	retryBase     = 5 * time.Millisecond
	retryMaxWait  = 500 * time.Millisecond
	retryBudget   = 10 * time.Second
	resolveBudget = 20 * time.Second
	commitTimeout = 30 * time.Second
)

// batchesKeepMS is how long batch ids are kept for resolving lost COMMITs;
// pruneEvery Updates of a Store prune older ones.
const (
	batchesKeepMS = 24 * 60 * 60 * 1000
	pruneEvery    = 256
)

// SQL of an Update's transaction and of the batches it leaves.
const (
	sqlBeginHead = `SELECT seq, hash, recorded_at, policy_seq, ` + sqlNowMS + `, pg_backend_pid(),
		(SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())
		FROM head WHERE namespace = $1 FOR UPDATE`

	sqlPruneBatches = `DELETE FROM batches WHERE committed_at < $1`
)

// Update runs fn in one write transaction holding the namespace's head
// row FOR UPDATE, and returns after COMMIT. fn runs again, from a fresh
// transaction, after a serialization failure, a deadlock, a connection
// lost before COMMIT, or a COMMIT whose lost reply was resolved as not
// committed. An error from fn is returned as is; a COMMIT whose outcome
// could not be learnt returns ledger.ErrCommitUnknown; a database that
// stays unreachable wraps ledger.ErrUnavailable.
func (c *Chain) Update(ctx context.Context, fn func(ctx context.Context, tx ledger.Tx) error) error {
	s := c.s
	if s.opts.ReadOnly {
		return ledger.ErrOpenedReadOnly
	}
	start := time.Now()
	for run := 1; ; run++ {
		err := c.run(ctx, fn)
		var re *runError
		if !errors.As(err, &re) {
			return err // nil, or fn's own error
		}
		if ctx.Err() != nil {
			return fmt.Errorf("update %s: %w", c.ns, ctx.Err())
		}
		if !re.retry || run >= retryRuns || time.Since(start) > retryBudget {
			if re.retry {
				s.log.Warn("postgres: update failed after retries", "ns", c.ns, "runs", run, "err", re.err)
			}
			return fmt.Errorf("update %s: %w", c.ns, classify(re.err))
		}
		wait := min(retryBase<<(run-1), retryMaxWait)
		wait = wait/2 + mrand.N(wait/2+1)
		s.log.Debug("postgres: retrying update", "ns", c.ns, "run", run, "wait", wait, "err", re.err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("update %s: %w", c.ns, ctx.Err())
		case <-t.C:
		}
	}
}

// runError is a failure of the driver (not of fn) in one run.
type runError struct {
	err   error
	retry bool
}

func (e *runError) Error() string { return e.err.Error() }
func (e *runError) Unwrap() error { return e.err }

// run is one run of an Update: BEGIN … COMMIT on one connection.
func (c *Chain) run(ctx context.Context, fn func(ctx context.Context, tx ledger.Tx) error) error {
	s := c.s
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("update %s: %w", c.ns, ctx.Err())
		}
		return &runError{err: fmt.Errorf("connect: %w", err), retry: isConnErr(err)}
	}
	defer pc.Release() // destroyed unless idle
	conn := pc.Conn()
	fail := func(err error) error {
		rollback(conn)
		if ctx.Err() != nil {
			return fmt.Errorf("update %s: %w", c.ns, ctx.Err())
		}
		return &runError{err: err, retry: retryable(err) || conn.IsClosed() && !isServerRefusal(err)}
	}

	t, err := c.begin(ctx, conn)
	if errors.Is(err, pgx.ErrNoRows) {
		rollback(conn)
		return fmt.Errorf("update %s: the head row is missing", c.ns)
	}
	if err != nil {
		return fail(fmt.Errorf("begin: %w", err))
	}

	if err := fn(ctx, t); err != nil {
		if t.dbErr != nil && (retryable(t.dbErr) || conn.IsClosed()) && ctx.Err() == nil {
			rollback(conn)
			return &runError{err: t.dbErr, retry: true}
		}
		rollback(conn)
		return err
	}
	if t.dbErr != nil { // fn swallowed a failed read: the transaction is unusable
		return fail(t.dbErr)
	}
	if !t.dirty() {
		rollback(conn)
		return nil
	}

	batchID, err := t.write(ctx)
	if err != nil {
		return fail(err)
	}
	if h := s.testHook.beforeCommit; h != nil {
		h(t.pid)
	}
	if err := c.commit(ctx, t, batchID, fail); err != nil {
		return err
	}
	c.committed(t)
	return nil
}

// begin starts the transaction on conn and reads the namespace's head
// under its row lock and the database clock, in one round trip.
func (c *Chain) begin(ctx context.Context, conn *pgx.Conn) (*tx, error) {
	t := &tx{c: c, conn: conn}
	var b pgx.Batch
	b.Queue(`BEGIN ISOLATION LEVEL READ COMMITTED`)
	b.Queue(sqlWriterMark)
	b.Queue(sqlBeginHead, c.ns)
	br := conn.SendBatch(ctx, &b)
	_, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		var hash []byte
		var recordedAt, policySeq, clock int64
		var start pgtype.Timestamptz
		err = br.QueryRow().Scan(&t.head.Seq, &hash, &recordedAt, &policySeq, &clock, &t.pid, &start)
		t.policySeq = uint64(policySeq)
		if err == nil {
			t.head.Hash, err = chain.HashFromBytes(hash)
		}
		t.backendStart = start.Time
		t.oldHead, t.oldRecordedAt = t.head, uint64(recordedAt)
		if now, ok := c.s.now(); ok {
			clock = int64(now)
		}
		// never before the head's recorded_at: recorded_at does not
		// decrease within a chain, whatever the clock (or Options.Now) says
		t.now = max(uint64(clock), uint64(recordedAt))
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return t, err
}

// commit sends t's COMMIT and returns nil once the batch batchID is
// committed; a lost reply is resolved (resolve) before it answers. fail
// is run's ending of a failed run.
func (c *Chain) commit(ctx context.Context, t *tx, batchID string, fail func(error) error) error {
	// The COMMIT is not cancelled with ctx: once it is sent, only its
	// reply tells whether it happened.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	tag, err := t.conn.Exec(cctx, "COMMIT")
	cancel()
	switch {
	case err == nil && tag.String() == "COMMIT":
	case err == nil:
		return &runError{err: fmt.Errorf("commit: the server answered %s", tag.String())}
	case isServerRefusal(err) && !t.conn.IsClosed():
		rollback(t.conn)
		return fail(fmt.Errorf("commit: %w", err))
	default:
		// Any other failure leaves the outcome open, even one that
		// pgconn.SafeToRetry calls safe: pgx v5.12 reports a reply lost
		// after the COMMIT was sent as "conn closed", a lock error that
		// claims nothing was sent (seen in TestChain_Update_LostCommit).
		_ = t.conn.Close(context.Background())
		c.s.log.Warn("postgres: COMMIT reply lost; resolving", "ns", c.ns, "batch", batchID, "backend_pid", t.pid, "err", err)
		committed, rerr := c.resolve(ctx, batchID, t.pid, t.backendStart)
		if rerr != nil {
			c.s.log.Error("postgres: COMMIT outcome unknown", "ns", c.ns, "batch", batchID, "err", rerr)
			return fmt.Errorf("update %s: batch %s: %w: %w", c.ns, batchID, ledger.ErrCommitUnknown, rerr)
		}
		c.s.log.Info("postgres: lost COMMIT resolved", "ns", c.ns, "batch", batchID, "committed", committed)
		if !committed {
			return &runError{err: fmt.Errorf("commit: %w", err), retry: true}
		}
	}
	return nil
}

// isServerRefusal reports whether err is the server's ERROR answer to a
// statement (the session survives), as opposed to a lost connection or a
// FATAL that ended the session.
func isServerRefusal(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Severity == "ERROR" && !isConnErr(err)
}

// rollback ends a transaction on conn, or closes conn when that fails (the
// pool then drops it).
func rollback(conn *pgx.Conn) {
	if conn.IsClosed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Close(ctx)
	}
}

// resolve learns whether the batch batchID committed, after its COMMIT
// reply was lost: on a new connection it terminates the old backend
// (pid, started at start) if it still runs, then waits for the
// namespace's head row lock, which the old transaction held until it
// ended, and looks the batch up.
func (c *Chain) resolve(ctx context.Context, batchID string, pid uint32, start time.Time) (bool, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveBudget)
	defer cancel()
	var last error
	for attempt := 0; ; attempt++ {
		committed, err := c.lookupBatch(rctx, batchID, pid, start)
		if err == nil {
			return committed, nil
		}
		last = err
		wait := min(retryBase<<min(attempt, 10), time.Second)
		select {
		case <-rctx.Done():
			return false, last
		case <-time.After(wait):
		}
	}
}

func (c *Chain) lookupBatch(ctx context.Context, batchID string, pid uint32, start time.Time) (bool, error) {
	pc, err := c.s.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer pc.Release()
	conn := pc.Conn()
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE pid = $1 AND backend_start = $2`, int64(pid), start); err != nil {
		return false, err
	}
	var found bool
	err = pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT 1 FROM head WHERE namespace = $1 FOR UPDATE`, c.ns); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM batches WHERE batch_id = $1)`, batchID).Scan(&found)
	})
	return found, err
}

// committed runs after a confirmed COMMIT: the tree hashes enter the
// cache and the ended keys are announced to this Store's callbacks (other
// Stores hear them through NOTIFY).
func (c *Chain) committed(t *tx) {
	s := c.s
	tc := s.treeCache(c.ns)
	tc.add(t.hashFrom, t.hashes)
	s.mu.Lock()
	s.updates++
	prune := s.updates%pruneEvery == 0
	fns := s.onEnded
	s.mu.Unlock()
	if len(t.ended) > 0 {
		for _, fn := range fns {
			fn(c.ns, append([]string(nil), t.ended...))
		}
	}
	if prune {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := s.pool.Exec(ctx, sqlPruneBatches, int64(t.now)-batchesKeepMS); err != nil {
			s.log.Warn("postgres: pruning batches", "err", err)
		}
	}
}
