package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// Config configures the domain service.
type Config struct {
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// MaxBatch bounds how many queued writes of one namespace share one
	// transaction (default 256).
	MaxBatch int
	// MaxWaiters bounds the reserves parked waiting for another
	// reservation of their key (wait_ms) at once; beyond it a reserve is
	// answered without waiting (default DefaultMaxWaiters).
	MaxWaiters int
	// Now is the clock of waits (lease ends); decisions use Tx.Now.
	Now func() time.Time
	// Linger, when positive, lets a namespace's writer under load wait up
	// to this long for as many requests as the previous batch held before
	// it starts the next batch. Worth it where a transaction has a high
	// fixed cost (PostgreSQL: round trips and a COMMIT per batch); an idle
	// ledger never waits. 0 (the default) starts every batch at once.
	Linger time.Duration
	// MaxNamespaces bounds how many namespaces CreateNamespace lets exist,
	// default included (0: no bound). Replicas of one database each
	// enforce it, so two creations at once on two replicas may pass it by
	// one.
	MaxNamespaces int
	// WriterIdle is how long a namespace's writer goroutine waits for
	// work before it exits; the next write starts it again, so idle
	// namespaces hold no goroutine (default DefaultWriterIdle).
	WriterIdle time.Duration
}

// DefaultWriterIdle is the default of Config.WriterIdle.
const DefaultWriterIdle = 5 * time.Second

// Ledger is the domain service: validation, the SPEC §4 state machine,
// chain linking and Merkle hashing, one batching queue per namespace and
// the waits of SPEC §8, over a Store.
type Ledger struct {
	store  Store
	cfg    Config
	logger *slog.Logger
	waits  *waitRegistry

	mu     sync.Mutex // guards spaces and closed
	spaces map[string]*Namespace
	closed bool

	createMu sync.Mutex // one namespace creation at a time (MaxNamespaces)

	lastWriteErr atomic.Pointer[error] // nil after a successful batch
}

// New starts the domain service over store. Close closes both.
func New(store Store, cfg Config) *Ledger {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 256
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.WriterIdle <= 0 {
		cfg.WriterIdle = DefaultWriterIdle
	}
	l := &Ledger{store: store, cfg: cfg, logger: cfg.Logger, waits: newWaitRegistry(cfg.MaxWaiters),
		spaces: map[string]*Namespace{}}
	store.OnEnded(l.waits.notify)
	writerReady.Set(1)
	return l
}

// Store returns the storage driver.
func (l *Ledger) Store() Store { return l.store }

var namespaceName = regexp.MustCompile(`^[a-z0-9._-]{1,64}$`)

// ValidNamespace reports whether name is a namespace name (SPEC §7:
// 1–64 bytes of a-z 0-9 . _ -).
func ValidNamespace(name string) bool { return namespaceName.MatchString(name) }

// CheckNamespace returns a 400 invalid_request *Error for a name outside
// the namespace alphabet.
func CheckNamespace(name string) error {
	if !ValidNamespace(name) {
		return &Error{Code: ECodeInvalidRequest,
			Message: "namespace names are 1–64 bytes of a-z 0-9 . _ -",
			Details: map[string]any{"field": "namespace"}}
	}
	return nil
}

// NS returns the namespace name: a 400 *Error for an invalid name,
// 404 unknown_namespace for one that was never created.
func (l *Ledger) NS(ctx context.Context, name string) (*Namespace, error) {
	if err := CheckNamespace(name); err != nil {
		return nil, err
	}
	l.mu.Lock()
	n := l.spaces[name]
	closed := l.closed
	l.mu.Unlock()
	if n != nil {
		return n, nil
	}
	if closed {
		return nil, ErrClosed
	}
	c, err := l.store.Chain(ctx, name)
	if errors.Is(err, ErrUnknownNamespace) {
		return nil, &Error{Code: ECodeUnknownNamespace, Message: fmt.Sprintf("no namespace %q", name),
			Details: map[string]any{"namespace": name}}
	}
	if err != nil {
		return nil, err
	}
	ttl, err := c.KeyTTL(ctx) // fixed at creation: read once
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.spaces[name]; n != nil {
		return n, nil
	}
	if l.closed {
		return nil, ErrClosed
	}
	n = &Namespace{Log: Log{c}, l: l, name: name, chain: c, keyTTL: ttl, ops: make(chan *writeOp, l.cfg.MaxBatch), done: make(chan struct{})}
	l.spaces[name] = n
	return n, nil
}

