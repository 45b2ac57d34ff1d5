//lint:file-ignore SA1019 sampling and roots are deprecated (SEP-2577), not gone: a client that has them is relayed them

package mcpgate

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/serverreq"
	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
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

// parsePark reads a round's upstream state: the parked call, the
// question its answers are for, and whether it held the reservation.
func parsePark(state string) (id, question string, held, ok bool) {
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

// parkTimeout is how long a parked call waits for the client's next
// round; then its request is answered with an error.
const parkTimeout = 15 * time.Minute

// maxParkedRounds bounds the requests of one parked call: past it, the
// upstream's request is answered with an error.
const maxParkedRounds = 16

// CodeUpstreamBusy is the not_applied code of a call that found no free
// upstream session within its lease, and so was never sent.
const CodeUpstreamBusy = "UPSTREAM_BUSY"

// errNotSent is a parked call that was never sent upstream.
var errNotSent = errors.New("not sent: every upstream session of this client is busy")

// parkedCall is a call whose upstream waits for the client's answer.
type parkedCall struct {
	id    string
	asks  chan *parkedAsk // the upstream's requests during the call
	end   chan parkedEnd  // the call's answer, once
	n     atomic.Int64    // requests so far, for their inputRequests keys
	ask   *parkedAsk      // the request the client is asked now
	timer *time.Timer
	// Where the call runs, for what its client could not answer.
	peer  *serverreq.Peer
	route *serverreq.Route
	// What it belongs to: a requestState naming it serves this call only.
	tool, hash string
	recorded   bool
	answered   int // answers delivered to the upstream, under parkTable.mu
	// held: the execution's reservation, kept (uncommitted) across a
	// round asked after an answer; settle commits the call's final
	// answer with it if no round comes for it. Under parkTable.mu.
	held   *ledgerport.Reservation
	settle func(parkedEnd)
	heldAt time.Time // when held was reserved (at most)
	owner  string    // taskOwner of the call's client
	gen    int       // times parked, under parkTable.mu: a timer serves its own
	// slot sees the upstream call's answer (and the stray ones, for the
	// log); stop gives the upstream call up.
	slot *wire.Slot
	stop context.CancelFunc
}

// parkedAsk is one request of the upstream, waiting for its answer.
type parkedAsk struct {
	key    string
	params mcp.InputRequest
	answer chan mcp.Result // nil: no answer came
}

type parkedEnd struct {
	res  *mcp.CallToolResult
	slot *wire.Slot
	err  error
}

// parkTable holds the parked calls of this process.
type parkTable struct {
	mu      sync.Mutex
	calls   map[string]*parkedCall
	byOwner map[string]int             // parked calls by owner
	peers   map[string]*serverreq.Peer // parking peers, by their client's capabilities
}

func newParkTable() *parkTable {
	return &parkTable{calls: map[string]*parkedCall{}, peers: map[string]*serverreq.Peer{}, byOwner: map[string]int{}}
}

// take removes and returns the parked call id if it still waits, holds
// no reservation (that one is claimHeld's) and belongs to the call c;
// bound reports a call that exists for another.
func (t *parkTable) take(id, question string, c *call, hash string) (p *parkedCall, bound bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p = t.calls[id]
	if p == nil {
		return nil, false
	}
	if p.held != nil || p.tool != c.ledgerTool || p.hash != hash || p.recorded != c.class.Recorded() {
		return nil, true
	}
	if p.ask.key != question {
		return nil, false // an answer to an earlier question of the call: stale
	}
	t.remove(p)
	p.answered++
	return p, false
}

// claimHeld removes and returns the parked call id with the reservation
// it holds for key, if it waits for the answer to question, in one step:
// of two copies of a round, one gets it.
func (t *parkTable) claimHeld(id, question, key string, c *call, hash string) *parkedCall {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.calls[id]
	if p == nil || p.held == nil || p.held.Key != key || p.tool != c.ledgerTool || p.hash != hash || p.ask.key != question {
		return nil
	}
	t.remove(p)
	p.answered++
	return p
}

// drop removes the parked call id if it still waits in its gen-th park.
func (t *parkTable) drop(id string, gen int) *parkedCall {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.calls[id]
	if p == nil || p.gen != gen {
		return nil
	}
	t.remove(p)
	return p
}

// holds reports whether the parked call p holds rsv.
func (t *parkTable) holds(p *parkedCall, rsv *ledgerport.Reservation) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return p != nil && rsv != nil && p.held == rsv
}

