//lint:file-ignore SA1019 sampling and roots are deprecated (SEP-2577), not gone: a client that has them is relayed them

package mcpgate

import (
	"cmp"
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/client"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate/ledgerport"
	"github.com/effect-ledger/effect-ledger/mcpgate/rounds"
	"github.com/effect-ledger/effect-ledger/mcpgate/tasks"
	"github.com/effect-ledger/effect-ledger/mcpgate/wire"
)

// Parked calls (SPEC §11.1: a 2026-07-28 client's call to an older
// upstream, whose requests during the call become rounds) are the
// extension in package rounds; this file runs a round of one on the
// call's path: sendParked in send, heldRound in guarded, a held round in
// finish (rounds.Parking.Holds).

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

// Close stops the gateway's parked calls (rounds.Parking.Close).
func (g *Gateway) Close() error {
	g.parked.Close()
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
	if id, question, _, ok := rounds.ParsePark(c.upState); ok && p == nil {
		var bound bool
		if p, bound = g.parked.Take(id, question, c.ledgerTool, c.class.Recorded(), hash); bound {
			return nil, &wire.Slot{}, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "requestState: issued for another call"}
		}
		if p == nil {
			g.logger.InfoContext(ctx, "parked call gone (timed out, or another process): the call runs afresh", "tool", c.ledgerTool)
		}
	}
	if p != nil {
		p.Answer(c.inputResponses)
		c.peer, c.route = p.Where()
		c.park = p
		return g.await(ctx, c, p)
	}
	pp := g.parked.Peer(c.caller.caps)
	// A session within the round's lease; the upstream's call outlives
	// the round's request.
	s, r, done, err := pp.Acquire(ctx)
	if err != nil {
		return nil, &wire.Slot{}, fmt.Errorf("%w: %w", rounds.ErrNotSent, err)
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rounds.ParkTimeout+g.cfg.Lease)
	uctx, slot := wire.WithSlot(uctx)
	p = rounds.NewParked(pp, r, c.ledgerTool, hash, c.class.Recorded(), tasks.OwnerOf(ctx), slot, cancel)
	c.peer, c.route, c.park = pp, r, p
	up := *c                                  // what the upstream is sent: a copy
	up.upState, up.upInput = "", nil          // the upstream knows no rounds
	up.meta = tasks.WithoutParamsTask(c.meta) // nor tasks: the call runs as a plain call
	go func() {
		defer cancel()
		defer done()
		res, slot, err := g.sendOn(uctx, s, &up)
		p.Done(rounds.End{Res: res, Slot: slot, Err: err})
	}()
	return g.await(ctx, c, p)
}

// await waits for the parked call p's answer or its next request (a
// round), under the reservation of c's round.
func (g *Gateway) await(ctx context.Context, c *call, p *rounds.Parked) (*mcp.CallToolResult, *wire.Slot, error) {
	r := rounds.Round{Tool: c.ledgerTool, Rsv: c.rsv, ReservedAt: c.reservedAt, Lease: cmp.Or(c.lease, g.cfg.Lease)}
	if c.rsv != nil {
		r.Settle = g.settleParked(ctx, c, c.rsv)
	}
	return g.parked.Await(ctx, r, p)
}

// settleParked is how a held parked call's final answer is committed
// when no round comes for it: as a round's would be.
func (g *Gateway) settleParked(ctx context.Context, c *call, rsv *ledgerport.Reservation) func(rounds.End) {
	ctx = context.WithoutCancel(ctx)
	return func(e rounds.End) {
		v := judge(e.Res, e.Slot, e.Err)
		if v.inputRequired {
			v = verdict{} // asked again with nobody to answer: unknown
		}
		_, _ = g.finish(ctx, c, rsv, e.Res, v, e.Err)
	}
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
// for key, claimed; the round must not reserve. gone: the
// round's state says its parked call held the reservation, but it is
// here no more (timed out, another process).
func (g *Gateway) heldRound(c *call, key string) (p *rounds.Parked, gone bool) {
	id, question, held, ok := rounds.ParsePark(c.upState)
	if !ok || !held || !c.parked {
		return nil, false
	}
	hash, err := client.Fingerprint(c.args)
	if err != nil {
		return nil, true
	}
	p = g.parked.ClaimHeld(id, question, key, c.ledgerTool, hash)
	return p, p == nil
}