// Default returns the default namespace.
func (l *Ledger) Default(ctx context.Context) (*Namespace, error) {
	return l.NS(ctx, DefaultNamespace)
}

// MaxKeyTTL bounds key_ttl_ms: integers up to it are exact in every
// JSON client.
const MaxKeyTTL = 1<<53 - 1

// CreateNamespace creates an empty namespace whose keys expire keyTTL ms
// after their outcome (0: never; SPEC §12): 400 for an invalid name or
// TTL, 409 namespace_exists for one that exists.
func (l *Ledger) CreateNamespace(ctx context.Context, name string, keyTTL uint64) error {
	if err := CheckNamespace(name); err != nil {
		return err
	}
	if keyTTL > MaxKeyTTL {
		return Invalid("key_ttl_ms", "key_ttl_ms must be an integer from 0 to %d", uint64(MaxKeyTTL))
	}
	if max := l.cfg.MaxNamespaces; max > 0 {
		l.createMu.Lock()
		defer l.createMu.Unlock()
		names, err := l.store.Namespaces(ctx)
		if err != nil {
			return err
		}
		if len(names) >= max && !slices.Contains(names, name) {
			return &Error{Code: ECodeNamespaceLimit,
				Message: fmt.Sprintf("this server holds at most %d namespaces (ledgerd --max-namespaces)", max),
				Details: map[string]any{"namespace": name, "max_namespaces": max}}
		}
	}
	err := l.store.CreateNamespace(ctx, name, keyTTL)
	switch {
	case errors.Is(err, ErrNamespaceExists):
		return &Error{Code: ECodeNamespaceExists, Message: fmt.Sprintf("namespace %q exists", name),
			Details: map[string]any{"namespace": name}}
	case errors.Is(err, ErrNamespaceLost):
		// Storage of that name holds history the ledger does not know.
		l.logger.Warn("namespace not created", "namespace", name, "err", err)
		return &Error{Code: ECodeNamespaceExists,
			Message: fmt.Sprintf("storage for namespace %q already holds receipts the ledger does not know; an operator must move it away", name),
			Details: map[string]any{"namespace": name}}
	}
	if err == nil {
		l.logger.Info("namespace created", "namespace", name, "key_ttl_ms", keyTTL)
	}
	return err
}

// NamespaceInfo is one namespace, its head and its key_ttl_ms.
type NamespaceInfo struct {
	Name   string
	Head   Head
	KeyTTL uint64 // ms; 0: keys never expire
}

// Namespaces lists every namespace with its head, by name.
func (l *Ledger) Namespaces(ctx context.Context) ([]NamespaceInfo, error) {
	names, err := l.store.Namespaces(ctx)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	out := make([]NamespaceInfo, 0, len(names))
	for _, name := range names {
		c, err := l.store.Chain(ctx, name)
		if errors.Is(err, ErrUnknownNamespace) {
			continue
		}
		if err != nil {
			return nil, err
		}
		h, err := c.Head(ctx)
		if err != nil {
			return nil, err
		}
		ttl, err := c.KeyTTL(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, NamespaceInfo{Name: name, Head: h, KeyTTL: ttl})
	}
	return out, nil
}

// Ready reports whether the database accepts writes. While writes work it
// runs an empty transaction of the default namespace through its queue
// (cheap). Once a write transaction has failed it answers not ready at
// once, and makes a real durable probe write on each check; the first
// that succeeds makes the next check ready, so readiness comes back by
// itself when the database recovers (a successful batch clears the
// failure too).
func (l *Ledger) Ready(ctx context.Context) error {
	n, err := l.Default(ctx)
	if err != nil {
		return err
	}
	failed := l.lastWriteErr.Load()
	err = n.submit(ctx, "", func(ctx context.Context, t *batchTx) error {
		if failed == nil {
			return nil
		}
		return t.Probe(ctx)
	})
	if err != nil {
		return err
	}
	if failed != nil {
		return fmt.Errorf("the last write transaction failed (a probe write now succeeded): %w", *failed)
	}
	return nil
}

// Waiting returns how many reserve requests are parked waiting for
// another reservation of their key to end.
func (l *Ledger) Waiting() int { return l.waits.waiting() }

// EndWaits wakes every parked reserve: each decides at once (usually
// 409 in_progress) instead of waiting out its wait_ms, and later reserves
// do not wait. A server calls it when it begins to shut down, so that
// parked requests do not hold the shutdown up; Close calls it too.
func (l *Ledger) EndWaits() { l.waits.end() }

