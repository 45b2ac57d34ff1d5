package ledger

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Waiting for an in-flight effect (SPEC §8). A reserve with wait_ms that
// finds its key reserved by another reservation parks in its own request
// goroutine: it holds no transaction, no database lock and no place in
// the writer's queue. It is woken by the writer after the COMMIT of a
// batch that committed or resolved the key, by a timer at the lease's end,
// or when its wait runs out, and then submits its decision again as if it
// had just arrived.

// Wait bounds.
const (
	// MaxWaitMS is the largest wait_ms a reserve may ask for.
	MaxWaitMS = 60_000
	// DefaultMaxWaiters bounds how many reserves may wait at once.
	DefaultMaxWaiters = 10_000
)

// Ends of a wait, the label of ledger_reserve_waits_total.
const (
	waitFinalized = "finalized" // the reservation was committed or resolved
	waitLeaseEnd  = "lease_end" // the reservation's lease ended
	waitTimeout   = "timeout"   // wait_ms ran out while the key stayed reserved
	waitCancelled = "cancelled" // the client went away
	waitShutdown  = "shutdown"  // the server is stopping
	waitLimit     = "limit"     // too many waiters: answered without waiting
)

var (
	waitersGauge = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "ledger_reserve_waiting",
		Help: "Reserve requests parked waiting for another reservation of their key to end (wait_ms).",
	})
	waitEnds = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "ledger_reserve_waits_total",
		Help: "Waits of reserve requests (wait_ms) by how they ended: finalized, lease_end, timeout, cancelled, shutdown or limit.",
	}, []string{"end"})
)

// Parker is told when a reserve parks to wait for another reservation and
// when it resumes, so that a server can free what a parked request does
// not use (its in-flight slot). Park and Resume are called in pairs from
// the request's goroutine; Resume is not called when the wait ends because
// ctx is done.
type Parker interface {
	Park()
	// Resume takes back what Park gave up; an error (ctx done) ends the
	// request without a decision.
	Resume(ctx context.Context) error
}

type parkerKey struct{}

// NewContextWithParker returns ctx carrying p, which Reserve calls around
// each wait.
func NewContextWithParker(ctx context.Context, p Parker) context.Context {
	return context.WithValue(ctx, parkerKey{}, p)
}

// ParkerFromContext returns the Parker of ctx, or nil.
func ParkerFromContext(ctx context.Context) Parker {
	p, _ := ctx.Value(parkerKey{}).(Parker)
	return p
}

// waitRegistry wakes the reserves waiting on a key. Each key with waiters
// has one channel, closed (waking all of them) when the key's reservation
// ends, then forgotten; a key without waiters has no entry.
type waitRegistry struct {
	mu    sync.Mutex
	keys  map[string]*waitList
	max   int
	count atomic.Int64 // waiters subscribed, for the writer's fast path
	stop  chan struct{}
	once  sync.Once
}

type waitList struct {
	ch chan struct{}
	n  int
}

func newWaitRegistry(max int) *waitRegistry {
	if max <= 0 {
		max = DefaultMaxWaiters
	}
	return &waitRegistry{keys: map[string]*waitList{}, max: max, stop: make(chan struct{})}
}

// subscribe registers one waiter on key and returns the channel closed
// when the key's reservation ends. ok is false when the registry is full
// or stopped.
func (r *waitRegistry) subscribe(key string) (ch <-chan struct{}, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.stop:
		return nil, false
	default:
	}
	if r.count.Load() >= int64(r.max) {
		return nil, false
	}
	l := r.keys[key]
	if l == nil {
		l = &waitList{ch: make(chan struct{})}
		r.keys[key] = l
	}
	l.n++
	r.count.Add(1)
	waitersGauge.Inc()
	return l.ch, true
}

// unsubscribe removes one waiter of key that subscribed on ch, unless a
// notify already took the whole list away.
func (r *waitRegistry) unsubscribe(key string, ch <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.keys[key]
	if l == nil || l.ch != ch {
		return
	}
	l.n--
	r.count.Add(-1)
	waitersGauge.Dec()
	if l.n == 0 {
		delete(r.keys, key)
	}
}

// waitKey names key of namespace ns in the registry.
func waitKey(ns, key string) string { return ns + "\x00" + key }

