package postgres

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// Retry bounds of Write: a run that failed with a serialization failure,
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

// SQL of a Write's transaction and of the batches it leaves.
const (
	// The heads of an update's namespaces, locked in the order of their
	// names (LockRows runs above the Sort).
	sqlBeginHeads = `SELECT namespace, seq, hash, recorded_at, policy_seq, ` + sqlNowMS + `, pg_backend_pid(),
		(SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())
		FROM head WHERE namespace = ANY($1) ORDER BY namespace FOR UPDATE`

	sqlPruneBatches = `DELETE FROM batches WHERE committed_at < $1`
)

// Write runs the batches, each on its namespace, in one transaction that
// holds their head rows FOR UPDATE, locked in the order of their names
// (so that two writes never deadlock), with one COMMIT
// (ledger.Store.Write). The batches run again, from a fresh transaction,
// after a serialization failure, a deadlock, a connection lost before
// COMMIT, or a COMMIT whose lost reply was resolved as not committed. A
// batch's own failure comes back as a *ledger.PartError naming it; a
// COMMIT whose outcome could not be learnt returns
// ledger.ErrCommitUnknown; a database that stays unreachable wraps
// ledger.ErrUnavailable.
func (s *Store) Write(ctx context.Context, batches []ledger.Batch) error {
	ps := make([]part, len(batches))
	seen := make(map[string]bool, len(batches))
	for i, b := range batches {
		if seen[b.NS] {
			return &ledger.PartError{Part: i, Err: fmt.Errorf("write: namespace %s twice in one write", b.NS)}
		}
		seen[b.NS] = true
		c, err := s.chain(ctx, b.NS)
		if err != nil {
			return &ledger.PartError{Part: i, Err: err}
		}
		ps[i] = part{c: c, keys: b.Keys, fn: func(ctx context.Context, tx ledger.Tx) error {
			if err := b.Run(ctx, tx); err != nil {
				return &ledger.PartError{Part: i, Err: err}
			}
			return nil
		}}
	}
	return s.update(ctx, ps)
}

// part is one namespace's share of an update.
type part struct {
	c    *Chain
	fn   func(ctx context.Context, tx ledger.Tx) error
	keys []string // read ahead with the heads
}

// groupName names the namespaces of parts in logs and errors.
func groupName(parts []part) string {
	if len(parts) == 1 {
		return parts[0].c.ns
	}
	return fmt.Sprintf("%s and %d other namespaces", parts[0].c.ns, len(parts)-1)
}

// update runs parts in one transaction, again after a retryable failure.
func (s *Store) update(ctx context.Context, parts []part) error {
	if s.opts.ReadOnly {
		return ledger.ErrOpenedReadOnly
	}
	name := groupName(parts)
	start := time.Now()
	for run := 1; ; run++ {
		err := s.run(ctx, parts)
		var re *runError
		if !errors.As(err, &re) {
			return err // nil, or fn's own error
		}
		if ctx.Err() != nil {
			return fmt.Errorf("update %s: %w", name, ctx.Err())
		}
		if !re.retry || run >= retryRuns || time.Since(start) > retryBudget {
			if re.retry {
				s.log.Warn("postgres: update failed after retries", "ns", name, "runs", run, "err", re.err)
			}
			if i := re.part - 1; !re.retry && i >= 0 && len(parts) > 1 {
				return &ledger.PartError{Part: i, Err: fmt.Errorf("update %s: %w", parts[i].c.ns, classify(re.err))}
			}
			if !re.retry && re.split && len(parts) > 1 {
				return &ledger.PartError{Part: -1, Err: fmt.Errorf("update %s: %w", name, classify(re.err))}
			}
			return fmt.Errorf("update %s: %w", name, classify(re.err))
		}
		wait := min(retryBase<<(run-1), retryMaxWait)
		wait = wait/2 + mrand.N(wait/2+1)
		s.log.Debug("postgres: retrying update", "ns", name, "run", run, "wait", wait, "err", re.err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("update %s: %w", name, ctx.Err())
		case <-t.C:
		}
	}
}

