// Package api serves the REST API of the effect ledger (SPEC §4) over
// gorilla/mux. Handlers only decode, call the ledger and encode.
package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.opentelemetry.io/otel/trace"

	"github.com/effect-ledger/effect-ledger/ledger"
)

var requestDuration = promauto.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "ledger_http_request_duration_seconds",
	Help:    "HTTP request duration by route template, method and status code.",
	Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
}, []string{"route", "method", "code"})

// Ledger is what the server needs of the domain service; *ledger.Ledger
// satisfies it.
type Ledger interface {
	// NS returns a namespace: 400 for an invalid name, 404
	// unknown_namespace for one never created.
	NS(ctx context.Context, name string) (*ledger.Namespace, error)
	CreateNamespace(ctx context.Context, name string, s ledger.NamespaceSettings) error
	Namespaces(ctx context.Context) ([]ledger.NamespaceInfo, error)
	Ready(ctx context.Context) error
	// Fault records an error showing damaged stored data (a corrupt
	// database): Ready then reports not ready.
	Fault(err error) bool
	AuthEnabled(ctx context.Context) (bool, error)
	Authenticate(ctx context.Context, token string) (ledger.Principal, error)
}

// Server is the HTTP face of a ledger.
type Server struct {
	l        Ledger
	cosigned CosignedCheckpoints // nil without witnesses
	logger   *slog.Logger
	router   *mux.Router
	// adm bounds concurrent API requests, in all and per client.
	adm         admission
	auth        authState
	now         func() time.Time // Config.Now: dates the token-existence re-reads
	metricsAuth bool
	limiter     *rateLimiter

	auditStore   ledger.Store
	auditSem     chan struct{} // one audit at a time
	verification VerificationStatus
	publicLog    bool         // tlog.go
	tracer       trace.Tracer // trace.go; nil: tracing off

	unavailableLog unavailableLog // error.go
}

// DefaultMaxInFlight is the default bound on concurrent API requests.
const DefaultMaxInFlight = 1024

// nsPrefix is the prefix of the namespaced form of every /v1 route
// (SPEC §7): /v1/ns/{ns}/effects/reserve serves what /v1/effects/reserve
// serves for the namespace default.
const nsPrefix = "/v1/ns/{ns}"

// nsHandler serves a request about one namespace.
type nsHandler func(w http.ResponseWriter, r *http.Request, n *ledger.Namespace)

// inNamespace resolves the request's namespace (400 for an invalid name,
// 404 unknown_namespace) before h runs.
func (s *Server) inNamespace(h nsHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n, err := s.namespace(r)
		if err != nil {
			s.Error(w, r, err)
			return
		}
		h(w, r, n)
	}
}

// handle registers a /v1 route in both forms: unprefixed (namespace
// default) and under /v1/ns/{ns}.
func (s *Server) handle(path string, h nsHandler, methods ...string) {
	f := s.inNamespace(h)
	s.router.HandleFunc(path, f).Methods(methods...)
	s.router.HandleFunc(nsPrefix+strings.TrimPrefix(path, "/v1"), f).Methods(methods...)
}

// namespaceName returns the request's namespace name: the {ns} of its
// route, or default.
func namespaceName(r *http.Request) string {
	if ns, ok := mux.Vars(r)["ns"]; ok {
		if u, err := url.PathUnescape(ns); err == nil {
			return u
		}
		return ns
	}
	return ledger.DefaultNamespace
}

// namespace resolves the request's namespace (400 for an invalid name, 404
// unknown_namespace).
func (s *Server) namespace(r *http.Request) (*ledger.Namespace, error) {
	return s.l.NS(r.Context(), namespaceName(r))
}

// canonicalRoute is route with its namespace prefix removed: the route
// the role and scope rules name.
func canonicalRoute(route string) string {
	if rest, ok := strings.CutPrefix(route, nsPrefix); ok {
		return "/v1" + rest
	}
	return route
}

