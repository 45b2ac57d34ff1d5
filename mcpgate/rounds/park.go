//lint:file-ignore SA1019 sampling and roots are deprecated (SEP-2577), not gone: a client that has them is relayed them

package rounds

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/serverreq"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// Parked calls (SPEC §11.1): a client of 2026-07-28 is sent no requests,
// it answers input_required rounds; an upstream of an older revision asks
// its client with requests while the call runs. So such a client's call
// goes on an upstream session that advertises that client's capabilities
// (a parking peer: one per set of capabilities, each call in flight on a
// session of its own), and each request the upstream sends during the
// call becomes a round: the client gets input_required with the request
// as its one inputRequest and requestState "park:<id>" (sealed in the
// round's envelope for a recorded call), while the upstream's call stays
// open — parked. The client's next round answers the parked request with
// its inputResponse and waits for what the upstream does next: another
// request (another round) or its final answer, committed once. A parked
// call lives in this process for parkTimeout; a round that comes later,
// or to another replica or after a restart, runs the call afresh (the
// upstream then asks again).
//
// Only a round asked before the upstream had any answer is committed
// not_applied INPUT_REQUIRED: once an answer reached it, the upstream may
// have acted, so a later round commits nothing and keeps the execution's
// reservation with the parked call (held), and the round after it runs
// under that reservation; the call's final answer is committed with it,
// even one that comes after the parked call timed out or the gateway
// began to stop. A parked call is bound to its call (tool, arguments,
// recorded or not): a requestState naming it is refused for any other.
// Parking peers are one per set of capabilities (the upstream sees the
// gateway as their client), each with at most maxParkingCalls calls in
// flight, of which at most maxParkedPerClient of one client wait for its
// answers; a call that finds no free session within its lease is not
// sent and is recorded not_applied UPSTREAM_BUSY. A parked call that
// holds a reservation gives up before its lease ends; a round whose
// state says its parked call held the reservation, but finds it gone, is
// answered in_progress and runs nothing (two copies of one round: one
// runs).

// parkPrefix marks the upstream state of a parked call's round:
// "park:<id>:<question>", and ":held" after it when the parked call holds
// the execution's reservation (parkState).
const (
	parkPrefix = "park:"
	heldSuffix = ":held"
)

// parkState is the upstream state of a round of parked call id asking
// question, held or not.
func parkState(id, question string, held bool) string {
	s := parkPrefix + id + ":" + question
	if held {
		s += heldSuffix
	}
	return s
}

// ParsePark reads a round's upstream state: the parked call, the
// question its answers are for, and whether it held the reservation.
func ParsePark(state string) (id, question string, held, ok bool) {
	rest, ok := strings.CutPrefix(state, parkPrefix)
	if !ok {
		return "", "", false, false
	}
	rest, held = strings.CutSuffix(rest, heldSuffix)
	id, question, ok = strings.Cut(rest, ":")
	return id, question, held, ok
}

// maxParkedPerClient bounds the parked calls that wait for one client's
// answer at once; a request past it is answered with an error.
const maxParkedPerClient = 4

// ParkTimeout is how long a parked call waits for the client's next
// round; then its request is answered with an error.
const ParkTimeout = 15 * time.Minute

// maxParkedRounds bounds the requests of one parked call: past it, the
// upstream's request is answered with an error.
const maxParkedRounds = 16

// CodeUpstreamBusy is the not_applied code of a call that found no free
// upstream session within its lease, and so was never sent.
const CodeUpstreamBusy = "UPSTREAM_BUSY"

// ErrNotSent is a parked call that was never sent upstream.
var ErrNotSent = errors.New("not sent: every upstream session of this client is busy")

