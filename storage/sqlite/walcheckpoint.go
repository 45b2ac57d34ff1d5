package sqlite

import (
	"context"
	"database/sql"
	"sync"
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

// close stops the checkpointer and closes its connection.
func (c *checkpointer) close() error {
	c.once.Do(func() {
		close(c.stop)
		<-c.done
		c.err = c.db.Close()
	})
	return c.err
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
