package api

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// admission bounds the requests in flight: at most cap(global) in all,
// and at most perClient for any one token or client address, so that one
// client (a runaway gateway) cannot take every place. A request reads its
// body before it takes any place: a body that arrives slowly holds none.
type admission struct {
	global    chan struct{} // nil: no bound
	perClient int           // 0: no bound
	mu        sync.Mutex
	clients   map[string]int // places held, by "token:NAME" or (without a token) "addr:IP"
}

// takeClient counts a request against client; false when the client
// already holds perClient places.
func (a *admission) takeClient(client string) bool {
	if a.perClient <= 0 {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.clients[client] >= a.perClient {
		return false
	}
	a.clients[client]++
	return true
}

// retakeClient counts a request against client whatever it holds: a
// parked reserve that resumes is never refused.
func (a *admission) retakeClient(client string) {
	if a.perClient <= 0 {
		return
	}
	a.mu.Lock()
	a.clients[client]++
	a.mu.Unlock()
}

func (a *admission) releaseClient(client string) {
	if a.perClient <= 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.clients[client]--; a.clients[client] <= 0 {
		delete(a.clients, client)
	}
}

// admit authenticates a request, reads its body, and only then takes its
// places in flight: one for its client (its token, or its address when it
// has none) and a global one. A body still arriving holds no place, so
// slow senders starve no one, not even clients behind the same address.
// The returned request carries the principal and the places, which the
// caller releases (sl is nil for routes that are never refused).
func (s *Server) admit(w http.ResponseWriter, r *http.Request, route string, vars map[string]string) (_ *http.Request, sl *inflightSlot, _ error) {
	ctx, err := s.authenticate(r, route, vars, s.roleFor(canonicalRoute(route), r.Method))
	if err != nil || !admitted(route) {
		return r.WithContext(ctx), nil, err
	}
	r = r.WithContext(ctx)
	if route != "unmatched" {
		if err := preread(w, r); err != nil {
			return r, nil, err
		}
	}
	sl = &inflightSlot{a: &s.adm}
	client := clientAddr(r)
	if p, ok := PrincipalFromContext(ctx); ok {
		client = "token:" + p.Name
	}
	err = sl.takeClient(client)
	if err == nil {
		err = sl.takeGlobal()
	}
	if err != nil {
		sl.release()
		return r, nil, err
	}
	return r.WithContext(ledger.NewContextWithParker(ctx, sl)), sl, nil
}

// inflightSlot is a request's places under the admission bounds. A
// reserve parked waiting for another reservation (wait_ms) gives them up,
// so that waiters, bounded by the ledger's own limit, do not starve other
// requests; it takes them again before it decides. Only the request's
// goroutine uses it.
type inflightSlot struct {
	a      *admission
	client string // the client whose place is held; "" for none
	global bool   // a global place is held
	parked bool
}

var _ ledger.Parker = (*inflightSlot)(nil)

// Park gives the places up.
func (sl *inflightSlot) Park() {
	if sl.parked {
		return
	}
	sl.parked = true
	if sl.client != "" {
		sl.a.releaseClient(sl.client)
	}
	sl.releaseGlobal()
}

// Resume takes the places back, waiting for a global place or for ctx.
func (sl *inflightSlot) Resume(ctx context.Context) error {
	if !sl.parked {
		return nil
	}
	if sl.a.global != nil {
		select {
		case sl.a.global <- struct{}{}:
			sl.global = true
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if sl.client != "" {
		sl.a.retakeClient(sl.client)
	}
	sl.parked = false
	return nil
}

func (sl *inflightSlot) releaseGlobal() {
	if sl.global {
		sl.global = false
		<-sl.a.global
	}
}

// release gives up every place the request still holds.
func (sl *inflightSlot) release() {
	sl.Park()
}

// takeClient takes a place for client, or returns the error to answer.
func (sl *inflightSlot) takeClient(client string) error {
	if !sl.a.takeClient(client) {
		return &ledger.Error{Code: ledger.ECodeUnavailable,
			Message:    "this client has too many requests in flight; retry shortly",
			Details:    map[string]any{"limit": sl.a.perClient},
			RetryAfter: time.Second}
	}
	sl.client = client
	return nil
}

// takeGlobal takes a global place at once, or returns ErrOverloaded.
func (sl *inflightSlot) takeGlobal() error {
	if sl.a.global == nil {
		return nil
	}
	select {
	case sl.a.global <- struct{}{}:
		sl.global = true
		return nil
	default:
		return ledger.ErrOverloaded
	}
}

// clientAddr names the client of a request without a token by its peer's
// IP: clients behind one address share its places.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "addr:" + host
}

// admitted reports whether a route counts against the bounds: health
// probes and metrics are never refused.
func admitted(route string) bool {
	return route != "/healthz" && route != "/readyz" && route != "/metrics"
}

// prereadBody is a request body read in full before the request took a
// global place.
type prereadBody struct {
	*bytes.Reader
	data []byte
}

func (*prereadBody) Close() error { return nil }

// preread reads a POST body within its limits (1 MiB, and the server's
// read timeout) and puts it back in memory for the handler. The memory a
// body takes grows only as its bytes arrive.
func preread(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost || r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	data, err := readRequestBody(w, r)
	if err != nil {
		return err
	}
	r.Body = &prereadBody{Reader: bytes.NewReader(data), data: data}
	r.ContentLength = int64(len(data))
	return nil
}

var _ io.ReadCloser = (*prereadBody)(nil)
