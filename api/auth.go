package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// authCheckEvery is how often the server re-reads whether any token exists
// (a new first token is enforced within it).
const authCheckEvery = time.Second

// authState tracks whether auth is on. Auth latches: once a valid token
// has been seen, the running server never serves without one again, even
// when the last token is revoked (a running server must never open up).
type authState struct {
	latched atomic.Bool  // auth was on at some point since start
	tokens  atomic.Bool  // at the last check, a valid token existed
	checked atomic.Int64 // unix ns of the last check
	warned  atomic.Int64 // unix ns of the last "no tokens" warning
}

// AuthEnabled reports whether requests need a token: once any valid token
// has existed since the server started. Whether tokens exist is at most
// authCheckEvery old; every transition is logged.
func (s *Server) AuthEnabled(ctx context.Context) (bool, error) {
	now := s.now().UnixNano()
	if now-s.auth.checked.Load() < int64(authCheckEvery) {
		return s.auth.latched.Load(), nil
	}
	has, err := s.l.AuthEnabled(ctx)
	if err != nil {
		if s.auth.latched.Load() {
			// Fail closed: the token table cannot be read, auth stays on.
			return true, nil
		}
		return false, err
	}
	if was := s.auth.tokens.Swap(has); was != has && s.auth.checked.Load() != 0 {
		switch {
		case has && !s.auth.latched.Load():
			s.logger.WarnContext(ctx, "auth enabled: a valid API token exists, every API request now needs a bearer token")
		case has:
			s.logger.InfoContext(ctx, "auth: valid API tokens exist again")
		case s.auth.latched.Load():
			s.logger.WarnContext(ctx, "auth: no valid API token remains; every API request is refused with 401 until a token is created (auth stays on until a restart)")
		}
	}
	if has {
		s.auth.latched.Store(true)
	}
	s.auth.checked.Store(now)
	return s.auth.latched.Load(), nil
}

// RequireAuth latches auth on from the start, whether or not tokens exist
// yet (for tests and for deployments that must never serve open).
func (s *Server) RequireAuth() { s.auth.latched.Store(true) }

// roleFor returns the role a route needs, "" for open routes.
func (s *Server) roleFor(route, method string) string {
	if s.publicLog && isLogRoute(route) {
		return ""
	}
	switch route {
	case "/healthz", "/readyz", "unmatched", "/ui", "/ui/{file:.*}":
		// The web page's static files hold no data; the page asks for a
		// token and sends it with its API calls.
		return ""
	case "/metrics":
		if s.metricsAuth {
			return ledger.RoleReader
		}
		return ""
	case "/v1/effects/reserve", "/v1/effects/{key}/commit", "/v1/effects/{key}/reconcile":
		return ledger.RoleWriter // reconcile: the reserve's own actor, or an admin (SPEC §15)
	case "/v1/effects/{key}/resolve", "/v1/erasures", "/v1/prune":
		// The erasures listing says which receipts were erased together
		// and the erased subjects' MACs (SPEC §14); the prune status
		// scans the chain (§16): admins only.
		return ledger.RoleAdmin
	case "/v1/approvals/{seq}":
		if method == http.MethodPost {
			return ledger.RoleApprover // or admin (SPEC §13)
		}
	case mcpClientRoute:
		return ledger.RoleWriter // ledger-mcp's own token; the ledger checks it asked
	case stateKeyRoute, derivationKeyRoute:
		return ledger.RoleWriter // a writer's (ledger-mcp's, a client's) or an admin's
	case "/v1/openapi.json":
		return "" // public: the API's description holds no data
	}
	if method == http.MethodGet || method == http.MethodHead {
		return ledger.RoleReader
	}
	return ledger.RoleAdmin
}

// writerReads are the read routes a writer token may use besides its
// writes: a gateway looks up the keys it works with and the head.
var writerReads = map[string]bool{
	"/v1/effects/{key}": true,
	"/v1/head":          true,
	// The gate a gateway works behind (SPEC §13): ledger-mcp reads it to
	// know whether its client may answer an ask.
	"/v1/namespaces/{ns}/policy": true,
}

