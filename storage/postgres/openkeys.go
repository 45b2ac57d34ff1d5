package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// The open keys (ledger.Store.OpenKeys): the keys rows whose latest
// reservation has no outcome (final_seq < reserve_seq). Replicas share
// the table, so every count asks the database; the partial index
// keys_open holds the open rows only, so a count reads as many index
// entries as there are open keys, never the whole table. It costs the
// write path one index entry per reserve and its removal at the outcome.

// sqlOpenKeysIndex is created by migrate on a writable store (a database
// made by an earlier build gets it at its first start by this one, which
// blocks writes while it is built).
const sqlOpenKeysIndex = `CREATE INDEX IF NOT EXISTS keys_open ON keys (namespace, idempotent, lease_expires_at)
	WHERE final_seq < reserve_seq`

// sqlOpenKeys counts the open keys by namespace, idempotence and whether
// the lease has ended at $1 (NULL: the database clock).
const sqlOpenKeys = `SELECT namespace, idempotent, lease_expires_at <= coalesce($1::bigint, ` + sqlNowMS + `), count(*)
	FROM keys WHERE final_seq < reserve_seq GROUP BY 1, 2, 3`

// ensureOpenKeysIndex creates the index keys_open where it is missing,
// under migrate's advisory lock. It looks first, so that a start does not
// take the lock on keys that CREATE INDEX takes even when the index exists.
func ensureOpenKeysIndex(ctx context.Context, tx pgx.Tx) error {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('keys_open') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("open keys index: %w", err)
	}
	if exists {
		return nil
	}
	if _, err := tx.Exec(ctx, sqlOpenKeysIndex); err != nil {
		return fmt.Errorf("open keys index: %w", err)
	}
	return nil
}

// OpenKeys counts the open keys of every namespace on the database clock
// (Options.Now in tests), as GetKey's state does.
func (s *Store) OpenKeys(ctx context.Context) ([]ledger.OpenKeyCount, error) {
	var now *int64
	if n, ok := s.now(); ok {
		v := int64(n)
		now = &v
	}
	rows, err := s.pool.Query(ctx, sqlOpenKeys, now)
	if err != nil {
		return nil, fmt.Errorf("open keys: %w", classify(err))
	}
	var out []ledger.OpenKeyCount
	var c ledger.OpenKeyCount
	var ended bool
	_, err = pgx.ForEachRow(rows, []any{&c.Namespace, &c.Idempotent, &ended, &c.Keys}, func() error {
		c.State = ledger.StateReserved
		if ended {
			c.State = ledger.StateInterrupted
		}
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("open keys: %w", classify(err))
	}
	return out, nil
}
