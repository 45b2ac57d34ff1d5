package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/internal/metrics"
	"github.com/effect-ledger/effect-ledger/ledger/sched"
	"github.com/effect-ledger/effect-ledger/tlog"
	"github.com/prometheus/client_golang/prometheus"
)

// The write path: a request's write is an Op queued in the ledger's
// scheduler (package sched), which forms groups across namespaces and
// returns a future; the group goes to the driver's one write port,
// Store.Write, as a Batch per namespace. The driver runs each batch's ops
// in one transaction with the group's other batches and returns after a
// durable COMMIT; then the futures complete and each request gets its
// answer.

// Batch is one namespace's share of a Store.Write: its operations, in the
// order they were queued.
type Batch struct {
	NS string
	// Keys are the keys the operations decide about: a driver may read
	// their records ahead with the head.
	Keys []string
	Ops  []Op
}

// Op is one write operation of a batch: Decide reads and writes tx (the
// batch's transaction, with the writes of the operations before it), and
// may run more than once (a driver's retry); each run starts afresh.
type Op interface {
	Decide(ctx context.Context, tx Tx) error
}

// OpFunc is a function as an Op.
type OpFunc func(ctx context.Context, tx Tx) error

// Decide calls f.
func (f OpFunc) Decide(ctx context.Context, tx Tx) error { return f(ctx, tx) }

// Run runs the batch's operations in order in tx, as a driver's Write does
// for each batch (again in each run). A domain refusal (*Error) is its
// operation's answer and writes nothing; any other failure ends the run
// and is returned.
func (b Batch) Run(ctx context.Context, tx Tx) error {
	for _, op := range b.Ops {
		var de *Error
		if err := op.Decide(ctx, tx); err != nil && !errors.As(err, &de) {
			return err
		}
	}
	return nil
}

// PartError is a failure of a Store.Write that rolled it back and that
// may not be every batch's: Part (an index into its batches) caused it, or
// -1 when the driver cannot tell which did.
type PartError struct {
	Part int
	Err  error
}

func (e *PartError) Error() string { return e.Err.Error() }
func (e *PartError) Unwrap() error { return e.Err }

// writeOp is one queued write of the domain: fn decides, in a batch's
// transaction, about key ("" for none). Its answer (nil or a domain
// *Error) is read only once the batch's future completes.
type writeOp struct {
	n   *Namespace
	key string
	ctx context.Context
	fn  func(ctx context.Context, t *batchTx) error
	err error
	run *batchTx // the op's last run: its appends, events and parsed policies
	// observe is the request's BatchObserver, nil without one (tracing off).
	observe BatchObserver
}

// Decide runs the op, unless its request has ended meanwhile.
func (o *writeOp) Decide(ctx context.Context, tx Tx) error {
	if err := o.ctx.Err(); err != nil {
		o.err, o.run = err, nil
		return nil
	}
	at, err := tx.Locked(ctx)
	if err != nil {
		return err
	}
	t := &batchTx{Tx: tx, n: o.n, at: at}
	if err := t.prunedPolicy(ctx); err != nil {
		return err
	}
	o.err = o.fn(ctx, t)
	o.run = t
	return o.err
}

// submit queues fn, which decides about key ("" for none), and waits for
// its durable outcome.
func (n *Namespace) submit(ctx context.Context, key string, fn func(ctx context.Context, t *batchTx) error) error {
	op := &writeOp{n: n, key: key, ctx: ctx, fn: fn, observe: batchObserverFromContext(ctx)}
	f, err := n.l.queue.Add(ctx, n.name, op)
	if errors.Is(err, sched.ErrClosed) {
		return ErrClosed
	}
	if err != nil {
		return err
	}
	if err := f.Wait(ctx); err != nil {
		if !f.Done() {
			return err // the request ended first: its op's answer is still being written
		}
		var de *Error
		if errors.As(op.err, &de) {
			return op.err // a refusal writes nothing, whatever became of its batch
		}
		return err
	}
	return op.err
}

// flush writes a group formed by the scheduler: one Store.Write for all
// its batches. When one batch failed (an internal failure of its
// namespace: domain refusals never fail a batch) the write rolled back:
// that batch gets its error and the others are written again, each alone,
// so that one namespace's failure is not another's; when the driver cannot
// tell which batch the database refused, every batch is written again
// alone. A failure of the database itself fails every batch.
func (l *Ledger) flush(group []sched.Batch[*writeOp]) []error {
	ctx := context.Background() // no request may interrupt a shared transaction
	start := time.Now()
	groupParts.Observe(float64(len(group)))
	batches := make([]Batch, len(group))
	for i, g := range group {
		b := Batch{NS: g.NS, Ops: make([]Op, len(g.Items))}
		for j, op := range g.Items {
			b.Ops[j] = op
			if op.key != "" {
				b.Keys = append(b.Keys, op.key)
			}
		}
		batches[i] = b
	}
	errs := make([]error, len(group))
	err := l.store.Write(ctx, batches)
	var pe *PartError
	if len(group) > 1 && errors.As(err, &pe) && pe.Part < len(group) {
		for i := range batches {
			if i == pe.Part {
				errs[i] = pe.Err
			} else {
				errs[i] = unwrapPart(l.store.Write(ctx, batches[i:i+1]))
			}
		}
	} else {
		for i := range errs {
			errs[i] = unwrapPart(err)
		}
	}
	for i, g := range group {
		l.settle(g.NS, g.Items, errs[i], start)
	}
	return errs
}