// remove takes p out of the table; t.mu is held.
func (t *parkTable) remove(p *parkedCall) {
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
func (t *parkTable) park(p *parkedCall, timeout time.Duration, held *ledgerport.Reservation, settle func(parkedEnd)) bool {
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
			t.abandon(p, parkTimeout)
		}
	})
	return true
}

// abandon answers p's request with an error (no round came for it) and
// waits at most wait for the upstream's final answer, which it commits if
// p holds its execution's reservation.
func (t *parkTable) abandon(p *parkedCall, wait time.Duration) {
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

// parks reports whether a call of a client of revision version goes on
// a parking peer: a 2026-07-28 client, an upstream of an older revision.
func (g *Gateway) parks(ctx context.Context, version string) bool {
	if !wire.Stateless(version) {
		return false
	}
	s, err := g.up.Session(ctx)
	if err != nil {
		return false
	}
	ir := s.InitializeResult()
	return ir != nil && !wire.Stateless(ir.ProtocolVersion)
}

// parkingPeer is the peer whose upstream sessions introduce the
// gateway as a client with the capabilities caps.
func (g *Gateway) parkingPeer(caps *mcp.ClientCapabilities) *serverreq.Peer {
	relay := serverreq.Relayable(caps)
	b, _ := json.Marshal(serverreq.WireCapabilities(relay))
	g.parked.mu.Lock()
	defer g.parked.mu.Unlock()
	if p, ok := g.parked.peers[string(b)]; ok {
		return p
	}
	p := g.peers.NewParking(relay, maxParkingCalls, maxParkingSpare)
	g.parked.peers[string(b)] = p
	return p
}

// maxParkingCalls bounds the calls in flight on one parking peer, shared
// by every client with its capabilities (each has at most
// maxParkedPerClient waiting for its answers).
const maxParkingCalls = 64

// maxParkingSpare bounds the idle upstream sessions a parking peer keeps
// for its next calls; more are closed.
const maxParkingSpare = 2

// closeParking answers every parked request with an error, commits the
// final answers of the calls that hold their reservation (waiting a few
// seconds in all), and closes the parking peers' upstream sessions. The
// gateway calls it before its ledger closes, and the upstream again when
// it closes.
func (g *Gateway) closeParking() {
	g.parked.mu.Lock()
	peers, calls := g.parked.peers, g.parked.calls
	g.parked.peers, g.parked.calls, g.parked.byOwner = map[string]*serverreq.Peer{}, map[string]*parkedCall{}, map[string]int{}
	g.parked.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range calls {
		c.timer.Stop()
		wg.Go(func() { g.parked.abandon(c, 2*time.Second) })
	}
	wg.Wait()
	for _, p := range peers {
		p.Close()
	}
}

// Close stops the gateway's parked calls (closeParking).
func (g *Gateway) Close() error {
	g.closeParking()
	return nil
}

// sendParked makes a parked call's next round: the answer to its parked
// request, or the call itself on a parking peer's session. It returns
// the call's answer, or an input_required round for the upstream's
// next request.
func (g *Gateway) sendParked(ctx context.Context, c *call) (*mcp.CallToolResult, *wire.Slot, error) {
	hash, err := client.Fingerprint(c.args)
	if err != nil {
		return nil, &wire.Slot{}, err
	}
	p := c.park // claimed with its held reservation (guarded)
	if id, question, _, ok := parsePark(c.upState); ok && p == nil {
		var bound bool
		if p, bound = g.parked.take(id, question, c, hash); bound {
			return nil, &wire.Slot{}, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "requestState: issued for another call"}
		}
		if p == nil {
			g.logger.InfoContext(ctx, "parked call gone (timed out, or another process): the call runs afresh", "tool", c.ledgerTool)
		}
	}
	if p != nil {
		var answer mcp.Result
		if a, ok := c.inputResponses[p.ask.key].(mcp.Result); ok {
			answer = a
		}
		p.ask.answer <- answer
		c.peer, c.route, c.park = p.peer, p.route, p
		return g.await(ctx, c, p)
	}
	pp := g.parkingPeer(c.caller.caps)
	// A session within the round's lease; the upstream's call outlives
	// the round's request.
	s, r, done, err := pp.Acquire(ctx)
	if err != nil {
		return nil, &wire.Slot{}, fmt.Errorf("%w: %w", errNotSent, err)
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), parkTimeout+g.cfg.Lease)
	uctx, slot := wire.WithSlot(uctx)
	p = &parkedCall{id: rand.Text(), asks: make(chan *parkedAsk), end: make(chan parkedEnd, 1), peer: pp, route: r,
		tool: c.ledgerTool, hash: hash, recorded: c.class.Recorded(), owner: tasks.OwnerOf(ctx), slot: slot, stop: cancel}
	r.Park = p
	c.peer, c.route, c.park = pp, r, p
	up := *c                                  // what the upstream is sent: a copy
	up.upState, up.upInput = "", nil          // the upstream knows no rounds
	up.meta = tasks.WithoutParamsTask(c.meta) // nor tasks: the call runs as a plain call
	go func() {
		defer cancel()
		defer done()
		res, slot, err := g.sendOn(uctx, s, &up)
		p.end <- parkedEnd{res, slot, err}
	}()
	return g.await(ctx, c, p)
}