// Close stops accepting writes, lets every queue finish what it holds and
// closes the store.
func (l *Ledger) Close() error {
	l.EndWaits()
	l.mu.Lock()
	spaces := l.spaces
	if !l.closed {
		l.closed = true
		for _, n := range spaces {
			n.close()
		}
	}
	l.mu.Unlock()
	for _, n := range spaces {
		<-n.done
	}
	return l.store.Close()
}

// Namespace is one namespace of a Ledger: its write queue and reads.
type Namespace struct {
	Log // reads and proofs, without the head lock

	l      *Ledger
	name   string
	chain  Chain
	keyTTL uint64 // key_ttl_ms, fixed at creation

	mu     sync.RWMutex // guards closed and sends on ops
	closed bool
	ops    chan *writeOp
	done   chan struct{} // closed when the writer has exited for good

	// running is true while a writer goroutine runs (or is starting): it
	// exits after Config.WriterIdle without work and the next submit
	// starts another, so an idle namespace holds no goroutine.
	running    atomic.Bool
	closedFlag atomic.Bool // closed, readable without mu
}

// Name is the namespace's name.
func (n *Namespace) Name() string { return n.name }

// Reader reads the namespace without its head lock.
func (n *Namespace) Reader() ChainReader { return n.chain }

func (n *Namespace) close() {
	n.mu.Lock()
	if !n.closed {
		n.closed = true
		n.closedFlag.Store(true)
		close(n.ops)
	}
	n.mu.Unlock()
	n.wake() // a writer drains the queue and closes done
}

// wake starts the writer if none runs. See writer for why no queued op
// is ever left without one.
func (n *Namespace) wake() {
	if !n.running.Load() && n.running.CompareAndSwap(false, true) {
		go n.writer()
	}
}

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
		last = len(batch)
		n.runBatch(batch)
		clear(batch)
	}
}

// runBatch runs ops in one Update and replies to each after COMMIT. A
// domain error of one op touches nothing (decisions are made before any
// write); any other failure rolls back the whole batch and fails every op
// in it. The driver may run the batch more than once (retries): each run
// decides every op afresh.
func (n *Namespace) runBatch(ops []*writeOp) {
	ctx := context.Background() // request contexts must not interrupt a shared transaction
	start := time.Now()
	var last *batchTx
	err := n.chain.Update(ctx, func(ctx context.Context, tx Tx) error {
		t := &batchTx{Tx: tx}
		last = t
		if p, ok := tx.(Preloader); ok && len(ops) > 1 {
			keys := make([]string, 0, len(ops))
			for _, op := range ops {
				if op.key != "" {
					keys = append(keys, op.key)
				}
			}
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
	})
	if err != nil {
		n.l.lastWriteErr.Store(&err)
		writerReady.Set(0)
		batchFailures.Inc()
		n.l.logger.Error("write batch failed", "namespace", n.name, "ops", len(ops), "err", err)
		observeBatch(ops, BatchInfo{Namespace: n.name, Size: len(ops), Start: start, End: time.Now(), Err: err})
		for _, op := range ops {
			var de *Error
			if !errors.As(op.err, &de) {
				op.err = err
			}
			op.done <- op.err
		}
		return
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
		for _, kind := range last.kinds {
			receiptsAppended.WithLabelValues(kind, n.name).Inc()
		}
		headSeq.WithLabelValues(n.name).Set(float64(last.Head().Seq))
	}
}

// batchTx is the domain's view of one run of a batch: the driver's Tx,
// plus the linking and Merkle hashing of appends (the driver never
// hashes). It implements writeStore for the state machine.
type batchTx struct {
	Tx
	kinds []string
}

var _ writeStore = (*batchTx)(nil)

func (t *batchTx) key(ctx context.Context, key string) (KeyRecord, bool, error) {
	return t.Key(ctx, key)
}

func (t *batchTx) receipt(ctx context.Context, seq uint64) (chain.Receipt, error) {
	return t.Receipt(ctx, seq)
}

func (t *batchTx) maxAttempt(ctx context.Context, key, execution string, since uint64) (uint64, bool, error) {
	return t.MaxAttempt(ctx, key, execution, since)
}

func (t *batchTx) lastSeq(ctx context.Context, key string) (uint64, error) {
	return t.LastSeq(ctx, key)
}

func (t *batchTx) putKey(ctx context.Context, k *KeyRecord) error { return t.PutKey(ctx, k) }

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

// WriterRunning reports whether the namespace's writer goroutine runs now
// (it exits after Config.WriterIdle without work).
func (n *Namespace) WriterRunning() bool { return n.running.Load() }
