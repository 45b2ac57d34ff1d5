// Package goclient_test runs the Go client (the module in client/)
// against a real ledger server on a temporary SQLite file. It lives in the
// main module because it starts the server in-process (api, storage);
// the client module's own tests need nothing of the server.
package goclient_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// Ledger is a real api.Server on a SQLite file in a temp dir.
type Ledger struct {
	Path   string
	DB     *ledgertest.DB
	Server *api.Server
	HTTP   *httptest.Server
}

// MustOpenLedger starts a ledger on the real clock; setup may change the
// server's configuration.
func MustOpenLedger(tb testing.TB, setup ...func(*api.Config)) *Ledger {
	tb.Helper()
	return openLedger(tb, time.Now, setup...)
}

// MustOpenLedgerClock starts a ledger, the server's rate limit included,
// on a clock stopped at the current time, which the test moves past
// leases and Retry-After instead of waiting them out.
func MustOpenLedgerClock(tb testing.TB, setup ...func(*api.Config)) (*Ledger, *testkit.Clock) {
	tb.Helper()
	clock := testkit.NewClock()
	clock.Set(time.Now())
	return openLedger(tb, clock.Now, setup...), clock
}

func openLedger(tb testing.TB, now func() time.Time, setup ...func(*api.Config)) *Ledger {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "ledger.db")
	db := ledgertest.Open(tb, ledgertest.WithPath(path), ledgertest.WithNow(now))
	cfg := api.Config{Logger: quiet, Now: now}
	for _, f := range setup {
		f(&cfg)
	}
	s := api.NewServer(db.Ledger, cfg)
	srv := httptest.NewServer(s)
	tb.Cleanup(srv.Close)
	return &Ledger{Path: path, DB: db, Server: s, HTTP: srv}
}

// MustToken creates an API token on the ledger.
func (l *Ledger) MustToken(tb testing.TB, name, role string) string {
	tb.Helper()
	toks, err := sqlite.OpenTokens(context.Background(), l.Path)
	require.NoError(tb, err)
	defer func() { _ = toks.Close() }()
	tok, err := toks.Create(context.Background(), name, role)
	require.NoError(tb, err)
	return tok
}

// MustClient returns a client of url with test-friendly retry bounds.
func MustClient(tb testing.TB, url string, opts ...client.Option) *client.Client {
	tb.Helper()
	c, err := client.New(url, opts...)
	require.NoError(tb, err)
	return c
}

// Fault decides what the Front does with one request: nil forwards it.
type Fault func(w http.ResponseWriter, r *http.Request, forward func()) bool

// Front is an HTTP proxy before a ledger that can inject faults.
type Front struct {
	HTTP  *httptest.Server
	mu    sync.Mutex
	fault Fault
	Seen  atomic.Int64
}

// MustFront starts a proxy to target.
func MustFront(tb testing.TB, target string) *Front {
	tb.Helper()
	u, err := url.Parse(target)
	require.NoError(tb, err)
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.ErrorLog = slog.NewLogLogger(quiet.Handler(), slog.LevelError)
	f := &Front{}
	f.HTTP = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.Seen.Add(1)
		f.mu.Lock()
		fault := f.fault
		f.mu.Unlock()
		if fault != nil && fault(w, r, func() { proxy.ServeHTTP(httptest.NewRecorder(), r) }) {
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	tb.Cleanup(f.HTTP.Close)
	return f
}

// Set installs a fault (nil: none).
func (f *Front) Set(fault Fault) {
	f.mu.Lock()
	f.fault = fault
	f.mu.Unlock()
}

// hangUp closes the client's connection without an answer.
func hangUp(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		_ = conn.Close()
	}
}
