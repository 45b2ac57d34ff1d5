package sqlite

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// The namespace's secret (ledger.Chain.StateKey) is its row of
// ns_state_key, made by the first call: an INSERT OR IGNORE then a read,
// so that whichever insert came first is the key.

// readStateKey reads the secret from db, or returns nil when none was made.
func readStateKey(ctx context.Context, db *sql.DB, ref chainRef) ([]byte, error) {
	var key []byte
	err := db.QueryRowContext(ctx, sqlStateKey, ref.args()...).Scan(&key)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state key: %w", classify(err))
	}
	return key, nil
}

// StateKey implements ledger.Chain: read from the read pool, made on the
// writer's connection (under the writer's lock) when there is none yet.
func (c *chainWriter) StateKey(ctx context.Context) ([]byte, error) {
	if key, err := readStateKey(ctx, c.r, c.chainRef); err != nil || key != nil {
		return key, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ledger.ErrClosed
	}
	key := make([]byte, ledger.StateKeyLen)
	_, _ = rand.Read(key)
	// Not ctx: a request's end must not interrupt the shared connection.
	if _, err := c.w.ExecContext(context.Background(), sqlInsertStateKey, c.args(key)...); err != nil {
		return nil, fmt.Errorf("make state key: %w", classify(err))
	}
	key, err := readStateKey(context.Background(), c.w, c.chainRef)
	if err == nil && key == nil {
		err = errors.New("make state key: no row after the insert")
	}
	return key, err
}

// StateKey implements ledger.Chain on the namespace's open file.
func (f *lazyChain) StateKey(ctx context.Context) ([]byte, error) {
	return use(ctx, f, func(fc *chainWriter) ([]byte, error) { return fc.StateKey(ctx) })
}

// StateKey implements ledger.Chain: a file opened for reading cannot make
// the secret.
func (c readOnlyChain) StateKey(ctx context.Context) ([]byte, error) {
	key, err := readStateKey(ctx, c.r, c.chainRef)
	if err == nil && key == nil {
		err = ledger.ErrOpenedReadOnly
	}
	return key, err
}
