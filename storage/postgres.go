package storage

import (
	"context"
	"errors"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// openPostgres opens the PostgreSQL driver.
func openPostgres(ctx context.Context, dsn string, opts Options) (ledger.Store, error) {
	return nil, errors.New("postgres: not built yet")
}