// runError is a failure of the driver (not of fn) in one run.
type runError struct {
	err   error
	retry bool
	// part is 1 + the index of the part the failure is pinned on (its
	// read failed, its lone writes were refused), 0 when none is; split:
	// the database refused the writes of several parts (before COMMIT),
	// which one's is not known. Either way the other parts may run again
	// alone (ledger.PartError).
	part  int
	split bool
}

func (e *runError) Error() string { return e.err.Error() }
func (e *runError) Unwrap() error { return e.err }

// run is one run of an update: BEGIN … COMMIT on one connection, the
// parts' fns in order, each on its own namespace's tx.
func (s *Store) run(ctx context.Context, parts []part) error {
	name := groupName(parts)
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("update %s: %w", name, ctx.Err())
		}
		return &runError{err: fmt.Errorf("connect: %w", err), retry: isConnErr(err)}
	}
	defer pc.Release() // destroyed unless idle
	conn := pc.Conn()
	fail := func(err error) error {
		rollback(conn)
		if ctx.Err() != nil {
			return fmt.Errorf("update %s: %w", name, ctx.Err())
		}
		return &runError{err: err, retry: retryable(err) || conn.IsClosed() && !isServerRefusal(err)}
	}

	ts, err := begin(ctx, conn, parts)
	var mh *lostHead
	if errors.As(err, &mh) {
		rollback(conn)
		err = fmt.Errorf("update %s: %w", name, err)
		if len(parts) > 1 {
			return &ledger.PartError{Part: slices.IndexFunc(parts, func(p part) bool { return p.c.ns == mh.ns }), Err: err}
		}
		return err
	}
	if err != nil {
		return fail(fmt.Errorf("begin: %w", err))
	}

	var dirty []*tx
	for i, p := range parts {
		t := ts[i]
		if err := p.fn(ctx, t); err != nil {
			if t.dbErr != nil && (retryable(t.dbErr) || conn.IsClosed()) && ctx.Err() == nil {
				rollback(conn)
				return &runError{err: t.dbErr, retry: true}
			}
			rollback(conn)
			return err
		}
		if t.dbErr != nil { // fn swallowed a failed read: the transaction is unusable
			err := fail(t.dbErr)
			if re, ok := err.(*runError); ok {
				re.part = i + 1
			}
			return err
		}
		if t.dirty() {
			dirty = append(dirty, t)
		}
	}
	if len(dirty) == 0 {
		rollback(conn)
		return nil
	}

	var b pgx.Batch
	batchID := queueWrites(&b, dirty)
	if err := send(ctx, conn, &b, len(dirty)); err != nil {
		err = fail(headBehind(err, name))
		if re, ok := err.(*runError); ok && isServerRefusal(err) {
			if len(dirty) == 1 {
				re.part = 1 + slices.IndexFunc(parts, func(p part) bool { return p.c == dirty[0].c })
			} else {
				re.split = true
			}
		}
		return err
	}
	if h := s.testHook.beforeCommit; h != nil {
		h(dirty[0].pid)
	}
	// One COMMIT for every part: a lost reply is resolved by the first
	// part's batch row, which committed with all the others or not at all.
	if err := dirty[0].c.commit(ctx, dirty[0], batchID, fail); err != nil {
		return err
	}
	for _, t := range dirty {
		t.c.committed(t)
	}
	return nil
}

// missingHead: a namespace of an update has no head row. Nothing is
// written to it (headcheck.go): 503 storage_corrupt, never a chain
// started again from seq 1.
func missingHead(ns string) *lostHead {
	return &lostHead{ns: ns, what: "its head row is missing"}
}

