package storage

import (
	"context"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/postgres"
)

// openPostgres opens the PostgreSQL driver, which replicas share.
func openPostgres(ctx context.Context, dsn string, opts Options) (ledger.Store, Shared, error) {
	s, err := postgres.Open(ctx, dsn, postgres.Options{ReadOnly: opts.ReadOnly, Logger: opts.Logger,
		KeyTTL: opts.KeyTTL, Payloads: opts.Payloads, Now: opts.Now})
	if err != nil {
		return nil, nil, err
	}
	return s, s, nil
}
