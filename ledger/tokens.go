package ledger

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Roles of API tokens.
const (
	RoleReader = "reader" // every GET
	RoleWriter = "writer" // reserve and commit
	RoleAdmin  = "admin"  // resolve, and everything else
	// RoleApprover reads like a reader and answers approvals (SPEC §13).
	RoleApprover = "approver"
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
	// Namespaces the token may use; empty means every namespace.
	Namespaces []string
}

// AllowsNamespace reports whether the principal may use namespace ns.
func (p Principal) AllowsNamespace(ns string) bool {
	return len(p.Namespaces) == 0 || slices.Contains(p.Namespaces, ns)
}

// Allows reports whether the principal's role may perform an action that
// needs role need.
func (p Principal) Allows(need string) bool {
	return p.Role == RoleAdmin || p.Role == need || p.Role == RoleApprover && need == RoleReader
}

// TokenInfo describes a token without its secret.
type TokenInfo struct {
	Name      string `json:"name"`
	Role      string `json:"role"`
	CreatedAt int64  `json:"created_at"`
	RevokedAt int64  `json:"revoked_at"`
	// Namespaces the token is limited to; empty: every namespace.
	Namespaces []string `json:"namespaces"`
}

// Tokens manages API tokens through a driver's TokenStore.
type Tokens struct {
	ts     TokenStore
	now    func() time.Time
	closer io.Closer
}

// NewTokens manages the tokens of ts.
func NewTokens(ts TokenStore) *Tokens { return &Tokens{ts: ts, now: time.Now} }

// NewTokensCloser manages the tokens of ts; Close closes c (what a
// driver opened for ts alone).
func NewTokensCloser(ts TokenStore, c io.Closer) *Tokens {
	return &Tokens{ts: ts, now: time.Now, closer: c}
}

// Close closes what NewTokensCloser was given.
func (t *Tokens) Close() error {
	if t.closer == nil {
		return nil
	}
	return t.closer.Close()
}

// Create makes a token for name with role, limited to namespaces (none:
// every namespace), and returns it; it is shown only this once.
func (t *Tokens) Create(ctx context.Context, name, role string, namespaces ...string) (string, error) {
	if name == "" || len(name) > 128 || !visibleASCII(name) {
		return "", errors.New("token name must be 1–128 bytes of visible ASCII")
	}
	if strings.ContainsAny(name, "/:") || name == ApproverMCPClient {
		// An actor "<asker>/mcp-client:<name>" is an answer relayed from
		// the agent's own client (SPEC §13): no token may look like one.
		return "", fmt.Errorf("token name must not contain / or : nor be %q (reserved for answers relayed from an MCP client)", ApproverMCPClient)
	}
	if role != RoleReader && role != RoleWriter && role != RoleAdmin && role != RoleApprover {
		return "", fmt.Errorf("role must be %s, %s, %s or %s", RoleReader, RoleWriter, RoleApprover, RoleAdmin)
	}
	for _, ns := range namespaces {
		if !ValidNamespace(ns) {
			return "", fmt.Errorf("namespace %q: names are 1–64 bytes of a-z 0-9 . _ -", ns)
		}
	}
	var id [6]byte
	var secret [32]byte
	_, _ = rand.Read(id[:])
	_, _ = rand.Read(secret[:])
	tokenID := hex.EncodeToString(id[:])
	token := TokenPrefix + tokenID + "_" + hex.EncodeToString(secret[:])
	h := sha256.Sum256([]byte(token))
	ns := slices.Compact(slices.Sorted(slices.Values(namespaces)))
	err := t.ts.InsertToken(ctx, &TokenRow{ID: tokenID, Name: name, Role: role, Hash: h[:], Namespaces: ns,
		CreatedAt: t.now().UnixMilli()})
	if err != nil {
		return "", err
	}
	return token, nil
}

// List returns every token, revoked ones included, by name.
func (t *Tokens) List(ctx context.Context) ([]TokenInfo, error) {
	rows, err := t.ts.ListTokens(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]TokenInfo, 0, len(rows))
	for _, r := range rows {
		ns := r.Namespaces
		if ns == nil {
			ns = []string{}
		}
		out = append(out, TokenInfo{Name: r.Name, Role: r.Role, CreatedAt: r.CreatedAt, RevokedAt: r.RevokedAt, Namespaces: ns})
	}
	return out, nil
}

// Revoke revokes the token called name; a running ledgerd refuses it from
// its next request.
func (t *Tokens) Revoke(ctx context.Context, name string) error {
	return t.ts.RevokeToken(ctx, name, t.now().UnixMilli())
}

// AuthEnabled reports whether any token is valid: then every API request
// must carry one.
func (l *Ledger) AuthEnabled(ctx context.Context) (bool, error) {
	return l.store.Tokens().AnyValidToken(ctx)
}

// Authenticate returns the principal of a valid, unrevoked token, or
// ErrBadToken. The token's hash is compared in constant time. It reads
// the store on every call, so a revocation holds at once on every
// replica.
func (l *Ledger) Authenticate(ctx context.Context, token string) (Principal, error) {
	return Authenticate(ctx, l.store.Tokens(), token)
}

// Authenticate checks token against ts.
func Authenticate(ctx context.Context, ts TokenStore, token string) (Principal, error) {
	rest, ok := strings.CutPrefix(token, TokenPrefix)
	id, _, ok2 := strings.Cut(rest, "_")
	if !ok || !ok2 || len(id) != 12 {
		return Principal{}, ErrBadToken
	}
	row, err := ts.LookupToken(ctx, id)
	if err != nil {
		return Principal{}, fmt.Errorf("auth: %w", err)
	}
	if row == nil {
		return Principal{}, ErrBadToken
	}
	h := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(row.Hash, h[:]) != 1 || row.RevokedAt != 0 {
		return Principal{}, ErrBadToken
	}
	return Principal{Name: row.Name, Role: row.Role, Namespaces: row.Namespaces}, nil
}