// Parked is a call whose upstream waits for the client's answer.
type Parked struct {
	id    string
	asks  chan *parkedAsk // the upstream's requests during the call
	end   chan End        // the call's answer, once
	n     atomic.Int64    // requests so far, for their inputRequests keys
	ask   *parkedAsk      // the request the client is asked now
	timer *time.Timer
	// Where the call runs, for what its client could not answer.
	peer  *serverreq.Peer
	route *serverreq.Route
	// What it belongs to: a requestState naming it serves this call only.
	tool, hash string
	recorded   bool
	answered   int // answers delivered to the upstream, under Parking.mu
	// held: the execution's reservation, kept (uncommitted) across a
	// round asked after an answer; settle commits the call's final
	// answer with it if no round comes for it. Under Parking.mu.
	held   *ledgerport.Reservation
	settle func(End)
	heldAt time.Time // when held was reserved (at most)
	owner  string    // the call's client (tasks.OwnerOf)
	gen    int       // times parked, under Parking.mu: a timer serves its own
	// slot sees the upstream call's answer (and the stray ones, for the
	// log); stop gives the upstream call up.
	slot *wire.Slot
	stop context.CancelFunc
}

// NewParked is the call that runs on peer's session for route r (and
// answers r's requests: r.Park), of ledger tool tool with arguments of
// fingerprint hash (recorded: an effect), for the client owner; slot
// sees the upstream call's answer, and stop gives it up.
func NewParked(peer *serverreq.Peer, r *serverreq.Route, tool, hash string, recorded bool, owner string, slot *wire.Slot, stop context.CancelFunc) *Parked {
	p := &Parked{id: rand.Text(), asks: make(chan *parkedAsk), end: make(chan End, 1), peer: peer, route: r,
		tool: tool, hash: hash, recorded: recorded, owner: owner, slot: slot, stop: stop}
	r.Park = p
	return p
}

// Where is where the call runs: its peer and route.
func (p *Parked) Where() (*serverreq.Peer, *serverreq.Route) { return p.peer, p.route }

// Held is the execution's reservation p holds (nil: none), reserved at
// most at the time given.
func (p *Parked) Held() (*ledgerport.Reservation, time.Time) { return p.held, p.heldAt }

// Done delivers the upstream call's answer, once.
func (p *Parked) Done(e End) { p.end <- e }

// Answer gives the parked request the client's answer among answers (no
// answer: the request is answered with an error).
func (p *Parked) Answer(answers mcp.InputResponseMap) {
	var answer mcp.Result
	if a, ok := answers[p.ask.key].(mcp.Result); ok {
		answer = a
	}
	p.ask.answer <- answer
}

// parkedAsk is one request of the upstream, waiting for its answer.
type parkedAsk struct {
	key    string
	params mcp.InputRequest
	answer chan mcp.Result // nil: no answer came
}

// End is what the upstream call of a parked call came to.
type End struct {
	Res  *mcp.CallToolResult
	Slot *wire.Slot
	Err  error
}

// Parking is the extension's state: the parked calls of this process,
// and the parking peers.
type Parking struct {
	ps              *serverreq.Peers
	upstreamTimeout time.Duration
	logger          *slog.Logger
	mu              sync.Mutex
	calls           map[string]*Parked
	byOwner         map[string]int             // parked calls by owner
	peers           map[string]*serverreq.Peer // parking peers, by their client's capabilities
}

// NewParking returns the extension: parking peers are made in ps, and
// the upstream gets upstreamTimeout to answer or ask (Await).
func NewParking(ps *serverreq.Peers, upstreamTimeout time.Duration, logger *slog.Logger) *Parking {
	return &Parking{ps: ps, upstreamTimeout: upstreamTimeout, logger: logger,
		calls: map[string]*Parked{}, peers: map[string]*serverreq.Peer{}, byOwner: map[string]int{}}
}

// Take removes and returns the parked call id if it still waits, holds
// no reservation (that one is ClaimHeld's) and belongs to the call of
// ledger tool tool, recorded or not, with arguments of fingerprint hash;
// bound reports a call that exists for another.
func (t *Parking) Take(id, question, tool string, recorded bool, hash string) (p *Parked, bound bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p = t.calls[id]
	if p == nil {
		return nil, false
	}
	if p.held != nil || p.tool != tool || p.hash != hash || p.recorded != recorded {
		return nil, true
	}
	if p.ask.key != question {
		return nil, false // an answer to an earlier question of the call: stale
	}
	t.remove(p)
	p.answered++
	return p, false
}

