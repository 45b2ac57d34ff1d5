package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// writeOp is one queued write: fn runs inside a batch transaction and its
// error (nil, a domain *Error, or an internal failure) is sent on done
// only after the transaction has committed or rolled back.
type writeOp struct {
	key  string // the idempotency key the op decides about, "" for none
	ctx  context.Context
	fn   func(ctx context.Context, t *batchTx) error
	done chan error
	err  error
	// observe is the request's BatchObserver, nil without one (tracing off).
	observe BatchObserver
}

// submit queues fn, which decides about key ("" for none), for the
// namespace's writer and waits for the durable outcome.
func (n *Namespace) submit(ctx context.Context, key string, fn func(ctx context.Context, t *batchTx) error) error {
	op := &writeOp{key: key, ctx: ctx, fn: fn, done: make(chan error, 1), observe: batchObserverFromContext(ctx)}
	n.mu.RLock()
	if n.closed {
		n.mu.RUnlock()
		return ErrClosed
	}
	select {
	case n.ops <- op:
	case <-ctx.Done():
		n.mu.RUnlock()
		return ctx.Err()
	}
	n.mu.RUnlock()
	if g := n.l.group; g != nil {
		// Counted once in the queue, not while waiting for room in it: a
		// request blocked on a full queue joins no group before the next
		// one starts, and the group must not wait for it. (The writer
		// may take the op first: queued dips below the truth for a moment.)
		g.queued.Add(1)
		g.signal()
	}
	n.wake()
	select {
	case err := <-op.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writer drains the namespace's queue in batches: each batch is one
// Chain.Update in which the ops run in order, so each decision sees the
// effects of the ones before it. It never waits for a batch to fill: a
// lone request is written at once.
//
// It exits after Config.WriterIdle without work. An op queued then is
// never stranded: submit queues before it reads running, and the writer
// clears running before it looks at the queue (and at closedFlag) one
// last time, so either submit sees running false and starts a writer, or
// the exiting writer sees the op and carries on.
func (n *Namespace) writer() {
	max := n.l.cfg.MaxBatch
	linger := n.l.cfg.Linger
	if n.l.group != nil {
		linger = 0 // the group lingers for every namespace's (group.go)
	}
	batch := make([]*writeOp, 0, max)
	var timer *time.Timer
	idle := time.NewTimer(n.l.cfg.WriterIdle)
	defer idle.Stop()
	last := 0 // size of the previous batch
	for {
		var op *writeOp
		var ok bool
		select {
		case op, ok = <-n.ops:
			n.took(ok)
		case <-idle.C:
			n.running.Store(false)
			if (len(n.ops) > 0 || n.closedFlag.Load()) && n.running.CompareAndSwap(false, true) {
				idle.Reset(n.l.cfg.WriterIdle)
				continue
			}
			return
		}
		if !ok {
			close(n.done)
			return
		}
		idle.Reset(n.l.cfg.WriterIdle)
		batch = append(batch[:0], op)
		// Under load (the previous batch held more than one op), wait up
		// to linger for the requests answered by that batch to come back,
		// so that a batch is not spent on the first of them; a lone request
		// on an idle ledger never waits.
		var deadline <-chan time.Time
		if linger > 0 && last > 1 {
			if timer == nil {
				timer = time.NewTimer(linger)
			} else {
				timer.Reset(linger)
			}
			deadline = timer.C
		}
	fill:
		for len(batch) < max {
			select {
			case op, ok := <-n.ops:
				n.took(ok)
				if !ok {
					break fill
				}
				batch = append(batch, op)
				continue
			default:
			}
			if deadline == nil || len(batch) >= last {
				break fill
			}
			select {
			case op, ok := <-n.ops:
				n.took(ok)
				if !ok {
					break fill
				}
				batch = append(batch, op)
			case <-deadline:
				deadline = nil
				break fill
			}
		}
		if deadline != nil {
			timer.Stop() // no stale tick after Stop (Go ≥ 1.23 timers)
		}
		batch = n.runBatch(batch)
		last = len(batch)
		clear(batch)
	}
}

// took counts an op taken from the queue (ok) out of the group's queued.
func (n *Namespace) took(ok bool) {
	if ok && n.l.group != nil {
		n.l.group.queued.Add(-1)
	}
}

// runBatch runs ops in one Update (or, on a store that can, in a group
// with other namespaces' batches: group.go) and replies to each after
// COMMIT; it returns ops with those the group added (more). A
// domain error of one op touches nothing (decisions are made before any
// write); any other failure rolls back the whole batch and fails every op
// in it. The driver may run the batch more than once (retries): each run
// decides every op afresh.
func (n *Namespace) runBatch(ops []*writeOp) []*writeOp {
	ctx := context.Background() // request contexts must not interrupt a shared transaction
	start := time.Now()
	var last *batchTx
	keys := make([]string, 0, len(ops))
	for _, op := range ops {
		if op.key != "" {
			keys = append(keys, op.key)
		}
	}
	// more runs in the group's goroutine while this batch waits for its
	// group (the writer is blocked in update meanwhile): the ops queued
	// since join the batch, after the ones it holds, in queue order. It
	// returns the keys of the whole batch.
	more := func() []string {
		for len(ops) < n.l.cfg.MaxBatch {
			select {
			case op, ok := <-n.ops:
				n.took(ok)
				if !ok {
					return keys
				}
				ops = append(ops, op)
				if op.key != "" {
					keys = append(keys, op.key)
				}
			default:
				return keys
			}
		}
		return keys
	}
	err := n.l.update(ctx, n.chain, keys, func(ctx context.Context, tx Tx) error {
		t := &batchTx{Tx: tx, n: n}
		last = t
		if p, ok := tx.(Preloader); ok && len(ops) > 1 {
			if err := p.Preload(ctx, keys); err != nil {
				return err
			}
		}
		for _, op := range ops {
			if err := op.ctx.Err(); err != nil {
				op.err = err
				continue
			}
			op.err = op.fn(ctx, t)
			var de *Error
			if op.err != nil && !errors.As(op.err, &de) {
				return op.err
			}
		}
		return nil
	}, queueJoiner{take: more, n: n})
	if err != nil {
		n.l.lastWriteErr.Store(&err)
		n.l.Fault(err)
		writerReady.Set(0)
		batchFailures.Inc()
		if quiet, ok := n.failLog.allow(err); ok {
			n.l.logger.Error("write batch failed", "namespace", n.name, "ops", len(ops), "err", err, "failures_not_logged", quiet)
		}
		observeBatch(ops, BatchInfo{Namespace: n.name, Size: len(ops), Start: start, End: time.Now(), Err: err})
		for _, op := range ops {
			var de *Error
			if !errors.As(op.err, &de) {
				op.err = err
			}
			op.done <- op.err
		}
		return ops
	}
	n.l.lastWriteErr.Store(nil)
	writerReady.Set(1)
	observeBatch(ops, BatchInfo{Namespace: n.name, Size: len(ops), Start: start, End: time.Now()})
	for _, op := range ops {
		op.done <- op.err
	}
	busy := time.Since(start)
	batchSize.Observe(float64(len(ops)))
	batchSeconds.Observe(busy.Seconds())
	writerBusy.Add(busy.Seconds())
	writerOps.Add(float64(len(ops)))
	if last != nil {
		countKinds(n.name, last.kinds)
		headSeq.WithLabelValues(n.name).Set(float64(last.Head().Seq))
	}
	return ops
}

// countKinds adds a batch's appended receipts, of kinds, to
// ledger_receipts_appended_total: one look-up of the labels per kind, not
// per receipt.
func countKinds(ns string, kinds []string) {
	type count struct {
		kind string
		n    int
	}
	var counts [8]count // a batch's distinct kinds: chain.Kind*
	seen := counts[:0]
next:
	for _, k := range kinds {
		for i := range seen {
			if seen[i].kind == k {
				seen[i].n++
				continue next
			}
		}
		seen = append(seen, count{k, 1})
	}
	for _, c := range seen {
		receiptsAppended.WithLabelValues(c.kind, ns).Add(float64(c.n))
	}
}

// batchTx is the domain's view of one run of a batch: the driver's Tx,
// plus the linking and Merkle hashing of appends (the driver never
// hashes): what the state machine reads and writes in one run.
type batchTx struct {
	Tx
	n     *Namespace // the namespace (policy cache, configuration)
	kinds []string
}

// append links r to the head, computes its Merkle leaf's stored hashes
// and hands both to the driver.
func (t *batchTx) append(ctx context.Context, r chain.Receipt) (chain.Receipt, error) {
	h := t.Head()
	r = chain.Link(h.Seq, h.Hash, r)
	hs, err := LeafHashes(ctx, r.Seq, r.Hash, t.ReadHashes)
	if err != nil {
		return r, err
	}
	if err := t.Append(ctx, &r, hs); err != nil {
		return r, err
	}
	t.kinds = append(t.kinds, r.Kind)
	return r, nil
}

// LeafHashes computes the stored Merkle hashes that adding the receipt
// seq with chain hash h to a tree of seq-1 leaves creates, reading earlier
// hashes with read (golang.org/x/mod/sumdb/tlog's layout).
func LeafHashes(ctx context.Context, seq uint64, h chain.Hash,
	read func(ctx context.Context, idx []int64) ([]tlog.Hash, error)) ([]tlog.Hash, error) {
	n := tlog.LeafIndex(seq)
	hs, err := sumdb.StoredHashesForRecordHash(n, tlog.LeafHash(h), sumdb.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		return read(ctx, idx)
	}))
	if err != nil {
		return nil, fmt.Errorf("tree leaf %d: %w", n, err)
	}
	return hs, nil
}

// failLogEvery is how often a batch failure that answers unavailable (a
// full disk, a locked file, an unusable key index) is logged while it
// repeats: each request would otherwise log a line.
const failLogEvery = 5 * time.Second

// failLog spaces the log lines of unavailable batch failures.
type failLog struct {
	mu    sync.Mutex
	last  time.Time
	quiet int // failures not logged since last
}

// allow reports whether the failure err is logged, with how many were
// not logged before it; other failures are always logged.
func (f *failLog) allow(err error) (quiet int, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if errors.Is(err, ErrUnavailable) && time.Since(f.last) < failLogEvery {
		f.quiet++
		return 0, false
	}
	quiet, f.quiet = f.quiet, 0
	if errors.Is(err, ErrUnavailable) {
		f.last = time.Now()
	}
	return quiet, true
}

// queueJoiner is a namespace's queue as a batch waiting for its group
// sees it (joiner).
type queueJoiner struct {
	n    *Namespace
	take func() []string
}

func (q queueJoiner) more() []string { return q.take() }
func (q queueJoiner) backlog() int   { return len(q.n.ops) }