// NewServer returns a Server for l, configured by cfg, with every route
// of SPEC §4 in both forms (SPEC §7), the namespace admin routes, the
// audit and verification routes, and the web audit page at /ui/.
func NewServer(l Ledger, cfg Config) *Server {
	s := &Server{l: l, router: mux.NewRouter(), auditSem: make(chan struct{}, 1)}
	s.adm.clients = map[string]int{}
	s.apply(cfg)
	r := s.router
	r.UseEncodedPath() // keys may contain '/', sent as %2F
	r.SkipClean(true)
	s.handle("/v1/effects/reserve", s.handleReserve, http.MethodPost)
	// Any other method on the reserve path is a wrong method, not a lookup of
	// a key called "reserve".
	notPost := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", http.MethodPost)
		s.Error(w, r, &ledger.Error{Code: ledger.ECodeMethodNotAllowed,
			Message: fmt.Sprintf("method %s is not allowed on %s", truncate(r.Method, 32), truncate(r.URL.Path, 200)),
			Details: map[string]any{"allow": []string{http.MethodPost}}})
	}
	r.HandleFunc("/v1/effects/reserve", notPost)
	r.HandleFunc(nsPrefix+"/effects/reserve", notPost)
	s.handle("/v1/effects/{key}/commit", s.handleCommit, http.MethodPost)
	s.handle("/v1/effects/{key}/resolve", s.handleResolve, http.MethodPost)
	s.handle("/v1/effects/{key}/reconcile", s.handleReconcile, http.MethodPost)
	s.handle("/v1/effects/{key}", s.handleGetKey, http.MethodGet, http.MethodHead)
	s.handle("/v1/receipts", s.handleListReceipts, http.MethodGet, http.MethodHead)
	s.handle("/v1/receipts/{seq}", s.handleGetReceipt, http.MethodGet, http.MethodHead)
	s.handle("/v1/head", s.handleHead, http.MethodGet, http.MethodHead)
	s.handle("/v1/audit", s.handleAudit, http.MethodGet, http.MethodHead)
	r.HandleFunc("/v1/verification", s.handleVerification).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc("/v1/namespaces", s.handleCreateNamespace).Methods(http.MethodPost)
	r.HandleFunc("/v1/namespaces", s.handleListNamespaces).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc("/v1/namespaces/{ns}/policy", s.inNamespace(s.handleGetPolicy)).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc("/v1/namespaces/{ns}/policy", s.inNamespace(s.handlePutPolicy)).Methods(http.MethodPut)
	s.handle("/v1/approvals", s.handleListApprovals, http.MethodGet, http.MethodHead)
	s.handle("/v1/approvals/{seq}", s.handleGetApproval, http.MethodGet, http.MethodHead)
	s.handle("/v1/approvals/{seq}", s.handleAnswer, http.MethodPost)
	s.handle(mcpClientRoute, s.handleMCPClientAnswer, http.MethodPost)
	s.handle(stateKeyRoute, s.handleStateKey, http.MethodGet)
	s.handle(derivationKeyRoute, s.handleDerivationKey, http.MethodGet)
	s.handle("/v1/erasures", s.handleErase, http.MethodPost)
	s.handle("/v1/erasures", s.handleListErasures, http.MethodGet, http.MethodHead)
	s.handle("/v1/erasures/{seq}", s.handleGetErasure, http.MethodGet, http.MethodHead)
	s.handle("/v1/prune", s.handlePruneStatus, http.MethodGet, http.MethodHead)
	s.handle("/v1/prune", s.handlePrune, http.MethodPost)
	s.handle("/v1/signing-keys", s.handleRotateKey, http.MethodPost)
	s.handle("/v1/signing-keys", s.handleSigningKeys, http.MethodGet, http.MethodHead)
	s.routeLog(r)
	r.Handle("/ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently)).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc("/ui/{file:.*}", s.handleUI).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc("/v1/openapi.json", s.handleOpenAPI).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc("/healthz", s.handleHealthz).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc("/readyz", s.handleReadyz).Methods(http.MethodGet, http.MethodHead)
	r.Handle("/metrics", metricsHandler()).Methods(http.MethodGet, http.MethodHead)
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Error(w, r, ledger.Errorf(ledger.ECodeNotFound, "no such route: %s %s", r.Method, truncate(r.URL.Path, 200)))
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		allow := s.allowed(r)
		w.Header().Set("Allow", strings.Join(allow, ", "))
		s.Error(w, r, &ledger.Error{Code: ledger.ECodeMethodNotAllowed,
			Message: fmt.Sprintf("method %s is not allowed on %s", truncate(r.Method, 32), truncate(r.URL.Path, 200)),
			Details: map[string]any{"allow": allow}})
	})
	return s
}