// ClaimHeld removes and returns the parked call id with the reservation
// it holds for key, if it waits for the answer to question, in one step:
// of two copies of a round, one gets it.
func (t *Parking) ClaimHeld(id, question, key, tool, hash string) *Parked {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.calls[id]
	if p == nil || p.held == nil || p.held.Key != key || p.tool != tool || p.hash != hash || p.ask.key != question {
		return nil
	}
	t.remove(p)
	p.answered++
	return p
}

// drop removes the parked call id if it still waits in its gen-th park.
func (t *Parking) drop(id string, gen int) *Parked {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.calls[id]
	if p == nil || p.gen != gen {
		return nil
	}
	t.remove(p)
	return p
}

// Holds reports whether the parked call p holds rsv.
func (t *Parking) Holds(p *Parked, rsv *ledgerport.Reservation) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return p != nil && rsv != nil && p.held == rsv
}

// remove takes p out of the table; t.mu is held.
func (t *Parking) remove(p *Parked) {
	delete(t.calls, p.id)
	if t.byOwner[p.owner]--; t.byOwner[p.owner] <= 0 {
		delete(t.byOwner, p.owner)
	}
	if p.timer != nil {
		p.timer.Stop()
	}
}

// park keeps p until its client's next round, at most timeout, with
// held (if not nil) the execution's reservation it holds and settle to
// commit its final answer should that round not come. It reports false,
// keeping nothing, when p's client already has maxParkedPerClient
// parked calls.
func (t *Parking) park(p *Parked, timeout time.Duration, held *ledgerport.Reservation, settle func(End)) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byOwner[p.owner] >= maxParkedPerClient {
		return false
	}
	p.held, p.settle = held, settle
	p.gen++
	gen := p.gen
	t.calls[p.id] = p
	t.byOwner[p.owner]++
	p.timer = time.AfterFunc(timeout, func() {
		if t.drop(p.id, gen) == p {
			t.abandon(p, ParkTimeout)
		}
	})
	return true
}

// abandon answers p's request with an error (no round came for it) and
// waits at most wait for the upstream's final answer, which it commits if
// p holds its execution's reservation.
func (t *Parking) abandon(p *Parked, wait time.Duration) {
	p.ask.answer <- nil
	select {
	case e := <-p.end:
		t.mu.Lock()
		settle := p.settle
		t.mu.Unlock()
		if settle != nil {
			settle(e)
		}
	case <-time.After(wait):
	}
}

// Peer is the parking peer whose upstream sessions introduce the gateway
// as a client with the capabilities caps.
func (t *Parking) Peer(caps *mcp.ClientCapabilities) *serverreq.Peer {
	relay := serverreq.Relayable(caps)
	b, _ := json.Marshal(serverreq.WireCapabilities(relay))
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.peers[string(b)]; ok {
		return p
	}
	p := t.ps.NewParking(relay, maxParkingCalls, maxParkingSpare)
	t.peers[string(b)] = p
	return p
}

// maxParkingCalls bounds the calls in flight on one parking peer, shared
// by every client with its capabilities (each has at most
// maxParkedPerClient waiting for its answers).
const maxParkingCalls = 64

// maxParkingSpare bounds the idle upstream sessions a parking peer keeps
// for its next calls; more are closed.
const maxParkingSpare = 2

// Close answers every parked request with an error, commits the
// final answers of the calls that hold their reservation (waiting a few
// seconds in all), and closes the parking peers' upstream sessions. The
// gateway calls it before its ledger closes, and the upstream again when
// it closes.
func (t *Parking) Close() {
	t.mu.Lock()
	peers, calls := t.peers, t.calls
	t.peers, t.calls, t.byOwner = map[string]*serverreq.Peer{}, map[string]*Parked{}, map[string]int{}
	t.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range calls {
		c.timer.Stop()
		wg.Go(func() { t.abandon(c, 2*time.Second) })
	}
	wg.Wait()
	for _, p := range peers {
		p.Close()
	}
}