// unwrapPart returns the error of a Write of one batch as that batch's.
func unwrapPart(err error) error {
	var pe *PartError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// settle records a batch's end: readiness, metrics, the requests'
// observers, and a log line for a failure.
func (l *Ledger) settle(ns string, ops []*writeOp, err error, start time.Time) {
	end := time.Now()
	observeBatch(ops, BatchInfo{Namespace: ns, Size: len(ops), Start: start, End: end, Err: err})
	if err != nil {
		l.lastWriteErr.Store(&err)
		l.Fault(err)
		writerReady.Set(0)
		batchFailures.Inc()
		if quiet, ok := ops[0].n.failLog.allow(err); ok {
			l.logger.Error("write batch failed", "namespace", ns, "ops", len(ops), "err", err, "failures_not_logged", quiet)
		}
		return
	}
	l.lastWriteErr.Store(nil)
	writerReady.Set(1)
	busy := end.Sub(start)
	batchSize.Observe(float64(len(ops)))
	batchSeconds.Observe(busy.Seconds())
	writerBusy.Add(busy.Seconds())
	writerOps.Add(float64(len(ops)))
	var kinds []string
	var head uint64
	for _, op := range ops {
		if op.run == nil {
			continue // its request ended before it was decided
		}
		kinds = append(kinds, op.run.kinds...)
		head = max(head, op.run.at.Head.Seq)
		for _, e := range op.run.events {
			approvalEvents.WithLabelValues(e).Inc()
		}
		for seq, p := range op.run.policies {
			op.n.policyCommitted(seq, p)
		}
	}
	countKinds(ns, kinds)
	if head > 0 {
		headSeq.WithLabelValues(ns).Set(float64(head))
	}
}

var groupParts = metrics.Histogram("ledger_writer_group_namespaces",
	"Namespaces whose batches shared one transaction (group commit across namespaces; 1: a batch alone).",
	prometheus.ExponentialBuckets(1, 2, 8))

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

// batchTx is the domain's view of one run of an operation: the driver's
// Tx, plus the linking and Merkle hashing of appends (the driver never
// hashes): what the state machine reads and writes in one run. What a
// run learns for the namespace (the policies it parsed, the gate's
// events to count) is kept here and taken in only once the batch has
// committed: a run may be rolled back or run again.
type batchTx struct {
	Tx
	at       Locked     // the head, time and policy, this op's appends included
	n        *Namespace // the namespace (policy cache, configuration)
	kinds    []string
	events   []string           // approval events (approvals.go), counted after COMMIT
	policies map[uint64]*Policy // policies parsed by seq, cached after COMMIT
}

// Head is the chain's head, the batch's appends included.
func (t *batchTx) Head() Head { return t.at.Head }

// Now is the run's time, unix ms (Locked.Now).
func (t *batchTx) Now() uint64 { return t.at.Now }

// PolicySeq is the seq of the latest policy receipt, the batch's appends
// included.
func (t *batchTx) PolicySeq(context.Context) (uint64, error) { return t.at.PolicySeq, nil }

// event records an approval event of the run.
func (t *batchTx) event(name string) { t.events = append(t.events, name) }

// append links r to the head, computes its Merkle leaf's stored hashes
// and hands both to the driver. In a committed namespace (or part: after
// a switch) the payload fields are committed first (SPEC §14): the receipt returned carries its
// values in Open, for the answer.
func (t *batchTx) append(ctx context.Context, r chain.Receipt) (chain.Receipt, error) {
	h := t.Head()
	r.Open = nil
	committed, err := t.committed(ctx)
	if err != nil {
		return r, err
	}
	if committed {
		if o := chain.CommitFields(&r); !o.Empty() {
			r.Open = &o
		}
	}
	r = chain.Link(h.Seq, h.Hash, r)
	hs, err := LeafHashes(ctx, r.Seq, r.Hash, t.ReadHashes)
	if err != nil {
		return r, err
	}
	if err := t.Append(ctx, &r, hs); err != nil {
		return r, err
	}
	t.at.Head = Head{Seq: r.Seq, Hash: r.Hash}
	if r.Kind == chain.KindPolicy {
		t.at.PolicySeq = r.Seq
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
