package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// writerDriver opens the writer's connection with automatic WAL
// checkpoints off: SQLite would otherwise run them inside the COMMIT of
// whichever batch crosses the threshold, on the single writer's path. The
// checkpointer below runs them on a connection of its own instead.
// writerDriverName (driver_cgo.go, driver_modernc.go) registers it: it
// runs writerPragmas on every new connection.
const writerDriver = "sqlite3-ledger-writer"

var writerPragmas = []string{
	`PRAGMA wal_autocheckpoint = 0`,
	// Keep the WAL file from staying huge after a burst.
	`PRAGMA journal_size_limit = 67108864`,
}

// Checkpointing policy: a PASSIVE checkpoint (never blocks the writer or
// readers) once this many write operations have committed since the last
// one, or after checkpointEvery when any have.
const (
	checkpointOps   = 512
	checkpointEvery = time.Second
)

// checkpointer copies WAL frames into the database file off the writer's
// path. It is woken after every batch and decides by the count of
// operations committed since its last run.
type checkpointer struct {
	db    *sql.DB // one read-write connection of its own
	kick  chan struct{}
	stop  chan struct{}
	done  chan struct{}
	ops   func() int64
	onErr func(error)
	once  sync.Once
	err   error
	// purge is set when an erasure committed (or was found unpurged at
	// open): the next runs truncate the WAL until it is empty, then mark
	// the erasures purged (SPEC §14).
	purge atomic.Bool
}

func newCheckpointer(conn *sql.DB, ops func() int64, onErr func(error)) *checkpointer {
	c := &checkpointer{db: conn, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		ops: ops, onErr: onErr}
	go c.run()
	return c
}

func (c *checkpointer) run() {
	defer close(c.done)
	last := c.ops()
	tick := time.NewTicker(checkpointEvery)
	defer tick.Stop()
	for {
		timed := false
		select {
		case <-c.stop:
			return
		case <-c.kick:
		case <-tick.C:
			timed = true
		}
		if c.purge.Load() {
			if err := c.purgeWAL(); err != nil {
				walCheckpoints.WithLabelValues("error").Inc()
				c.onErr(err)
			}
		}
		n := c.ops()
		if n-last < checkpointOps && !(timed && n > last) {
			continue
		}
		last = n
		var busy, logFrames, done int
		err := c.db.QueryRowContext(context.Background(), `PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &logFrames, &done)
		switch {
		case err != nil:
			walCheckpoints.WithLabelValues("error").Inc()
			c.onErr(err)
		case busy != 0:
			walCheckpoints.WithLabelValues("busy").Inc()
		default:
			walCheckpoints.WithLabelValues("ok").Inc()
		}
	}
}

// purgeBusy is how long a purge waits for readers and the writer before
// it tries again at the next tick: a TRUNCATE checkpoint stalls writers
// while it waits.
const purgeBusy = 100 * time.Millisecond

// purgeWAL rids the files of the values erased so far (SPEC §14): with
// secure_delete on every write connection, an erased value is zeroed in
// its page; a TRUNCATE checkpoint copies those pages into the file and
// empties the WAL, the one other place that held the value. Only once it
// completes are the erasures it covers (those committed before it began)
// marked purged. A reader holding an old snapshot keeps it busy: it is
// tried again at the next tick.
func (c *checkpointer) purgeWAL() error {
	ctx := context.Background()
	rows, err := c.db.QueryContext(ctx, `SELECT ns, seq FROM ns_erasures WHERE purged_at = 0`)
	if err != nil {
		return fmt.Errorf("purge: %w", classify(err))
	}
	var pending [][2]int64
	for rows.Next() {
		var p [2]int64
		if err := rows.Scan(&p[0], &p[1]); err != nil {
			_ = rows.Close()
			return fmt.Errorf("purge: %w", classify(err))
		}
		pending = append(pending, p)
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("purge: %w", classify(err))
	}
	if len(pending) == 0 {
		c.purge.Store(false)
		return nil
	}
	conn, err := c.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("purge: %w", classify(err))
	}
	defer func() { _ = conn.Close() }()
	if _, err := conn.ExecContext(ctx, fmt.Sprintf(`PRAGMA busy_timeout = %d`, purgeBusy.Milliseconds())); err != nil {
		return fmt.Errorf("purge: %w", classify(err))
	}
	var busy, logFrames, done int
	if err := conn.QueryRowContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, &logFrames, &done); err != nil {
		walCheckpoints.WithLabelValues("busy").Inc()
		return nil // SQLITE_BUSY: readers or the writer; the next tick tries again
	}
	if busy != 0 || logFrames != 0 {
		walCheckpoints.WithLabelValues("busy").Inc()
		return nil
	}
	now := time.Now().UnixMilli()
	for _, p := range pending {
		if _, err := conn.ExecContext(ctx, `UPDATE ns_erasures SET purged_at = ?3 WHERE ns = ?1 AND seq = ?2 AND purged_at = 0`,
			p[0], p[1], now); err != nil {
			return fmt.Errorf("purge: mark erasure %d purged: %w", p[1], classify(err))
		}
	}
	walCheckpoints.WithLabelValues("purged").Inc()
	return nil
}

// close stops the checkpointer and closes its connection.
func (c *checkpointer) close() error {
	c.once.Do(func() {
		close(c.stop)
		<-c.done
		c.err = c.db.Close()
	})
	return c.err
}

// kickPurge has the checkpointer purge the WAL of erased values.
func (db *chainWriter) kickPurge() {
	if db.ckpt == nil {
		return
	}
	db.ckpt.purge.Store(true)
	db.kickCheckpoint()
}

// kickCheckpoint wakes the checkpointer without ever blocking the writer.
func (db *chainWriter) kickCheckpoint() {
	if db.ckpt == nil {
		return
	}
	select {
	case db.ckpt.kick <- struct{}{}:
	default:
	}
}

// WriterStats is the single writer's work so far.
type WriterStats struct {
	Ops     int64         // write operations run: receipts appended plus one per transaction
	Batches int64         // write transactions committed
	Busy    time.Duration // time spent from BEGIN to durable COMMIT
}

// PerOp is the writer's busy time per operation.
func (s WriterStats) PerOp() time.Duration {
	if s.Ops == 0 {
		return 0
	}
	return s.Busy / time.Duration(s.Ops)
}

// WriterStats returns the writer's cumulative busy time, operations
// (transactions plus receipts appended) and committed transactions.
func (db *chainWriter) WriterStats() WriterStats {
	return WriterStats{Ops: db.opsDone.Load(), Batches: db.batches.Load(), Busy: time.Duration(db.busyNanos.Load())}
}
