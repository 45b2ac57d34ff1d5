package ledger

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/mattn/go-sqlite3"
)

// Roles of API tokens.
const (
	RoleReader = "reader" // every GET
	RoleWriter = "writer" // reserve and commit
	RoleAdmin  = "admin"  // resolve, and everything else
)

// TokenPrefix starts every API token.
const TokenPrefix = "elt_"

// Token errors.
var (
	ErrTokenExists  = errors.New("a token with that name exists")
	ErrTokenUnknown = errors.New("no such token")
	ErrBadToken     = errors.New("invalid or revoked token")
)

// Principal is who a token authenticates.
type Principal struct {
	Name string
	Role string
}

// Allows reports whether the principal's role may perform an action that
// needs role need.
func (p Principal) Allows(need string) bool {
	return p.Role == RoleAdmin || p.Role == need
}

// TokenInfo describes a token without its secret.
type TokenInfo struct {
	Name      string `json:"name"`
	Role      string `json:"role"`
	CreatedAt int64  `json:"created_at"`
	RevokedAt int64  `json:"revoked_at"`
}

// Tokens manages API tokens in a ledger file. It writes only the tokens
// table, so it may run beside a ledgerd on the same file.
type Tokens struct {
	db  *sql.DB
	now func() time.Time
}

// OpenTokens opens the tokens table of the ledger at path for management.
func OpenTokens(ctx context.Context, path string) (*Tokens, error) {
	rd, err := OpenReader(ctx, path, Options{}) // checks the schema version
	if err != nil {
		return nil, err
	}
	_ = rd.Close()
	db, err := sql.Open("sqlite3", dsn(path, "rw", 5*time.Second, true))
	if err != nil {
		return nil, fmt.Errorf("open tokens: %w", err)
	}
	db.SetMaxOpenConns(1)
	return &Tokens{db: db, now: time.Now}, nil
}

// Close closes the connection.
func (t *Tokens) Close() error { return t.db.Close() }

// Create makes a token for name with role and returns it; it is shown
// only this once.
func (t *Tokens) Create(ctx context.Context, name, role string) (string, error) {
	if name == "" || len(name) > 128 || !visibleASCII(name) {
		return "", errors.New("token name must be 1–128 bytes of visible ASCII")
	}
	if role != RoleReader && role != RoleWriter && role != RoleAdmin {
		return "", fmt.Errorf("role must be %s, %s or %s", RoleReader, RoleWriter, RoleAdmin)
	}
	var id [6]byte
	var secret [32]byte
	_, _ = rand.Read(id[:])
	_, _ = rand.Read(secret[:])
	tokenID := hex.EncodeToString(id[:])
	token := TokenPrefix + tokenID + "_" + hex.EncodeToString(secret[:])
	h := sha256.Sum256([]byte(token))
	_, err := t.db.ExecContext(ctx, `INSERT INTO tokens (name, role, token_id, token_hash, created_at) VALUES (?, ?, ?, ?, ?)`,
		name, role, tokenID, h[:], t.now().UnixMilli())
	var se sqlite3.Error
	if errors.As(err, &se) && se.Code == sqlite3.ErrConstraint {
		return "", fmt.Errorf("%w: %s", ErrTokenExists, name)
	}
	if err != nil {
		return "", fmt.Errorf("create token: %w", classify(err))
	}
	return token, nil
}

// List returns every token, revoked ones included, by name.
func (t *Tokens) List(ctx context.Context) ([]TokenInfo, error) {
	rows, err := t.db.QueryContext(ctx, `SELECT name, role, created_at, revoked_at FROM tokens ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var out []TokenInfo
	for rows.Next() {
		var ti TokenInfo
		if err := rows.Scan(&ti.Name, &ti.Role, &ti.CreatedAt, &ti.RevokedAt); err != nil {
			return nil, fmt.Errorf("list tokens: %w", err)
		}
		out = append(out, ti)
	}
	return out, rows.Err()
}

// Revoke revokes the token called name; a running ledgerd refuses it from
// its next request.
func (t *Tokens) Revoke(ctx context.Context, name string) error {
	res, err := t.db.ExecContext(ctx, `UPDATE tokens SET revoked_at = ? WHERE name = ? AND revoked_at = 0`, t.now().UnixMilli(), name)
	if err != nil {
		return fmt.Errorf("revoke token: %w", classify(err))
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w (or already revoked): %s", ErrTokenUnknown, name)
	}
	return nil
}

// AuthEnabled reports whether any token is valid: then every API request
// must carry one.
func (rd *Reader) AuthEnabled(ctx context.Context) (bool, error) {
	var n int
	if err := rd.r.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM tokens WHERE revoked_at = 0)`).Scan(&n); err != nil {
		return false, fmt.Errorf("auth: %w", classify(err))
	}
	return n == 1, nil
}

// Authenticate returns the principal of a valid, unrevoked token, or
// ErrBadToken. The token's hash is compared in constant time.
func (rd *Reader) Authenticate(ctx context.Context, token string) (Principal, error) {
	rest, ok := strings.CutPrefix(token, TokenPrefix)
	id, _, ok2 := strings.Cut(rest, "_")
	if !ok || !ok2 || len(id) != 12 {
		return Principal{}, ErrBadToken
	}
	var p Principal
	var stored []byte
	var revoked int64
	err := rd.r.QueryRowContext(ctx, `SELECT name, role, token_hash, revoked_at FROM tokens WHERE token_id = ?`, id).
		Scan(&p.Name, &p.Role, &stored, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return Principal{}, ErrBadToken
	}
	if err != nil {
		return Principal{}, fmt.Errorf("auth: %w", classify(err))
	}
	h := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(stored, h[:]) != 1 || revoked != 0 {
		return Principal{}, ErrBadToken
	}
	return p, nil
}
