// Package client is a Go client of the effect ledger for tool gateways.
//
// Do wraps one side effect: it reserves the effect's idempotency key,
// runs the effect with it, and commits the outcome; a repeat of an effect
// that already succeeded gets the recorded result back without running
// again. It waits while another attempt holds the key, retries the
// ledger's 503 and 429 answers, and turns the contract's refusals
// (unsafe_resume, retry_not_allowed, fingerprint_mismatch, …) into errors
// that errors.Is and errors.As understand.
//
// WithNamespace points a client at one namespace (an independent chain,
// /v1/ns/{ns}/…); without it the client uses the namespace default.
//
// A namespace's policy may send a call to a person: Do then returns an
// *ApprovalRequiredError without running the effect, or waits for the
// answer with WithApprovalWait. Policy, SetPolicy, Approvals, Approval and
// Answer are the approver's side.
//
// Receipts, Key, Head, Namespaces, Checkpoint, ReceiptProof and
// ConsistencyProof are the auditor's: they hand over what the ledger sent,
// for a verifier to check (ledgerctl --server reads a ledger with them).
//
// The package needs neither cgo nor the rest of this module: a gateway
// imports it alone.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of the options.
const (
	DefaultWait          = 20 * time.Second // server-side wait per reserve (wait_ms)
	DefaultMaxWait       = 2 * time.Minute  // in_progress wait when ctx has no deadline
	DefaultMaxRetries    = 8                // retries of one call on 503, 429 and transport errors
	DefaultBackoffBase   = 100 * time.Millisecond
	DefaultBackoffMax    = 5 * time.Second
	DefaultCommitTimeout = time.Minute // how long Do keeps trying to record an outcome
	DefaultPollInterval  = time.Second // in_progress polling when the server does not wait
)

// maxWaitMS is the largest wait_ms the ledger accepts.
const maxWaitMS = 60_000

// maxResponse bounds the body of one response: a page of receipts may
// hold a thousand results of up to 64 KiB each.
const maxResponse = 64 << 20

// Client talks to a ledgerd. It is safe for concurrent use.
type Client struct {
	base          string // scheme://host[:port][/prefix], no trailing slash
	namespace     string // "" for the namespace default
	hc            *http.Client
	token         string
	wait          time.Duration
	maxWait       time.Duration
	maxRetries    int
	backoffBase   time.Duration
	backoffMax    time.Duration
	commitTimeout time.Duration
	pollInterval  time.Duration
	approvalWait  time.Duration // WithApprovalWait; 0: no wait for an approver's answer
	logger        *slog.Logger
	inject        func(ctx context.Context, h http.Header)         // WithPropagator; nil: none
	sleep         func(ctx context.Context, d time.Duration) error // WithSleep
	// noServerWait is set once a server refuses wait_ms (a ledger without
	// SPEC §8): reserves then poll instead.
	noServerWait atomic.Bool
	dkMu         sync.Mutex     // held while the derivation key is fetched
	dk           *DerivationKey // DerivationKey's answer, kept once fetched
}

// Option configures a Client.
type Option func(*Client)

// WithToken sends a bearer token (elt_…) with every request.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithNamespace makes the client work in namespace ns (SPEC §7): its
// requests go to /v1/ns/{ns}/…, an independent chain with keys of its
// own. The namespace must exist (an admin creates it); using one that
// does not is ErrUnknownNamespace, and one a token is not limited to
// ErrForbidden. "" and "default" use the unprefixed routes.
func WithNamespace(ns string) Option { return func(c *Client) { c.namespace = ns } }

// WithHTTPClient uses hc instead of a default client. A Timeout on hc
// bounds each request, so it also bounds the server-side wait.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithWait sets how long the server may hold one reserve while another
// attempt holds the key (wait_ms, at most 60 s; default DefaultWait).
// 0 turns server-side waiting off: Do then polls, honouring Retry-After.
func WithWait(d time.Duration) Option { return func(c *Client) { c.wait = d } }

// WithMaxWait bounds how long Do waits in total for another attempt of
// the same key when ctx has no deadline (default DefaultMaxWait).
func WithMaxWait(d time.Duration) Option { return func(c *Client) { c.maxWait = d } }

// WithRetry sets how often a call is retried on 503 unavailable, 429
// rate_limited and transport errors, and the bounds of its jittered
// exponential backoff. A Retry-After from the server is honoured over the
// backoff.
func WithRetry(maxRetries int, base, max time.Duration) Option {
	return func(c *Client) { c.maxRetries, c.backoffBase, c.backoffMax = maxRetries, base, max }
}