// knownMethods are the methods that get their own metrics label; any
// other method is counted as OTHER, so that clients cannot grow the
// label set.
var knownMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace}

// methodLabel is r.Method as a metrics label: a known method or OTHER.
func methodLabel(m string) string {
	for _, k := range knownMethods {
		if m == k {
			return m
		}
	}
	return "OTHER"
}

// allowed lists the methods the router serves on r's path, for Allow.
func (s *Server) allowed(r *http.Request) []string {
	var out []string
	for _, m := range knownMethods {
		probe := r.Clone(r.Context())
		probe.Method = m
		var match mux.RouteMatch
		if s.router.Match(probe, &match) && match.MatchErr == nil && match.Route != nil {
			out = append(out, m)
		}
	}
	return out
}

// ServeHTTP serves a request with panic recovery and metrics.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	route := "unmatched"
	var match mux.RouteMatch
	if s.router.Match(r, &match) && match.Route != nil {
		if tpl, err := match.Route.GetPathTemplate(); err == nil {
			route = tpl
		}
	}
	var span *requestSpan
	if s.tracer != nil {
		span, w, r = s.startSpan(w, r, route, match.Vars)
	}
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.logger.ErrorContext(r.Context(), "panic serving request", "method", r.Method,
				"path", r.URL.Path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if sw.status == 0 {
				s.Error(sw, r, fmt.Errorf("panic: %v", v))
			}
		}
		elapsed := time.Since(start)
		requestDuration.WithLabelValues(route, methodLabel(r.Method), strconv.Itoa(sw.code())).Observe(elapsed.Seconds())
		if span != nil {
			span.end(sw.code())
		}
		if s.logger.Enabled(r.Context(), slog.LevelDebug) {
			s.logger.DebugContext(r.Context(), "request", append([]any{"method", r.Method, "route", route,
				"status", sw.code(), "duration", elapsed, "remote", r.RemoteAddr}, traceAttr(span)...)...)
		}
	}()
	r, sl, err := s.admit(sw, r, route, match.Vars)
	if err != nil {
		s.Error(sw, r, err)
		return
	}
	if sl != nil {
		defer sl.release()
	}
	if match.MatchErr == nil && match.Handler != nil {
		// Matched above: serve it without matching again (the route
		// regexps were ~3 % of the CPU of a reserve+commit pair).
		match.Handler.ServeHTTP(sw, mux.SetURLVars(r, match.Vars))
		return
	}
	s.router.ServeHTTP(sw, r) // its not-found and wrong-method answers
}

// waitSlack is how long a waiting reserve may take beyond its wait_ms to
// decide and send its answer.
const waitSlack = 30 * time.Second

// extendDeadlines moves the connection's read and write deadlines past a
// reserve's wait, so that a wait_ms longer than the server's ReadTimeout
// or WriteTimeout is not cut off (an expired read deadline would also
// cancel the request's context).
func (s *Server) extendDeadlines(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	rc := http.NewResponseController(w)
	d := time.Now().Add(wait + waitSlack)
	for _, set := range []func(time.Time) error{rc.SetWriteDeadline, rc.SetReadDeadline} {
		if err := set(d); err != nil {
			s.logger.DebugContext(r.Context(), "cannot extend deadline for wait_ms", "err", err)
		}
	}
}

// statusWriter records the status code written.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) code() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// writeJSON writes v as JSON without HTML escaping, so that embedded
// results keep their exact bytes.
func (s *Server) writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		s.logger.Error("encode response", "err", err)
		buf.Reset()
		buf.WriteString(`{"error":{"code":"internal","message":"internal error","details":{}}}` + "\n")
		status = http.StatusInternalServerError
	}
	s.writeRaw(w, status, buf.Bytes())
}

// writeRaw writes an encoded JSON body.
func (s *Server) writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// readyTimeout bounds the readiness probe.
const readyTimeout = 2 * time.Second

func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	if err := s.l.Ready(ctx); err != nil {
		s.Error(w, r, fmt.Errorf("not ready: %w: %w", ledger.ErrUnavailable, err))
		return
	}
	s.writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}
