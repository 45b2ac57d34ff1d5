package postgres

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// OnEnded registers fn, called with the keys of a namespace whose
// reservation a committed transaction ended, or whose ask it answered (an
// approval receipt, SPEC §13): at once for this Store's own
// commits, and through LISTEN/NOTIFY for every other writer of the
// database (other replicas). The first registration opens one LISTEN
// connection, which reconnects when lost. Notifications sent before a
// session listens are lost to it (the first one starts after the Store
// opened, a later one after a lost connection), so once it listens fn is
// called for every namespace with nil keys, meaning "wake every waiter
// of this namespace". Calls are
// hints: they may be spurious, late or duplicated, and fn must not block.
func (s *Store) OnEnded(fn func(ns string, keys []string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onEnded = append(s.onEnded, fn)
	if s.listen == nil && !s.closed {
		ctx, cancel := context.WithCancel(context.Background())
		s.listen = &listener{s: s, cancel: cancel}
		s.listen.wg.Add(1)
		go s.listen.run(ctx)
	}
}

// listener holds the Store's LISTEN connection.
type listener struct {
	s      *Store
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu  sync.Mutex
	pid uint32 // backend pid of the LISTEN connection while it is up
}

func (l *listener) stop() {
	l.cancel()
	l.wg.Wait()
}

// callbacks returns the registered callbacks.
func (l *listener) callbacks() []func(string, []string) {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	return l.s.onEnded
}

func (l *listener) run(ctx context.Context) {
	defer l.wg.Done()
	wait := retryBase
	for ctx.Err() == nil {
		err := l.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			l.s.log.Warn("postgres: LISTEN connection lost; reconnecting", "err", err, "wait", wait)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// session connects, LISTENs and delivers notifications until the
// connection fails. Once it listens it first wakes every namespace: a
// waiter that parked before then may have missed its key's commit.
func (l *listener) session(ctx context.Context) error {
	cfg := l.s.cfg.ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = "ledgerd-listen"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return err
	}
	if !l.s.opts.ReadOnly {
		// This session marks the Store as a live writer (LiveReplicas)
		// for as long as it lasts.
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock_shared($1, 0)`, replicaLockClass); err != nil {
			return err
		}
	}
	l.mu.Lock()
	l.pid = conn.PgConn().PID()
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.pid = 0
		l.mu.Unlock()
	}()
	rows, err := conn.Query(ctx, `SELECT name FROM namespaces ORDER BY name`)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, ns := range names {
		for _, fn := range l.callbacks() {
			fn(ns, nil)
		}
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		id, rest, ok := strings.Cut(n.Payload, "\n")
		if !ok || id == l.s.id { // this Store's own commits were delivered at COMMIT
			continue
		}
		ns, keys, _ := strings.Cut(rest, "\n")
		var ks []string
		if keys != "" {
			ks = strings.Split(keys, "\n")
		}
		for _, fn := range l.callbacks() {
			fn(ns, ks)
		}
	}
}

// signerLockClass is the first key of the advisory locks of checkpoint
// signers (pg_try_advisory_lock(int, int)); the second is hashtext of the
// namespace.
const signerLockClass = 0x6566656C

// TrySignerLock tries to become the one checkpoint signer of namespace ns
// among every replica of the database: it takes a session advisory lock
// on a connection of its own (not the pool's), held until release is
// called or the process dies, which ends the session and frees the lock.
// ok is false when another session holds it; release is nil unless ok.
// A signer that loses its connection loses the lock without noticing;
// PutCheckpoint's ErrStaleCheckpoint still keeps checkpoints from forking.
func (s *Store) TrySignerLock(ctx context.Context, ns string) (release func(), ok bool, err error) {
	return s.trySessionLock(ctx, signerLockClass, ns, "ledgerd-signer")
}

// runLockClass is the first key of the advisory locks that ledger-mcp
// processes hold on their embedded ledger for as long as they run; the
// second is hashtext of the process's run id.
const runLockClass = 0x6d637072 // "mcpr"

// TryRunLock takes the lock of run id run as TrySignerLock takes a
// signer's: a process holds its own run's lock while it runs, and a run
// whose lock another session can take has no live process (ledger-mcp
// ends that run's reservations, mcpgate.EarlierRun).
func (s *Store) TryRunLock(ctx context.Context, run string) (release func(), ok bool, err error) {
	return s.trySessionLock(ctx, runLockClass, run, "ledger-mcp-run")
}

// trySessionLock takes the session advisory lock (class, hashtext(name))
// on a connection of its own, named app.
func (s *Store) trySessionLock(ctx context.Context, class int, name, app string) (release func(), ok bool, err error) {
	cfg := s.cfg.ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, false, fmt.Errorf("%s lock: %w", app, classify(err))
	}
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, hashtext($2))`, class, name).Scan(&ok); err != nil || !ok {
		_ = conn.Close(context.WithoutCancel(ctx))
		if err != nil {
			return nil, false, fmt.Errorf("%s lock: %w", app, classify(err))
		}
		return nil, false, nil
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			// Unlocked before the session ends: the server ends a closed
			// session, and frees its locks, a moment after Close returns,
			// and another session trying right after must find it free.
			_, _ = conn.Exec(ctx, `SELECT pg_advisory_unlock($1, hashtext($2))`, class, name)
			_ = conn.Close(ctx) // ending the session frees the lock in any case
		})
	}, true, nil
}

// replicaLockClass is the advisory lock class every writable Store's
// LISTEN session holds shared: the number of holders is the number of
// live replicas (a dead replica's session, and its lock, end with it).
const replicaLockClass = 0x6c656467 // "ledg"

// LiveReplicas returns how many writable Stores (ledgerd replicas) are
// connected to the database now, at least 1. ledgerd divides a rate limit
// among them.
func (s *Store) LiveReplicas(ctx context.Context) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1 AND objid = 0 AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, replicaLockClass).Scan(&n)
	if err != nil {
		return 1, fmt.Errorf("live replicas: %w", classify(err))
	}
	return max(n, 1), nil
}
