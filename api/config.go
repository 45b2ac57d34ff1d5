package api

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// Config configures a Server. The zero value serves with the defaults:
// DefaultMaxInFlight concurrent requests, /metrics behind a reader token
// once auth is on, no rate limit, no tracing, no witnesses.
type Config struct {
	// Logger defaults to slog.Default().
	Logger *slog.Logger

	// MaxInFlight bounds concurrent API requests: beyond it, requests get
	// 503 unavailable with Retry-After at once instead of queueing without
	// bound. /healthz, /readyz and /metrics are never refused. 0:
	// DefaultMaxInFlight; < 0: no bound.
	MaxInFlight int
	// MaxInFlightPerClient bounds the concurrent API requests of any one
	// token and of any one client address: beyond it, that client's
	// requests get 503 unavailable with Retry-After while others are
	// still served. 0: three quarters of MaxInFlight; < 0: no bound.
	MaxInFlightPerClient int

	// OpenMetrics serves /metrics without a token even when auth is on
	// (--metrics-auth=false): then anyone who reaches the port reads
	// every namespace's name and head from it.
	OpenMetrics bool

	// RateLimit limits each token to RateLimit requests per second with
	// bursts of RateBurst; beyond it requests get 429 rate_limited with
	// Retry-After. 0 (or less): no limit. It applies only while auth is on
	// (tokens name who is limited).
	RateLimit float64
	RateBurst int
	// RateLimitShare makes the rate limit a total over replicas: it
	// returns how many ledgerd serve the database now (1 when unknown),
	// and each enforces its share. nil: the whole limit is this server's.
	RateLimitShare func() int

	// TracerProvider turns tracing on: every request gets a server span
	// from it that continues the caller's W3C traceparent, with the
	// namespace, key, decision and receipt seq of an effect request, and
	// a child span for the writer batch that made its write durable. nil:
	// requests are not traced at all.
	TracerProvider trace.TracerProvider

	// AuditStore is what GET /v1/audit and /v1/ns/{ns}/audit read: a
	// read-only store of the served ledger, whose namespace of the request
	// is audited, so that audits take no connections from the API's read
	// pool. nil: the audit reads through the ledger's own read pool.
	AuditStore ledger.Store
	// Verification is what GET /v1/verification reports: the periodic
	// verifier's latest run. nil: the route reports that periodic
	// verification is off.
	Verification VerificationStatus

	// PublicLog serves the log's checkpoint and tiles without a token even
	// when tokens exist (--public-log), so that anyone can audit it.
	PublicLog bool
	// Witnessing, when set, is where GET /log/{ns}/checkpoint takes the
	// cosigned checkpoint it serves instead of the latest stored one, and
	// portable receipts prove inclusion against it.
	Witnessing CosignedCheckpoints

	// Now is the clock of the server's own periods: the re-read of whether
	// any token exists (every second by it) and the refill of the rate
	// limit's buckets, so that tests cross them without waiting. nil:
	// time.Now.
	Now func() time.Time
}

// apply sets what cfg configures on a new s.
func (s *Server) apply(cfg Config) {
	s.logger = cfg.Logger
	if s.logger == nil {
		s.logger = slog.Default()
	}
	n := cfg.MaxInFlight
	if n == 0 {
		n = DefaultMaxInFlight
	}
	if n > 0 {
		s.adm.global = make(chan struct{}, n)
		s.adm.perClient = max(n*3/4, 1)
	}
	switch {
	case cfg.MaxInFlightPerClient < 0:
		s.adm.perClient = 0
	case cfg.MaxInFlightPerClient > 0:
		s.adm.perClient = cfg.MaxInFlightPerClient
	}
	s.metricsAuth = !cfg.OpenMetrics

	if cfg.TracerProvider != nil {
		s.tracer = cfg.TracerProvider.Tracer("github.com/effect-ledger/effect-ledger/api")
	}
	s.auditStore = cfg.AuditStore
	s.verification = cfg.Verification
	s.publicLog = cfg.PublicLog
	s.cosigned = cfg.Witnessing
	s.now = cfg.Now
	if s.now == nil {
		s.now = time.Now
	}
	if cfg.RateLimit > 0 {
		s.limiter = newRateLimiter(cfg.RateLimit, cfg.RateBurst)
		s.limiter.share = cfg.RateLimitShare
		s.limiter.now = s.now
	}
}
