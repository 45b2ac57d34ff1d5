package ledger

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// groupCommit runs the batches of many namespaces in shared transactions
// when the store can (GroupUpdater): each namespace's writer still forms
// its own batch, in order, but hands it here at once instead of running
// its own Update. On an idle ledger (the previous group held one
// operation) a batch handed in while no group runs runs at once, alone,
// in the writer's goroutine; otherwise batches wait for the next group
// and run together, as one UpdateGroup: one COMMIT for all of them. So an
// idle ledger pays nothing, and N busy namespaces pay about one durable
// write per round, not N.
//
// Under load a group waits up to linger (Config.Linger) for as many
// operations as the previous group held, counting those in the parts
// handed in and those still in any namespace's queue (queued), and for
// every namespace with queued operations to have handed its batch in
// (joiner.backlog: queued operations of namespaces without a part would
// not join this group); when it starts, each part takes in the
// operations its namespace queued meanwhile (joiner.more). This is the
// wait a single namespace's writer makes, made once for the whole
// ledger: the requests answered by one group come back as the next,
// whatever their namespaces. (Namespace writers under a group do not
// linger themselves: a request they held back would be counted nowhere,
// and the group would wait for it.) Without the ledger-wide count each
// group took the few batches that came back first and the next group the
// few after them; counting the queued operations of namespaces that had
// not handed their batch in yet, groups of 14 operations alternated
// where one namespace's batches held 30 (BENCHMARKS.md, issue 31).
type groupCommit struct {
	store  GroupUpdater
	linger time.Duration

	mu         sync.Mutex
	pending    []*groupPart
	pendingOps int
	runners    int           // goroutines running groups (at most maxRunners); new parts wait for one
	arrived    chan struct{} // a part was added or an op queued (cap 1)
	lastOps    int           // operations of the previous group

	queued atomic.Int64 // ops in namespaces' queues (not those waiting for room), not yet taken into a batch
}

// signal wakes a lingering group: an op was queued or a part added.
func (g *groupCommit) signal() {
	select {
	case g.arrived <- struct{}{}:
	default:
	}
}

func newGroupCommit(store GroupUpdater, linger time.Duration) *groupCommit {
	return &groupCommit{store: store, linger: linger, arrived: make(chan struct{}, 1)}
}

// joiner is a namespace's queue as its batch, waiting for its group,
// sees it.
type joiner interface {
	more() []string // takes in the ops queued since; returns the batch's keys
	backlog() int   // ops queued, not taken in yet
}

// groupPart is one namespace's batch waiting for its group.
type groupPart struct {
	chain Chain
	keys  []string
	fn    func(ctx context.Context, tx Tx) error
	join  joiner // the namespace's queue: its ops queued since, to take in
	done  chan error
}

// ops is about how many operations the part holds (its keys; at least 1).
func (p *groupPart) ops() int { return max(len(p.keys), 1) }

// maxGroupParts bounds the namespaces of one group: a round of more
// waits for the next.
const maxGroupParts = 128

// maxRunners bounds the groups in flight at once. Their namespaces never
// overlap (a namespace has one batch in flight), so several could run
// side by side; but measured on PostgreSQL with 32 clients over 16
// namespaces, 2 or 4 at once made smaller groups and cost a quarter of
// the throughput of 1 (BENCHMARKS.md, issue 31).
const maxRunners = 1

var groupParts = promauto.NewHistogram(prometheus.HistogramOpts{
	Name:    "ledger_writer_group_namespaces",
	Help:    "Namespaces whose batches shared one transaction (group commit across namespaces; 1: a batch alone).",
	Buckets: prometheus.ExponentialBuckets(1, 2, 8),
})

// update runs fn, which decides about keys, on c: alone at once if no
// group runs, else in the next group. It returns what Chain.Update would.
func (g *groupCommit) update(ctx context.Context, c Chain, keys []string, fn func(ctx context.Context, tx Tx) error, join joiner) error {
	g.mu.Lock()
	if g.runners == 0 && g.lastOps <= 1 {
		g.runners++
		g.lastOps = max(len(keys), 1)
		g.mu.Unlock()
		groupParts.Observe(1)
		err := g.alone(ctx, c, keys, fn)
		g.mu.Lock()
		g.runners--
		g.spawn()
		g.mu.Unlock()
		return err
	}
	p := &groupPart{chain: c, keys: keys, fn: fn, join: join, done: make(chan error, 1)}
	g.pending = append(g.pending, p)
	g.pendingOps += p.ops()
	g.spawn()
	g.mu.Unlock()
	g.signal()
	return <-p.done
}

