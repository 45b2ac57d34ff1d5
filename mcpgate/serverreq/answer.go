//lint:file-ignore SA1019 sampling and roots are deprecated (SEP-2577), not gone: a client that has them is relayed them

package serverreq

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// Asker answers the requests of the upstream asked on a parked call's
// session: the call's client answers them in its next round.
type Asker interface {
	Ask(ctx context.Context, params mcp.InputRequest) (mcp.Result, error)
}

// AnswerUpstream is the receiving middleware of a peer's upstream
// client: the upstream's elicitation/create, sampling/createMessage and
// roots/list go to the downstream client, and its answer, a decline as
// much as an acceptance, goes back. The gateway answers none of them
// itself; one the client lacks the capability for is refused.
func (p *Peer) AnswerUpstream(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if !wire.AsksClient(method) {
			return next(ctx, method, req)
		}
		cs, _ := req.GetSession().(*mcp.ClientSession)
		r := p.routeOf(cs)
		if p.ss == nil {
			return p.parkedAnswer(ctx, r, method, req)
		}
		dctx := ctx
		if r != nil {
			dctx = r.ctx
			w := r.watch.Load()
			w.Hold()
			defer w.Release()
		}
		caps := p.Caps()
		var (
			res     mcp.Result
			err     error
			missing string
		)
		switch params := req.GetParams().(type) {
		case *mcp.ElicitParams:
			if caps.Elicitation == nil {
				missing = "elicitation"
				break
			}
			res, err = p.ss.Elicit(dctx, params)
		case *mcp.CreateMessageWithToolsParams:
			if caps.Sampling == nil {
				missing = "sampling"
				break
			}
			res, err = p.ss.CreateMessageWithTools(dctx, params)
		case *mcp.ListRootsParams:
			if !HasRoots(caps) {
				missing = "roots"
				break
			}
			res, err = p.ss.ListRoots(dctx, params)
		default:
			missing = method
		}
		if missing != "" {
			return nil, p.refuseMissing(ctx, r, method, missing)
		}
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		if r != nil {
			r.answered++
		}
		p.mu.Unlock()
		return res, nil
	}
}

// refuseMissing refuses an upstream request for method that the client
// lacks the capability missing for: logged, marked on r, and answered
// method not found.
func (p *Peer) refuseMissing(ctx context.Context, r *Route, method, missing string) error {
	p.ps.logger.InfoContext(ctx, "upstream request not forwarded: the client lacks the capability", "method", method)
	p.markMissing(r, fmt.Errorf("%w: %s", ErrCapabilityMissing, missing))
	return &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "client does not support " + missing}
}

// markMissing notes on r a request its client could not answer.
func (p *Peer) markMissing(r *Route, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r != nil && r.missing == nil {
		r.missing, r.first = err, r.answered == 0
	}
}

// Caps are the capabilities of the peer's client.
func (p *Peer) Caps() *mcp.ClientCapabilities {
	if p.ss == nil {
		return p.caps
	}
	if ip := p.ss.InitializeParams(); ip != nil && ip.Capabilities != nil {
		return ip.Capabilities
	}
	return &mcp.ClientCapabilities{}
}

// Parking reports whether p is a parking peer (NewParking).
func (p *Peer) Parking() bool { return p.ss == nil }

// Log passes an upstream log message on to the client (a parking peer's
// clients take none: they are sent no requests of the server).
func (p *Peer) Log(ctx context.Context, req *mcp.LoggingMessageRequest) {
	if p.ss == nil {
		return
	}
	dctx := context.WithoutCancel(ctx)
	if r := p.routeOf(req.Session); r != nil {
		dctx = context.WithoutCancel(r.ctx)
	}
	_ = p.ss.Log(dctx, req.Params)
}

// parkedAnswer answers a request of the upstream on a parking peer's
// session: the call's client answers it in its next round (r.Park); one
// outside a call, or one the client lacks the capability for, is refused.
func (p *Peer) parkedAnswer(ctx context.Context, r *Route, method string, req mcp.Request) (mcp.Result, error) {
	params, ok := req.GetParams().(mcp.InputRequest)
	missing := ""
	switch req.GetParams().(type) {
	case *mcp.ElicitParams:
		if p.caps.Elicitation == nil {
			missing = "elicitation"
		}
	case *mcp.CreateMessageWithToolsParams, *mcp.CreateMessageParams:
		if p.caps.Sampling == nil {
			missing = "sampling"
		}
	case *mcp.ListRootsParams:
		if !HasRoots(p.caps) {
			missing = "roots"
		}
	default:
		missing = method
	}
	if !ok || r == nil || r.Park == nil {
		missing = method
	}
	if missing != "" {
		return nil, p.refuseMissing(ctx, r, method, missing)
	}
	res, err := r.Park.Ask(ctx, params)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	r.answered++
	p.mu.Unlock()
	return res, nil
}

// MissingCapability tells the upstream's answer of a call on r apart
// when the client lacked a capability the upstream needed: a request that
// could not be forwarded, or (an SDK server checks elicitation before
// sending) an error message that says the client does not support it.
// failed: the answer is a failure the upstream gave (neither a success
// nor a request for input). first: nothing had been answered before, so
// the upstream cannot have acted.
func MissingCapability(p *Peer, r *Route, failed bool, message string) (first bool, err error) {
	if r == nil || !failed {
		return false, nil
	}
	p.mu.Lock()
	missing, first, answered := r.missing, r.first, r.answered
	p.mu.Unlock()
	if missing != nil {
		return first, missing
	}
	caps := p.Caps()
	if caps.Elicitation == nil && strings.Contains(message, "does not support elicitation") {
		return answered == 0, fmt.Errorf("%w: elicitation", ErrCapabilityMissing)
	}
	return false, nil
}

// Watch holds w, the call's upstream timeout, while a request of the
// upstream on r waits for the client (r may be nil: no such requests).
func (r *Route) Watch(w *Watchdog) {
	if r != nil {
		r.watch.Store(w)
	}
}

// Watchdog is a call's upstream timeout, held while the upstream waits
// for the client.
type Watchdog struct {
	d    time.Duration
	t    *time.Timer
	mu   sync.Mutex
	held int
}

// NewWatchdog calls f after d, unless stopped or held.
func NewWatchdog(d time.Duration, f func()) *Watchdog {
	return &Watchdog{d: d, t: time.AfterFunc(d, f)}
}

// Stop ends the clock.
func (w *Watchdog) Stop() { w.t.Stop() }

// Hold stops the clock until Release.
func (w *Watchdog) Hold() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.held++
	w.t.Stop()
}

// Release gives the upstream the whole timeout again, once nothing holds.
func (w *Watchdog) Release() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.held--; w.held == 0 {
		w.t.Reset(w.d)
	}
}