// settleParked is how a held parked call's final answer is committed
// when no round comes for it (park.go): as a round's would be.
func (g *Gateway) settleParked(ctx context.Context, c *call, rsv *ledgerport.Reservation) func(parkedEnd) {
	ctx = context.WithoutCancel(ctx)
	return func(e parkedEnd) {
		v := judge(e.res, e.slot, e.err)
		if v.inputRequired {
			v = verdict{} // asked again with nobody to answer: unknown
		}
		_, _ = g.finish(ctx, c, rsv, e.res, v, e.err)
	}
}

// await waits for a parked call's answer, or its next request, which it
// parks and turns into an input_required round. A round of a recorded
// call whose upstream already had an answer holds the execution's
// reservation c.rsv (its state says so), for at most what is left of
// the reservation's lease.
// The upstream gets Config.UpstreamTimeout to send either: then its call
// is given up, and the outcome is unknown.
func (g *Gateway) await(ctx context.Context, c *call, p *parkedCall) (*mcp.CallToolResult, *wire.Slot, error) {
	timer := time.NewTimer(g.cfg.UpstreamTimeout)
	defer timer.Stop()
	for {
		select {
		case e := <-p.end:
			return e.res, e.slot, e.err
		case <-ctx.Done():
			return nil, &wire.Slot{}, ctx.Err()
		case <-timer.C:
			p.stop()
			return nil, p.slot, fmt.Errorf("%w (%s)", errUpstreamTimeout, g.cfg.UpstreamTimeout)
		case ask := <-p.asks:
			res, slot, err := g.parkRound(ctx, c, p, ask)
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
func (g *Gateway) parkRound(ctx context.Context, c *call, p *parkedCall, ask *parkedAsk) (*mcp.CallToolResult, *wire.Slot, error) {
	p.ask = ask
	timeout := parkTimeout
	var held *ledgerport.Reservation
	var settle func(parkedEnd)
	if p.answered > 0 && c.rsv != nil {
		held, settle, p.heldAt = c.rsv, g.settleParked(ctx, c, c.rsv), c.reservedAt
		lease := cmp.Or(c.lease, g.cfg.Lease)
		timeout = min(timeout, time.Until(c.reservedAt.Add(lease))-min(lease/10, 5*time.Second))
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
	if !g.parked.park(p, timeout, held, settle) {
		g.logger.WarnContext(ctx, "upstream request refused: the client has too many calls waiting for its answers",
			"tool", c.ledgerTool, "max", maxParkedPerClient)
		ask.answer <- nil
		return nil, nil, nil
	}
	slot := &wire.Slot{}
	slot.Put(raw, nil)
	return &res, slot, nil
}

// heldGoneAnswer answers a round whose state says its parked call held
// the execution's reservation, when that parked call is gone: nothing is
// run, and the ledger tells the outcome once the call is made afresh.
func heldGoneAnswer(key string) *mcp.CallToolResult {
	return answer(ledger.ECodeInProgress, key, fmt.Sprintf("This answer was not delivered: the tool, which had "+
		"been answered before and may have acted, no longer waits for it here (it was answered already, it gave "+
		"up, or the gateway restarted), so nothing was run (idempotency key %s). Call it again without "+
		"requestState: the ledger answers with its recorded outcome, or says the call is still open.", key))
}

// heldRound is a round's parked call holding the execution's reservation
// for key, claimed (park.go); the round must not reserve. gone: the
// round's state says its parked call held the reservation, but it is
// here no more (timed out, another process).
func (g *Gateway) heldRound(c *call, key string) (p *parkedCall, gone bool) {
	id, question, held, ok := parsePark(c.upState)
	if !ok || !held || !c.parked {
		return nil, false
	}
	hash, err := client.Fingerprint(c.args)
	if err != nil {
		return nil, true
	}
	p = g.parked.claimHeld(id, question, key, c, hash)
	return p, p == nil
}

// Ask hands a request of the upstream during a parked call to the
// call's client, as its next round, and waits for the answer.
func (p *parkedCall) Ask(ctx context.Context, params mcp.InputRequest) (mcp.Result, error) {
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
