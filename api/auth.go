package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// authCheckEvery is how often the server re-reads whether any token exists
// (a new first token is enforced within it; a revocation at once).
const authCheckEvery = time.Second

// authState caches whether auth is on.
type authState struct {
	enabled atomic.Bool
	checked atomic.Int64 // unix ns of the last check
}

// AuthEnabled reports whether requests need a token: whenever the ledger
// has a valid one. The answer is at most authCheckEvery old.
func (s *Server) AuthEnabled(ctx context.Context) (bool, error) {
	if time.Now().UnixNano()-s.auth.checked.Load() < int64(authCheckEvery) {
		return s.auth.enabled.Load(), nil
	}
	on, err := s.db.AuthEnabled(ctx)
	if err != nil {
		return false, err
	}
	s.auth.enabled.Store(on)
	s.auth.checked.Store(time.Now().UnixNano())
	return on, nil
}

// SetMetricsAuth makes /metrics need a reader token when auth is on.
func (s *Server) SetMetricsAuth(on bool) { s.metricsAuth = on }

// roleFor returns the role a route needs, "" for open routes.
func (s *Server) roleFor(route, method string) string {
	switch route {
	case "/healthz", "/readyz", "unmatched":
		return ""
	case "/metrics":
		if s.metricsAuth {
			return ledger.RoleReader
		}
		return ""
	case "/v1/effects/reserve", "/v1/effects/{key}/commit":
		return ledger.RoleWriter
	case "/v1/effects/{key}/resolve":
		return ledger.RoleAdmin
	}
	if method == http.MethodGet || method == http.MethodHead {
		return ledger.RoleReader
	}
	return ledger.RoleAdmin
}

// authenticate checks the bearer token of a request that needs role need
// and returns the request's context carrying the principal's name as
// actor. Failures never say whether a key exists: they come before any
// lookup of it.
func (s *Server) authenticate(r *http.Request, need string) (context.Context, error) {
	ctx := r.Context()
	if need == "" {
		return ctx, nil
	}
	on, err := s.AuthEnabled(ctx)
	if err != nil {
		return ctx, err
	}
	if !on {
		return ctx, nil
	}
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return ctx, ledger.Errorf(ledger.ECodeUnauthorized, "a bearer token is required (Authorization: Bearer elt_…)")
	}
	p, err := s.db.Authenticate(ctx, strings.TrimSpace(token))
	if errors.Is(err, ledger.ErrBadToken) {
		return ctx, ledger.Errorf(ledger.ECodeUnauthorized, "the bearer token is invalid or revoked")
	}
	if err != nil {
		return ctx, err
	}
	if !p.Allows(need) {
		return ctx, &ledger.Error{Code: ledger.ECodeForbidden, Message: "this token's role may not do that",
			Details: map[string]any{"role": p.Role, "required": need}}
	}
	if s.limiter != nil {
		if ok, wait := s.limiter.allow(p.Name); !ok {
			return ctx, &ledger.Error{Code: ledger.ECodeRateLimited, Message: "this token is over its request rate",
				Details: map[string]any{"token": p.Name}, RetryAfter: wait}
		}
	}
	return NewContextWithActor(ctx, p.Name), nil
}
