package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/jackc/pgx/v5"
)

// SetBeforeCommit makes s call fn with the writer's backend pid just
// before each COMMIT.
func SetBeforeCommit(s *Store, fn func(pid uint32)) { s.testHook.beforeCommit = fn }

// SetResolveBudget sets how long a lost COMMIT is resolved for; the
// returned function restores it.
func SetResolveBudget(d time.Duration) (restore func()) {
	old := resolveBudget
	resolveBudget = d
	return func() { resolveBudget = old }
}

// ListenerPID returns the backend pid of s's LISTEN connection, and
// whether it is in place.
func ListenerPID(s *Store) (uint32, bool) {
	s.mu.Lock()
	l := s.listen
	s.mu.Unlock()
	if l == nil {
		return 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pid, l.pid != 0
}

// SQLInsertInto is the receipts INSERT of the write path, into table.
func SQLInsertInto(table string) string {
	return strings.Replace(sqlInsertReceipts, "INSERT INTO receipts", "INSERT INTO "+table, 1)
}

// Arrays turns columns of values into the typed arrays of
// sqlInsertReceipts' parameters (cols[0] holds the namespace once: every
// row's).
func Arrays(cols [][]any) []any {
	ns := make([]string, len(cols[1]))
	for i := range ns {
		ns[i] = cols[0][0].(string)
	}
	out := []any{ns}
	for _, col := range cols[1:] {
		switch col[0].(type) {
		case int64:
			a := make([]int64, len(col))
			for i := range col {
				a[i] = col[i].(int64)
			}
			out = append(out, a)
		case bool:
			a := make([]bool, len(col))
			for i := range col {
				a[i] = col[i].(bool)
			}
			out = append(out, a)
		case string:
			a := make([]string, len(col))
			for i := range col {
				a[i] = col[i].(string)
			}
			out = append(out, a)
		case []byte:
			a := make([][]byte, len(col))
			for i := range col {
				a[i] = col[i].([]byte)
			}
			out = append(out, a)
		}
	}
	return out
}

// SQLOpenKeys is the count of open keys, for plans.
const SQLOpenKeys = sqlOpenKeys

// CreateSchemaV2 creates on conn's empty database the schema a build of
// schema version 2 created: its SQL, its version row, the default
// namespace, the keys guard and the open keys index.
func CreateSchemaV2(ctx context.Context, conn *pgx.Conn) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, q := range []string{schemaSQL, `INSERT INTO schema_version (id, version) VALUES (1, 2)`, sqlKeysGuard, sqlOpenKeysIndex} {
		if _, err := tx.Exec(ctx, q); err != nil {
			return err
		}
	}
	// the default namespace as schema 2 made it: no payload mode
	if _, err := tx.Exec(ctx, `WITH ns AS (INSERT INTO namespaces (name, created_at, key_ttl_ms) VALUES ('default', 0, 0) RETURNING name)
		INSERT INTO head (namespace, seq, hash, recorded_at) SELECT name, 0, '\x`+zeroHashHex+`'::bytea, 0 FROM ns`); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Update runs fn in one write transaction of the chain, as a Write of one
// batch does (the drivers' own tests write through raw transactions).
func (c *Chain) Update(ctx context.Context, fn func(ctx context.Context, tx ledger.Tx) error) error {
	return c.s.update(ctx, []part{{c: c, fn: fn}})
}

// Ready, for the drivers' tests, reports whether the database answers and the default namespace's
// head row is readable; for a writable store, also that the server is
// not a read-only standby (ledger.ErrReadOnly).
func (s *Store) Ready(ctx context.Context) error {
	var seq int64
	var standby bool
	err := s.pool.QueryRow(ctx, `SELECT seq, pg_is_in_recovery() FROM head WHERE namespace = $1`,
		ledger.DefaultNamespace).Scan(&seq, &standby)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("ready: the head row of %s is missing", ledger.DefaultNamespace)
	}
	if err != nil {
		return fmt.Errorf("ready: %w", classify(err))
	}
	if standby && !s.opts.ReadOnly {
		return fmt.Errorf("ready: %s is a standby: %w", s.desc, ledger.ErrReadOnly)
	}
	return nil
}