// Round is a round of a call that waits on a parked call.
type Round struct {
	Tool string // the ledger's tool name, for the log
	// Rsv is the execution's reservation the round runs under (nil: a
	// read), reserved at most at ReservedAt, with lease Lease; Settle
	// commits the call's final answer under it should no round come.
	Rsv        *ledgerport.Reservation
	ReservedAt time.Time
	Lease      time.Duration
	Settle     func(End)
}

// Await waits for a parked call's answer, or its next request, which it
// parks and turns into an input_required round. A round of a recorded
// call whose upstream already had an answer holds the execution's
// reservation c.Rsv (its state says so), for at most what is left of
// the reservation's lease.
// The upstream gets the upstream timeout to send either: then its call
// is given up, and the outcome is unknown.
func (t *Parking) Await(ctx context.Context, c Round, p *Parked) (*mcp.CallToolResult, *wire.Slot, error) {
	timer := time.NewTimer(t.upstreamTimeout)
	defer timer.Stop()
	for {
		select {
		case e := <-p.end:
			return e.Res, e.Slot, e.Err
		case <-ctx.Done():
			return nil, &wire.Slot{}, ctx.Err()
		case <-timer.C:
			p.stop()
			return nil, p.slot, fmt.Errorf("%w (%s)", wire.ErrUpstreamTimeout, t.upstreamTimeout)
		case ask := <-p.asks:
			res, slot, err := t.parkRound(ctx, c, p, ask)
			if res == nil && err == nil {
				continue // not parked (too many for this client): the upstream goes on
			}
			return res, slot, err
		}
	}
}

// parkRound parks p with its request ask and returns the round that asks
// the client; nothing when the client has too many parked calls (ask is
// then answered with an error).
func (t *Parking) parkRound(ctx context.Context, c Round, p *Parked, ask *parkedAsk) (*mcp.CallToolResult, *wire.Slot, error) {
	p.ask = ask
	timeout := ParkTimeout
	var held *ledgerport.Reservation
	var settle func(End)
	if p.answered > 0 && c.Rsv != nil {
		held, settle, p.heldAt = c.Rsv, c.Settle, c.ReservedAt
		lease := c.Lease
		timeout = min(timeout, time.Until(c.ReservedAt.Add(lease))-min(lease/10, 5*time.Second))
		if timeout <= 0 {
			// No time left to wait for the client under this reservation.
			ask.answer <- nil
			return nil, nil, nil
		}
	}
	state := parkState(p.id, ask.key, held != nil)
	raw, err := json.Marshal(map[string]any{"resultType": "input_required", "content": []any{},
		"inputRequests": mcp.InputRequestMap{ask.key: ask.params}, "requestState": state})
	var res mcp.CallToolResult
	if err == nil {
		err = json.Unmarshal(raw, &res)
	}
	if err != nil {
		ask.answer <- nil
		return nil, &wire.Slot{}, fmt.Errorf("park: %w", err)
	}
	if !t.park(p, timeout, held, settle) {
		t.logger.WarnContext(ctx, "upstream request refused: the client has too many calls waiting for its answers",
			"tool", c.Tool, "max", maxParkedPerClient)
		ask.answer <- nil
		return nil, nil, nil
	}
	slot := &wire.Slot{}
	slot.Put(raw, nil)
	return &res, slot, nil
}

// Ask hands a request of the upstream during a parked call to the
// call's client, as its next round, and waits for the answer.
func (p *Parked) Ask(ctx context.Context, params mcp.InputRequest) (mcp.Result, error) {
	n := p.n.Add(1)
	if n > maxParkedRounds {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("more than %d requests in one call", maxParkedRounds)}
	}
	ask := &parkedAsk{key: fmt.Sprintf("r%d", n), params: params, answer: make(chan mcp.Result, 1)}
	select {
	case p.asks <- ask:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case res := <-ask.answer:
		if res == nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the client did not answer"}
		}
		return res, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