// WithCommitTimeout sets how long Do keeps trying to record an outcome
// after the effect ran, even when the caller's context has ended (default
// DefaultCommitTimeout).
func WithCommitTimeout(d time.Duration) Option { return func(c *Client) { c.commitTimeout = d } }

// WithPollInterval caps the sleep between reserves while another attempt
// holds the key and the server does not wait (default DefaultPollInterval).
func WithPollInterval(d time.Duration) Option { return func(c *Client) { c.pollInterval = d } }

// WithSleep replaces how the client waits before a retry (backoff and
// Retry-After) and between polls of a key in progress: sleep must return
// after d, or with ctx's error once ctx is done. The default is a timer.
// Tests use it to record the waits instead of spending them.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(c *Client) {
		if sleep != nil {
			c.sleep = sleep
		}
	}
}

// WithPropagator sets inject, which adds the caller's trace context to
// the headers of every request the client sends, so that the ledger's
// spans join the gateway's trace. With OpenTelemetry:
//
//	client.WithPropagator(func(ctx context.Context, h http.Header) {
//		otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(h))
//	})
//
// The client itself depends on no tracing library.
func WithPropagator(inject func(ctx context.Context, h http.Header)) Option {
	return func(c *Client) { c.inject = inject }
}

// WithLogger logs retries and waits at debug level, and outcomes that
// could not be recorded at error level (default: no logs).
func WithLogger(l *slog.Logger) Option { return func(c *Client) { c.logger = l } }

// New returns a Client for the ledgerd at baseURL, which may omit the
// scheme ("localhost:8080" means http://localhost:8080) and may carry a
// path prefix (a ledger behind a reverse proxy).
func New(baseURL string, opts ...Option) (*Client, error) {
	base := strings.TrimSpace(baseURL)
	if base == "" {
		return nil, errors.New("client: empty base URL")
	}
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("client: base URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("client: base URL %q: scheme must be http or https", baseURL)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q has no host", baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("client: base URL %q must not have a query or fragment", baseURL)
	}
	c := &Client{
		base: strings.TrimRight(u.String(), "/"), hc: &http.Client{},
		wait: DefaultWait, maxWait: DefaultMaxWait, maxRetries: DefaultMaxRetries,
		backoffBase: DefaultBackoffBase, backoffMax: DefaultBackoffMax,
		commitTimeout: DefaultCommitTimeout, pollInterval: DefaultPollInterval, sleep: sleepCtx,
		logger: slog.New(discardHandler{}),
	}
	for _, o := range opts {
		o(c)
	}
	switch {
	case c.hc == nil:
		return nil, errors.New("client: nil http.Client")
	case c.wait < 0 || c.wait > maxWaitMS*time.Millisecond:
		return nil, fmt.Errorf("client: wait %s is not within 0 … 60s", c.wait)
	case c.maxRetries < 0 || c.backoffBase <= 0 || c.backoffMax < c.backoffBase:
		return nil, errors.New("client: retry needs maxRetries ≥ 0 and 0 < base ≤ max")
	case c.commitTimeout <= 0 || c.maxWait <= 0 || c.pollInterval <= 0:
		return nil, errors.New("client: commit timeout, max wait and poll interval must be positive")
	case c.approvalWait < 0:
		return nil, fmt.Errorf("client: approval wait %s is negative", c.approvalWait)
	case c.logger == nil:
		return nil, errors.New("client: nil logger")
	case c.namespace != "" && !validNamespace(c.namespace):
		return nil, fmt.Errorf("client: namespace %q: names are 1–64 bytes of a-z 0-9 . _ -", c.namespace)
	}
	if c.namespace == "default" {
		c.namespace = ""
	}
	return c, nil
}

// validNamespace reports whether ns is 1–64 bytes of a-z 0-9 . _ -.
func validNamespace(ns string) bool {
	if len(ns) == 0 || len(ns) > 64 {
		return false
	}
	for i := 0; i < len(ns); i++ {
		b := ns[i]
		if !(b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '.' || b == '_' || b == '-') {
			return false
		}
	}
	return true
}

// BaseURL returns the normalized base URL.
func (c *Client) BaseURL() string { return c.base }

// Namespace returns the namespace the client works in ("default" for
// the unprefixed routes).
func (c *Client) Namespace() string {
	if c.namespace == "" {
		return "default"
	}
	return c.namespace
}

// route returns the path of a /v1 route in the client's namespace.
func (c *Client) route(path string) string {
	if c.namespace == "" {
		return path
	}
	return "/v1/ns/" + c.namespace + strings.TrimPrefix(path, "/v1")
}

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// response is a decoded 2xx answer.
type response struct {
	status int
	header http.Header
	body   []byte
}

