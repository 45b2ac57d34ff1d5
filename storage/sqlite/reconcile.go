package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// The tokens of reconciled reservations (SPEC §15), beside the chain.

// PutReconciledToken records the token hash of a reconciled reservation.
func (t *writeTx) PutReconciledToken(ctx context.Context, key, tokenHash string, reserveSeq uint64) error {
	if _, err := t.tx.ExecContext(ctx, `INSERT OR IGNORE INTO ns_reconciled_tokens (ns, key, token_hash, reserve_seq)
		VALUES (?1, ?2, ?3, ?4)`, t.ref.args(key, []byte(tokenHash), reserveSeq)...); err != nil {
		return fmt.Errorf("record reconciled token: %w", classify(err))
	}
	return nil
}

// ReconciledReserve returns the reconciled reservation of key with the
// token hash, or 0.
func (t *writeTx) ReconciledReserve(ctx context.Context, key, tokenHash string) (uint64, error) {
	var seq uint64
	err := t.tx.QueryRowContext(ctx, `SELECT reserve_seq FROM ns_reconciled_tokens WHERE ns = ?1 AND key = ?2 AND token_hash = ?3`,
		t.ref.args(key, []byte(tokenHash))...).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read reconciled token: %w", classify(err))
	}
	return seq, nil
}