// begin starts the transaction on conn and reads, in one round trip, the
// parts' heads under their row locks (taken in the order of the
// namespaces' names), the database clock, and then, under those locks,
// the records of the parts' keys and the receipts they point at.
func begin(ctx context.Context, conn *pgx.Conn, parts []part) ([]*tx, error) {
	names := make([]string, len(parts))
	ts := make([]*tx, len(parts))
	byNS := make(map[string]*tx, len(parts))
	var keyNS, keys []string
	for i, p := range parts {
		names[i] = p.c.ns
		ts[i] = &tx{c: p.c, conn: conn}
		byNS[p.c.ns] = ts[i]
		for _, k := range p.keys {
			keyNS, keys = append(keyNS, p.c.ns), append(keys, k)
		}
		if len(p.keys) > 0 {
			ts[i].preloaded(p.keys)
		}
	}
	var b pgx.Batch
	b.Queue(`BEGIN ISOLATION LEVEL READ COMMITTED`)
	b.Queue(sqlWriterMark)
	b.Queue(sqlBeginHeads, names)
	pruned := len(parts) > 0 && parts[0].c.s.version >= pruneSchema
	if pruned {
		// its own statement, so that it reads the prunes committed while
		// it waited for the head locks (sqlBeginPruned)
		b.Queue(sqlBeginPruned, names)
	}
	if len(keys) > 0 {
		b.Queue(sqlPreloadGroupKeys, keyNS, keys)
		b.Queue(sqlPreloadGroupReceipts, keyNS, keys)
	}
	br := conn.SendBatch(ctx, &b)
	_, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		err = readHeads(br, byNS)
	}
	if err == nil && pruned {
		err = readPruned(br, ts, names)
	}
	if err == nil && len(keys) > 0 {
		err = readPreload(br, ts, names)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		for ns := range byNS {
			return nil, missingHead(ns)
		}
	}
	return ts, err
}

// readHeads reads begin's head rows into the txs of byNS, deleting each
// it reads (what is left has no head row).
func readHeads(br pgx.BatchResults, byNS map[string]*tx) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var ns string
		var hash []byte
		var seq, recordedAt, policySeq, clock int64
		var pid uint32
		var start pgtype.Timestamptz
		if err := rows.Scan(&ns, &seq, &hash, &recordedAt, &policySeq, &clock, &pid, &start); err != nil {
			return err
		}
		t := byNS[ns]
		if t == nil {
			return fmt.Errorf("the head of %s, which was not asked for", ns)
		}
		delete(byNS, ns)
		t.head.Seq, t.policySeq, t.pid, t.backendStart = uint64(seq), uint64(policySeq), pid, start.Time
		if t.head.Hash, err = chain.HashFromBytes(hash); err != nil {
			return err
		}
		t.oldHead, t.oldRecordedAt = t.head, uint64(recordedAt)
		if now, ok := t.c.s.now(); ok {
			clock = int64(now)
		}
		// never before the head's recorded_at: recorded_at does not
		// decrease within a chain, whatever the clock (or Options.Now) says
		t.now = max(uint64(clock), uint64(recordedAt))
	}
	return rows.Err()
}

// readPreload reads begin's key records and receipts into ts (names[i]
// is ts[i]'s namespace).
func readPreload(br pgx.BatchResults, ts []*tx, names []string) error {
	byNS := make(map[string]*tx, len(ts))
	for i, t := range ts {
		byNS[names[i]] = t
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	for rows.Next() {
		var ns string
		var k ledger.KeyRecord
		var token []byte
		if err := scanKey(prefixed{rows, &ns}, &k, true, &token); err != nil {
			rows.Close()
			return err
		}
		k.TokenHash = string(token)
		if t := byNS[ns]; t != nil {
			t.loaded[k.Key] = &k
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if rows, err = br.Query(); err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var ns string
		r, err := scanReceipt(prefixed{rows, &ns})
		if err != nil {
			return err
		}
		if t := byNS[ns]; t != nil {
			if t.loadedRcpt == nil {
				t.loadedRcpt = map[uint64]chain.Receipt{}
			}
			t.loadedRcpt[r.Seq] = r
		}
	}
	return rows.Err()
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
	s.analyzeYoung()
	if prune {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := s.pool.Exec(ctx, sqlPruneBatches, int64(t.now)-batchesKeepMS); err != nil {
			s.log.Warn("postgres: pruning batches", "err", err)
		}
	}
}