// spawn starts a runner for the pending parts if fewer than maxRunners
// run. Called with mu held.
func (g *groupCommit) spawn() {
	if len(g.pending) > 0 && g.runners < maxRunners {
		g.runners++
		go g.run()
	}
}

// run runs groups until none is pending.
func (g *groupCommit) run() {
	for {
		g.mu.Lock()
		if len(g.pending) == 0 {
			g.runners--
			g.mu.Unlock()
			return
		}
		if g.linger > 0 && g.lastOps > 1 && !g.enough(g.lastOps) {
			ops := g.lastOps
			g.mu.Unlock()
			g.await(ops)
			g.mu.Lock()
			if len(g.pending) == 0 { // another runner took them meanwhile
				g.mu.Unlock()
				continue
			}
		}
		n := min(len(g.pending), maxGroupParts)
		parts := append([]*groupPart(nil), g.pending[:n]...)
		g.pending = append(g.pending[:0], g.pending[n:]...)
		ops := 0
		for _, p := range parts {
			ops += p.ops()
		}
		g.pendingOps -= ops
		g.mu.Unlock()
		ops = 0
		for _, p := range parts {
			p.keys = p.join.more()
			ops += p.ops()
		}
		g.mu.Lock()
		g.lastOps = ops
		g.mu.Unlock()
		g.runGroup(parts)
	}
}

// enough reports whether ops operations wait, in the parts handed in or
// still queued in their namespaces, and every namespace with queued
// operations has handed its part in. mu is held.
func (g *groupCommit) enough(ops int) bool {
	queued := int(g.queued.Load())
	if g.pendingOps+queued < ops {
		return false
	}
	for _, p := range g.pending {
		queued -= p.join.backlog()
	}
	return queued <= 0
}

// await waits up to linger for enough(ops).
func (g *groupCommit) await(ops int) {
	t := time.NewTimer(g.linger)
	defer t.Stop()
	for {
		select {
		case <-g.arrived:
			g.mu.Lock()
			enough := g.enough(ops)
			g.mu.Unlock()
			if enough {
				return
			}
		case <-t.C:
			return
		}
	}
}

// runGroup runs parts in one UpdateGroup. When one part's fn fails (an
// internal failure of its namespace: domain refusals never fail a
// batch), the group rolls back; that part gets its error and the others
// run again, each alone, so that one namespace's failure is not
// another's; when the database refused the group's writes for a reason
// the driver cannot pin on one part, every part runs again alone. A
// failure of the database itself fails every part, as it would have
// failed each Update.
func (g *groupCommit) runGroup(parts []*groupPart) {
	groupParts.Observe(float64(len(parts)))
	ctx := context.Background() // as runBatch: no request may interrupt a shared transaction
	if len(parts) == 1 {
		parts[0].done <- g.alone(ctx, parts[0].chain, parts[0].keys, parts[0].fn)
		return
	}
	gp := make([]GroupPart, len(parts))
	for i, p := range parts {
		gp[i] = GroupPart{Chain: p.chain, Keys: p.keys, Fn: func(ctx context.Context, tx Tx) error {
			if err := p.fn(ctx, tx); err != nil {
				return &PartError{Part: i, Err: err}
			}
			return nil
		}}
	}
	err := g.store.UpdateGroup(ctx, gp)
	var pe *PartError
	if !errors.As(err, &pe) || pe.Part >= len(parts) {
		for _, p := range parts {
			p.done <- err
		}
		return
	}
	if pe.Part >= 0 {
		parts[pe.Part].done <- pe.Err
	}
	var wg sync.WaitGroup
	for i, p := range parts {
		if i == pe.Part {
			continue
		}
		wg.Go(func() { p.done <- g.alone(ctx, p.chain, p.keys, p.fn) })
	}
	wg.Wait()
}

// alone runs one namespace's batch as a group of one, so that the driver
// reads its keys ahead with its head.
func (g *groupCommit) alone(ctx context.Context, c Chain, keys []string, fn func(ctx context.Context, tx Tx) error) error {
	return g.store.UpdateGroup(ctx, []GroupPart{{Chain: c, Keys: keys, Fn: fn}})
}