// allows reports whether principal p may use route with a role need.
func allows(p ledger.Principal, need, route string) bool {
	if p.Allows(need) {
		return true
	}
	if route == "/v1/approvals/{seq}" && need == ledger.RoleApprover {
		// Any token reaches the ledger, which refuses a writer or reader
		// there: the agent's own token trying to approve its own ask is
		// told so (403 self_approval), any other 403 forbidden (SPEC §13).
		return true
	}
	return need == ledger.RoleReader && p.Role == ledger.RoleWriter && writerReads[route]
}

// authenticate checks the bearer token of a request that needs role need
// and returns the request's context carrying the principal's name as
// actor. Failures never say whether a key exists: they come before any
// lookup of it.
func (s *Server) authenticate(r *http.Request, route string, vars map[string]string, need string) (context.Context, error) {
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
	if !s.auth.tokens.Load() {
		// Auth latched on but every token is gone: refuse, and say so in
		// the log (at most once a second).
		now := time.Now().UnixNano()
		if last := s.auth.warned.Load(); now-last >= int64(time.Second) && s.auth.warned.CompareAndSwap(last, now) {
			s.logger.WarnContext(ctx, "refusing API request: auth is on but no valid API token exists",
				"method", r.Method, "path", truncate(r.URL.Path, 200), "remote", r.RemoteAddr)
		}
		return ctx, ledger.Errorf(ledger.ECodeUnauthorized, "no valid API token exists on this ledger; an admin must create one (ledgerctl token create)")
	}
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return ctx, ledger.Errorf(ledger.ECodeUnauthorized, "a bearer token is required (Authorization: Bearer elt_…)")
	}
	p, err := s.l.Authenticate(ctx, strings.TrimSpace(token))
	if errors.Is(err, ledger.ErrBadToken) {
		return ctx, ledger.Errorf(ledger.ECodeUnauthorized, "the bearer token is invalid or revoked")
	}
	if err != nil {
		return ctx, err
	}
	if ns, ok := routeNamespace(route, vars); ok {
		// Scope before any lookup: a token limited to namespaces learns
		// nothing about the others, not even whether they exist.
		if err := ledger.CheckNamespace(ns); err != nil {
			return ctx, err
		}
		if !p.AllowsNamespace(ns) {
			return ctx, &ledger.Error{Code: ledger.ECodeForbidden, Message: "this token may not use namespace " + ns,
				Details: map[string]any{"namespace": ns}}
		}
	}
	if !allows(p, need, canonicalRoute(route)) {
		return ctx, &ledger.Error{Code: ledger.ECodeForbidden,
			Message: fmt.Sprintf("this token's role %s may not do that: it needs %s", p.Role, roleNeeded(need)),
			Details: map[string]any{"role": p.Role, "required": need}}
	}
	if s.limiter != nil {
		if ok, wait := s.limiter.allow(p.Name); !ok {
			return ctx, &ledger.Error{Code: ledger.ECodeRateLimited, Message: "this token is over its request rate",
				Details: map[string]any{"token": p.Name}, RetryAfter: wait}
		}
	}
	return NewContextWithPrincipal(ctx, p), nil
}

// roleNeeded names the tokens that may do what needs role need.
func roleNeeded(need string) string {
	if need == ledger.RoleAdmin {
		return "an admin token"
	}
	return "a " + need + " or admin token"
}

// routeNamespace returns the namespace a request to route addresses (vars
// are the route's variables): the {ns} of a namespaced route, default for
// the other namespace-bound routes; ok is false for routes that are not
// about one namespace.
func routeNamespace(route string, vars map[string]string) (ns string, ok bool) {
	if v, has := vars["ns"]; has {
		if u, err := url.PathUnescape(v); err == nil {
			return u, true
		}
		return v, true
	}
	switch route {
	case "/v1/namespaces", "/v1/openapi.json":
		return "", false
	}
	if strings.HasPrefix(route, "/v1/") {
		return ledger.DefaultNamespace, true
	}
	return "", false
}