// send makes one request to a /v1 route of the client's namespace. A
// 4xx/5xx answer comes back as *Error; a request that got no answer as a
// transport error.
func (c *Client) send(ctx context.Context, method, path string, body any) (*response, error) {
	return c.sendTo(ctx, method, c.route(path), body)
}

// exchange makes one request to path as it is (sendTo) and decodes its
// JSON answer into v; what names the call in a decode error. The answer
// is returned for its status and headers.
func (c *Client) exchange(ctx context.Context, what, method, path string, body, v any) (*response, error) {
	res, err := c.sendTo(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(res.body, v); err != nil {
		return nil, fmt.Errorf("%s: decode response: %w", what, err)
	}
	return res, nil
}

// sendTo makes one request to path as it is, which no namespace prefixes
// (/v1/namespaces/{ns}/policy).
func (c *Client) sendTo(ctx context.Context, method, path string, body any) (*response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.inject != nil {
		c.inject(ctx, req.Header)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = res.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(res.Body, maxResponse))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read response: %w", method, path, err)
	}
	if res.StatusCode >= 400 {
		return nil, decodeError(res, data)
	}
	return &response{status: res.StatusCode, header: res.Header, body: data}, nil
}

// decodeError turns an error response into *Error. A body that is not
// the contract's shape (a proxy's page) keeps the status and gets a code
// from it.
func decodeError(res *http.Response, data []byte) *Error {
	var eb struct {
		Error struct {
			Code    string         `json:"code"`
			Message string         `json:"message"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	e := &Error{Status: res.StatusCode, RetryAfter: parseRetryAfter(res.Header.Get("Retry-After"), time.Now())}
	if json.Unmarshal(data, &eb) == nil && eb.Error.Code != "" {
		e.Code, e.Message, e.Details = eb.Error.Code, eb.Error.Message, eb.Error.Details
		return e
	}
	switch res.StatusCode {
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
		e.Code = string(ErrUnavailable.(code))
	case http.StatusTooManyRequests:
		e.Code = string(ErrRateLimited.(code))
	case http.StatusNotFound:
		e.Code = string(ErrNotFound.(code))
	default:
		e.Code = string(ErrInternal.(code))
	}
	e.Message = strings.TrimSpace(string(data))
	if len(e.Message) > 200 {
		e.Message = e.Message[:200]
	}
	if e.Message == "" {
		e.Message = res.Status
	}
	return e
}

// parseRetryAfter reads delay-seconds or an HTTP date; 0 when absent or
// malformed.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0
		}
		return time.Duration(min(n, 86_400)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// retryable reports whether err is worth another try of the same request:
// the server said nothing was recorded (503, 429), or the request never
// reached it. An answer that asks for approval is not.
func retryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Status == http.StatusServiceUnavailable || e.Status == http.StatusTooManyRequests
	}
	return err != nil && !isContextErr(err) && !errors.Is(err, ErrApprovalRequired)
}

// unsent reports whether a transport error happened before the request
// could reach the server (nothing can have been recorded).
func unsent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// backoff returns the delay before retry n (0-based) after err: the
// server's Retry-After if any (plus up to 20 % jitter, so that clients
// told the same time do not return together), else a full-jitter
// exponential backoff.
func (c *Client) backoff(n int, err error) time.Duration {
	var e *Error
	if errors.As(err, &e) && e.RetryAfter > 0 {
		return e.RetryAfter + rand.N(e.RetryAfter/5+time.Millisecond)
	}
	d := c.backoffBase << min(n, 30)
	if d <= 0 || d > c.backoffMax {
		d = c.backoffMax
	}
	return d/2 + rand.N(d/2+1)
}

// pause sleeps before retry n after err, unless the sleep would end after
// ctx's deadline: then it returns err at once.
func (c *Client) pause(ctx context.Context, n int, err error, what string) error {
	d := c.backoff(n, err)
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return err
	}
	c.logger.DebugContext(ctx, "ledger: retrying", "call", what, "retry", n+1, "after", d, "err", err)
	if serr := c.sleep(ctx, d); serr != nil {
		return err
	}
	return nil
}

// discardHandler drops every record; the client logs nothing until
// WithLogger gives it a logger.
type discardHandler struct{}

func (discardHandler) Enabled(context.Context, slog.Level) bool  { return false }
func (discardHandler) Handle(context.Context, slog.Record) error { return nil }
func (d discardHandler) WithAttrs([]slog.Attr) slog.Handler      { return d }
func (d discardHandler) WithGroup(string) slog.Handler           { return d }
