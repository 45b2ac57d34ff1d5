package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// The tokens of reconciled reservations (SPEC §15), beside the chain.

// reconciledToken is a buffered reconciled reservation's token.
type reconciledToken struct {
	key, tokenHash string
	reserveSeq     uint64
}

// PutReconciledToken buffers the token hash of a reconciled reservation.
func (t *tx) PutReconciledToken(_ context.Context, key, tokenHash string, reserveSeq uint64) error {
	t.reconciled = append(t.reconciled, reconciledToken{key, tokenHash, reserveSeq})
	return nil
}

// ReconciledReserve returns the reconciled reservation of key with the
// token hash (this transaction's included), or 0.
func (t *tx) ReconciledReserve(ctx context.Context, key, tokenHash string) (uint64, error) {
	for _, r := range t.reconciled {
		if r.key == key && r.tokenHash == tokenHash {
			return r.reserveSeq, nil
		}
	}
	var seq int64
	err := t.conn.QueryRow(ctx, `SELECT reserve_seq FROM reconciled_tokens WHERE namespace = $1 AND idempotency_key = $2
		AND token_hash = $3`, t.c.ns, key, []byte(tokenHash)).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, t.dbFail("read reconciled token", err)
	}
	return uint64(seq), nil
}

// queueReconciled adds t's reconciled tokens to b.
func queueReconciled(b *pgx.Batch, ns string, t *tx) {
	for _, r := range t.reconciled {
		b.Queue(`INSERT INTO reconciled_tokens (namespace, idempotency_key, token_hash, reserve_seq) VALUES ($1, $2, $3, $4)
			ON CONFLICT DO NOTHING`, ns, r.key, []byte(r.tokenHash), int64(r.reserveSeq))
	}
}