// notify wakes every waiter of keys of namespace ns, or of every key of
// ns when keys is nil (a driver that may have missed notifications). The
// store calls it after COMMIT.
func (r *waitRegistry) notify(ns string, keys []string) {
	if r.count.Load() == 0 || keys != nil && len(keys) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	wake := func(k string, l *waitList) {
		close(l.ch)
		delete(r.keys, k)
		r.count.Add(-int64(l.n))
		waitersGauge.Sub(float64(l.n))
	}
	if keys == nil {
		prefix := ns + "\x00"
		for k, l := range r.keys {
			if strings.HasPrefix(k, prefix) {
				wake(k, l)
			}
		}
		return
	}
	for _, key := range keys {
		k := waitKey(ns, key)
		if l := r.keys[k]; l != nil {
			wake(k, l)
		}
	}
}

// waiting returns the number of subscribed waiters.
func (r *waitRegistry) waiting() int { return int(r.count.Load()) }

// end wakes every waiter for good; later reserves do not wait.
func (r *waitRegistry) end() {
	r.once.Do(func() { close(r.stop) })
}

// reserveOnce submits one decision for a. lease is the lease end (unix ms)
// of the reservation that holds the key when the answer is in_progress,
// else 0.
func (n *Namespace) reserveOnce(ctx context.Context, a *reserveArgs) (res *ReserveResult, lease uint64, err error) {
	// out is read only after a successful submit: when ctx ends first,
	// the writer may still run fn and write it.
	var out *ReserveResult
	err = n.submit(ctx, a.key, func(ctx context.Context, t *batchTx) error {
		var err error
		out, err = decideReserve(ctx, t, t.Now(), n.keyTTL, a)
		return err
	})
	var ip *inProgressError
	switch {
	case errors.As(err, &ip):
		return nil, ip.leaseExpiresAt, ip.err
	case err != nil:
		return nil, 0, err
	case out.Status == StatusApprovalRequired:
		return out, out.Ask.ExpiresAt, nil // wait for the answer (SPEC §13)
	}
	return out, 0, nil
}

// reserveWaiting decides a, and while the key is reserved by another
// reservation waits (up to a.waitMS) for that reservation to end and
// decides again. It subscribes before each decision, so a commit that
// lands between the decision and the wait still wakes it.
func (n *Namespace) reserveWaiting(ctx context.Context, a *reserveArgs) (*ReserveResult, error) {
	deadline := time.Now().Add(MsDuration(a.waitMS))
	for {
		wk := waitKey(n.name, a.key)
		ch, subscribed := n.l.waits.subscribe(wk)
		res, lease, err := n.reserveOnce(ctx, a)
		if lease == 0 {
			if subscribed {
				n.l.waits.unsubscribe(wk, ch)
			}
			return res, err
		}
		remaining := time.Until(deadline)
		if !subscribed || remaining <= 0 {
			if subscribed {
				n.l.waits.unsubscribe(wk, ch)
				waitEnds.WithLabelValues(waitTimeout).Inc()
			} else {
				waitEnds.WithLabelValues(waitLimit).Inc()
			}
			return res, err
		}
		sleep, end := remaining, waitTimeout
		now := uint64(n.l.cfg.Now().UnixMilli())
		if lease <= now {
			sleep, end = 0, waitLeaseEnd
		} else if d := MsDuration(lease - now); d < sleep {
			sleep, end = d, waitLeaseEnd
		}
		end, err = n.l.park(ctx, ch, sleep, end)
		n.l.waits.unsubscribe(wk, ch)
		waitEnds.WithLabelValues(end).Inc()
		if err != nil {
			return nil, err
		}
		if end == waitShutdown {
			deadline = time.Now() // decide once more, then answer
		}
	}
}

// park waits for ch, sleep, ctx or the registry's end, releasing what the
// request's Parker holds meanwhile. It returns how the wait ended (end
// when the timer fired), and ctx's error when the client went away.
func (l *Ledger) park(ctx context.Context, ch <-chan struct{}, sleep time.Duration, end string) (string, error) {
	p := ParkerFromContext(ctx)
	if p != nil {
		p.Park()
	}
	timer := time.NewTimer(sleep)
	defer timer.Stop()
	select {
	case <-ch:
		end = waitFinalized
	case <-timer.C:
	case <-l.waits.stop:
		end = waitShutdown
	case <-ctx.Done():
		return waitCancelled, ctx.Err()
	}
	if p != nil {
		if err := p.Resume(ctx); err != nil {
			return waitCancelled, err
		}
	}
	return end, nil
}

// inProgressError is the in_progress *Error of decideReserve with the
// lease end of the reservation that holds the key.
type inProgressError struct {
	err            *Error
	leaseExpiresAt uint64
}

func (e *inProgressError) Error() string { return e.err.Error() }

func (e *inProgressError) Unwrap() error { return e.err }
