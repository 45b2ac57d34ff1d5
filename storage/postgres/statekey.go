package postgres

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// The namespace's secret (ledger.Chain.StateKey) is its row of
// state_keys, made by the first call: an insert that does nothing when
// the row exists, then a read, so that replicas starting together agree
// on whichever insert committed first.
const (
	sqlStateKey       = `SELECT key FROM state_keys WHERE namespace = $1`
	sqlInsertStateKey = `INSERT INTO state_keys (namespace, key) VALUES ($1, $2) ON CONFLICT (namespace) DO NOTHING`
)

// StateKey implements ledger.Chain. A read-only store makes none, and a
// schema older than 3 (read as it is by a read-only store) has none.
func (c *Chain) StateKey(ctx context.Context) ([]byte, error) {
	if c.s.version < 3 {
		return nil, ledger.ErrOpenedReadOnly
	}
	for i := range 2 {
		var key []byte
		err := c.s.pool.QueryRow(ctx, sqlStateKey, c.ns).Scan(&key)
		if err == nil {
			return key, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("read state key: %w", classify(err))
		}
		if i > 0 {
			break
		}
		if c.s.opts.ReadOnly {
			return nil, ledger.ErrOpenedReadOnly
		}
		key = make([]byte, ledger.StateKeyLen)
		_, _ = rand.Read(key)
		if _, err := c.s.pool.Exec(ctx, sqlInsertStateKey, c.ns, key); err != nil {
			return nil, fmt.Errorf("make state key: %w", classify(err))
		}
	}
	return nil, errors.New("make state key: no row after the insert")
}
