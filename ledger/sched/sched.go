// Package sched forms the ledger's write groups. Operations are added per
// namespace and come back as futures; one loop takes what is pending — at
// most MaxOps operations of each namespace, in the order they were added,
// from at most MaxNamespaces namespaces — hands that group to one flush
// function, and completes the futures of its operations with the flush's
// answer for their namespace. So N busy namespaces cost one flush (one
// durable COMMIT) per round, not N, and an idle ledger's lone operation
// is flushed at once.
//
// Under load (the previous group held more than one operation) a group
// waits up to Linger for as many operations as the previous one held: the
// requests answered by one group come back as the next, whatever their
// namespaces.
package sched

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrClosed is the answer to an Add after Close.
var ErrClosed = errors.New("sched: the queue is closed")

// Options bound the groups. The zero value of each field takes its default.
type Options struct {
	MaxOps        int           // operations of one namespace in one group (default 256)
	MaxNamespaces int           // namespaces in one group (default 128)
	MaxPending    int           // operations of one namespace waiting: Add waits beyond it (default MaxOps)
	Linger        time.Duration // how long a group under load waits to fill (0: never)
}

// Batch is one namespace's operations in a group, in the order added.
type Batch[T any] struct {
	NS    string
	Items []T
}

// Flush stores a group and returns, for each of its batches, nil once the
// batch is durable, or why it is not.
type Flush[T any] func(group []Batch[T]) []error

// Future is the outcome of one added operation.
type Future struct {
	done chan struct{}
	err  error
}

// Wait returns the flush's answer for the operation's batch once it is
// known, or ctx's error if ctx ends first (the operation is flushed all
// the same).
func (f *Future) Wait(ctx context.Context) error {
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Done reports whether the operation's batch has been flushed (its
// answer known).
func (f *Future) Done() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// Queue holds the operations waiting for a group.
type Queue[T any] struct {
	flush Flush[T]
	opts  Options

	mu      sync.Mutex
	pending map[string]*nsQueue[T]
	order   []string // namespaces with pending operations, by their first
	count   int      // operations pending
	closed  bool
	arrived chan struct{} // an operation was added (cap 1)
	done    chan struct{} // closed when the loop has flushed everything and exited
}

type entry[T any] struct {
	item T
	fut  *Future
}

type nsQueue[T any] struct {
	entries []entry[T]
	room    chan struct{} // closed when the loop takes entries (Adds waiting for room)
}

// New starts a queue whose groups go to flush.
func New[T any](flush Flush[T], opts Options) *Queue[T] {
	if opts.MaxOps <= 0 {
		opts.MaxOps = 256
	}
	if opts.MaxNamespaces <= 0 {
		opts.MaxNamespaces = 128
	}
	if opts.MaxPending <= 0 {
		opts.MaxPending = opts.MaxOps
	}
	q := &Queue[T]{flush: flush, opts: opts, pending: map[string]*nsQueue[T]{},
		arrived: make(chan struct{}, 1), done: make(chan struct{})}
	go q.loop()
	return q
}

// Add queues item for namespace ns, waiting for room while MaxPending of
// its operations wait (or until ctx ends), and returns its future.
func (q *Queue[T]) Add(ctx context.Context, ns string, item T) (*Future, error) {
	f := &Future{done: make(chan struct{})}
	for {
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return nil, ErrClosed
		}
		p := q.pending[ns]
		if p == nil {
			p = &nsQueue[T]{room: make(chan struct{})}
			q.pending[ns] = p
		}
		if len(p.entries) < q.opts.MaxPending {
			if len(p.entries) == 0 {
				q.order = append(q.order, ns)
			}
			p.entries = append(p.entries, entry[T]{item, f})
			q.count++
			q.mu.Unlock()
			q.signal()
			return f, nil
		}
		room := p.room
		q.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (q *Queue[T]) signal() {
	select {
	case q.arrived <- struct{}{}:
	default:
	}
}

// Close flushes what is pending and stops the loop; later Adds return
// ErrClosed.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
	<-q.done
}

// loop forms and flushes groups until the queue is closed and empty.
func (q *Queue[T]) loop() {
	defer close(q.done)
	last := 0 // operations of the previous group
	var timer *time.Timer
	for {
		q.mu.Lock()
		for q.count == 0 {
			if q.closed {
				q.mu.Unlock()
				return
			}
			q.mu.Unlock()
			<-q.arrived
			q.mu.Lock()
		}
		if q.opts.Linger > 0 && last > 1 && q.count < last && !q.closed {
			q.mu.Unlock()
			timer = q.linger(timer, last)
			q.mu.Lock()
		}
		group, futs := q.take()
		q.mu.Unlock()
		errs := q.flush(group)
		last = 0
		for i := range group {
			last += len(group[i].Items)
			for _, f := range futs[i] {
				f.err = errs[i]
				close(f.done)
			}
		}
	}
}

// linger waits up to Linger for ops operations to be pending.
func (q *Queue[T]) linger(t *time.Timer, ops int) *time.Timer {
	if t == nil {
		t = time.NewTimer(q.opts.Linger)
	} else {
		t.Reset(q.opts.Linger)
	}
	defer t.Stop()
	for {
		select {
		case <-q.arrived:
			q.mu.Lock()
			enough := q.count >= ops || q.closed
			q.mu.Unlock()
			if enough {
				return t
			}
		case <-t.C:
			return t
		}
	}
}

// take removes the next group from the pending operations. mu is held.
func (q *Queue[T]) take() ([]Batch[T], [][]*Future) {
	n := min(len(q.order), q.opts.MaxNamespaces)
	group := make([]Batch[T], n)
	futs := make([][]*Future, n)
	var rest []string
	for i, ns := range q.order[:n] {
		p := q.pending[ns]
		k := min(len(p.entries), q.opts.MaxOps)
		group[i].NS = ns
		group[i].Items = make([]T, k)
		futs[i] = make([]*Future, k)
		for j, e := range p.entries[:k] {
			group[i].Items[j], futs[i][j] = e.item, e.fut
		}
		p.entries = append(p.entries[:0], p.entries[k:]...)
		q.count -= k
		close(p.room)
		p.room = make(chan struct{})
		if len(p.entries) > 0 {
			rest = append(rest, ns) // its next operations go in the next group
		} else {
			delete(q.pending, ns)
		}
	}
	q.order = append(append(q.order[:0:0], q.order[n:]...), rest...)
	return group, futs
}
