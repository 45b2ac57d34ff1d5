package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// sqliteTokens is the SQLite driver's TokenStore: the tokens table of the
// ledger file. Reads go to the read pool, writes to w (nil
// when the store is read-only).
type sqliteTokens struct {
	rd *Reader
	w  *sql.DB
}

var _ ledger.TokenStore = (*sqliteTokens)(nil)

func (t *sqliteTokens) writer() (*sql.DB, error) {
	if t.w == nil {
		return nil, ledger.ErrOpenedReadOnly
	}
	return t.w, nil
}

func joinNamespaces(ns []string) string { return strings.Join(ns, ",") }

func splitNamespaces(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// InsertToken stores a new token.
func (t *sqliteTokens) InsertToken(ctx context.Context, r *ledger.TokenRow) error {
	w, err := t.writer()
	if err != nil {
		return err
	}
	_, err = w.ExecContext(ctx, `INSERT INTO tokens (name, role, token_id, token_hash, created_at, namespaces) VALUES (?, ?, ?, ?, ?, ?)`,
		r.Name, r.Role, r.ID, r.Hash, r.CreatedAt, joinNamespaces(r.Namespaces))
	if code, ok := sqliteCode(err); ok && code == codeConstraint {
		return fmt.Errorf("%w: %s", ledger.ErrTokenExists, r.Name)
	}
	if err != nil {
		return fmt.Errorf("create token: %w", classify(err))
	}
	return nil
}

// ListTokens lists every token by name.
func (t *sqliteTokens) ListTokens(ctx context.Context) ([]ledger.TokenRow, error) {
	q := t.rd.r
	if t.w != nil {
		q = t.w // see the writes of this process at once
	}
	rows, err := q.QueryContext(ctx, `SELECT name, role, created_at, revoked_at, namespaces FROM tokens ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var out []ledger.TokenRow
	for rows.Next() {
		var r ledger.TokenRow
		var ns string
		if err := rows.Scan(&r.Name, &r.Role, &r.CreatedAt, &r.RevokedAt, &ns); err != nil {
			return nil, fmt.Errorf("list tokens: %w", err)
		}
		r.Namespaces = splitNamespaces(ns)
		out = append(out, r)
	}
	return out, rows.Err()
}

// RevokeToken revokes name.
func (t *sqliteTokens) RevokeToken(ctx context.Context, name string, at int64) error {
	w, err := t.writer()
	if err != nil {
		return err
	}
	res, err := w.ExecContext(ctx, `UPDATE tokens SET revoked_at = ? WHERE name = ? AND revoked_at = 0`, at, name)
	if err != nil {
		return fmt.Errorf("revoke token: %w", classify(err))
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w (or already revoked): %s", ledger.ErrTokenUnknown, name)
	}
	return nil
}

// LookupToken reads the token with id.
func (t *sqliteTokens) LookupToken(ctx context.Context, id string) (*ledger.TokenRow, error) {
	r := ledger.TokenRow{ID: id}
	var ns string
	err := t.rd.r.QueryRowContext(ctx, `SELECT name, role, token_hash, created_at, revoked_at, namespaces FROM tokens WHERE token_id = ?`, id).
		Scan(&r.Name, &r.Role, &r.Hash, &r.CreatedAt, &r.RevokedAt, &ns)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, classify(err)
	}
	r.Namespaces = splitNamespaces(ns)
	return &r, nil
}

// AnyValidToken reports whether an unrevoked token exists.
func (t *sqliteTokens) AnyValidToken(ctx context.Context) (bool, error) {
	var n int
	if err := t.rd.r.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM tokens WHERE revoked_at = 0)`).Scan(&n); err != nil {
		return false, fmt.Errorf("auth: %w", classify(err))
	}
	return n == 1, nil
}

// OpenTokens opens the tokens table of the SQLite ledger at path for
// management. It writes only the tokens table, so it may run beside a
// ledgerd on the same file; a file of an older schema is migrated first,
// under its lock (so never beside a ledgerd).
func OpenTokens(ctx context.Context, path string) (*ledger.Tokens, error) {
	abs, err := ledgerPath(path)
	if err != nil {
		return nil, err
	}
	w, err := openRegistryWriter(ctx, abs, false)
	if err != nil {
		return nil, err
	}
	rd, err := OpenReader(ctx, abs, Options{})
	if err != nil {
		_ = w.Close()
		return nil, err
	}
	return ledger.NewTokensCloser(&sqliteTokens{rd: rd, w: w}, closers{w, rd}), nil
}

type closers []io.Closer

func (cs closers) Close() error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
