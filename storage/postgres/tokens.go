package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// tokenStore is the tokens table, shared by all namespaces (an empty
// namespaces array means every namespace).
type tokenStore struct{ s *Store }

const tokenColumns = `token_id, name, role, token_hash, namespaces, created_at, revoked_at`

// InsertToken stores t, or returns ledger.ErrTokenExists for a taken name.
func (ts tokenStore) InsertToken(ctx context.Context, t *ledger.TokenRow) error {
	if ts.s.opts.ReadOnly {
		return ledger.ErrOpenedReadOnly
	}
	ns := t.Namespaces
	if ns == nil {
		ns = []string{}
	}
	_, err := ts.s.pool.Exec(ctx, `INSERT INTO tokens (`+tokenColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		t.ID, t.Name, t.Role, t.Hash, ns, t.CreatedAt, t.RevokedAt)
	if isCode(err, codeUniqueViolation) {
		return fmt.Errorf("%w: %s", ledger.ErrTokenExists, t.Name)
	}
	if err != nil {
		return fmt.Errorf("create token: %w", classify(err))
	}
	return nil
}

func scanToken(row pgx.Row) (ledger.TokenRow, error) {
	var t ledger.TokenRow
	err := row.Scan(&t.ID, &t.Name, &t.Role, &t.Hash, &t.Namespaces, &t.CreatedAt, &t.RevokedAt)
	if len(t.Namespaces) == 0 {
		t.Namespaces = nil
	}
	return t, err
}

// ListTokens lists every token, revoked ones included, by name.
func (ts tokenStore) ListTokens(ctx context.Context) ([]ledger.TokenRow, error) {
	rows, err := ts.s.pool.Query(ctx, `SELECT `+tokenColumns+` FROM tokens ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", classify(err))
	}
	defer rows.Close()
	var out []ledger.TokenRow
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, fmt.Errorf("list tokens: %w", classify(err))
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list tokens: %w", classify(err))
	}
	return out, nil
}

// RevokeToken marks name revoked at at, or returns ledger.ErrTokenUnknown
// (also for a token already revoked).
func (ts tokenStore) RevokeToken(ctx context.Context, name string, at int64) error {
	if ts.s.opts.ReadOnly {
		return ledger.ErrOpenedReadOnly
	}
	tag, err := ts.s.pool.Exec(ctx, `UPDATE tokens SET revoked_at = $2 WHERE name = $1 AND revoked_at = 0`, name, at)
	if err != nil {
		return fmt.Errorf("revoke token: %w", classify(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w (or already revoked): %s", ledger.ErrTokenUnknown, name)
	}
	return nil
}

// LookupToken returns the token with id, or nil. It reads the table on
// every call, so a revocation through any replica holds at once.
func (ts tokenStore) LookupToken(ctx context.Context, id string) (*ledger.TokenRow, error) {
	t, err := scanToken(ts.s.pool.QueryRow(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE token_id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up token: %w", classify(err))
	}
	return &t, nil
}

// AnyValidToken reports whether an unrevoked token exists.
func (ts tokenStore) AnyValidToken(ctx context.Context) (bool, error) {
	var ok bool
	if err := ts.s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tokens WHERE revoked_at = 0)`).Scan(&ok); err != nil {
		return false, fmt.Errorf("auth: %w", classify(err))
	}
	return ok, nil
}
