package ledger

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger/sched"
)

// Config configures the domain service.
type Config struct {
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// MaxBatch bounds how many queued writes of one namespace share one
	// transaction, and how many wait for one (default 256).
	MaxBatch int
	// MaxWaiters bounds the reserves parked waiting for another
	// reservation of their key (wait_ms) at once; beyond it a reserve is
	// answered without waiting (default DefaultMaxWaiters).
	MaxWaiters int
	// Now is the clock of waits (lease ends); decisions use Locked.Now.
	Now func() time.Time
	// Linger, when positive, lets a write group under load wait up to
	// this long for as many requests as the previous group held before it
	// starts (package sched). Worth it where a transaction has a high fixed
	// cost (PostgreSQL: round trips and a COMMIT per group); an idle ledger
	// never waits. 0 (the default) starts every group at once.
	Linger time.Duration
	// MaxNamespaces bounds how many namespaces CreateNamespace lets exist,
	// default included (0: no bound). Replicas of one database each
	// enforce it, so two creations at once on two replicas may pass it by
	// one.
	MaxNamespaces int
	// ApprovalInputRetention is how long an ask's input is kept after its
	// answer or expiry (SPEC §13; default DefaultApprovalInputRetention).
	ApprovalInputRetention time.Duration
	// CanPurge: the store can tell when an erasure's values are gone from
	// its files (SQLite), so erasures answer purged true or false; false
	// answers null (PostgreSQL, SPEC §14).
	CanPurge bool
	// MaxSweep bounds the receipts one erase of a retention sweep, or of
	// EraseAll, lists: each transaction stays short, and the next goes on
	// (default DefaultMaxSweep).
	MaxSweep int
	// LogKeyPrefix is the name of the log's signing keys, its origin
	// prefix (SPEC §9): a key receipt's new key must bear it. Empty
	// accepts any name.
	LogKeyPrefix string
	// LogKeyBase is the id of the key this ledger signed with before any
	// rotation (ledgerd's --handover-key, else its --signing-key): the key
	// a first rotation retires. Empty without a signing key.
	LogKeyBase string
	// ArchiveDir is where prunes write their segments (SPEC §16; ledgerd
	// --archive-dir); empty: this ledger does not prune.
	ArchiveDir string
	// PruneStep, a test seam (nil in the shipped binaries), is called at
	// each step of a prune: "segment-written", "receipt-committed", and
	// "batch" after each deletion batch commits.
	PruneStep func(step string)
}

// DefaultApprovalInputRetention is the default of
// Config.ApprovalInputRetention: 7 days.
const DefaultApprovalInputRetention = 7 * 24 * time.Hour

// Ledger is the domain service: validation, the SPEC §4 state machine,
// chain linking and Merkle hashing, the write scheduler and the waits of
// SPEC §8, over a Store.
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
	fault        atomic.Pointer[Error] // set once stored data is found damaged (Fault)

	queue *sched.Queue[*writeOp] // the write groups (batch.go)

	// bg counts the background deletions of pruned bodies (prunedelete.go),
	// which stop when bgCtx ends (Close).
	bg       sync.WaitGroup
	bgCtx    context.Context
	bgCancel context.CancelFunc
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
	if cfg.ApprovalInputRetention <= 0 {
		cfg.ApprovalInputRetention = DefaultApprovalInputRetention
	}
	if cfg.MaxSweep <= 0 {
		cfg.MaxSweep = DefaultMaxSweep
	}
	l := &Ledger{store: store, cfg: cfg, logger: cfg.Logger, waits: newWaitRegistry(cfg.MaxWaiters),
		spaces: map[string]*Namespace{}}
	l.bgCtx, l.bgCancel = context.WithCancel(context.Background())
	l.queue = sched.New(l.flush, sched.Options{MaxOps: cfg.MaxBatch, Linger: cfg.Linger})
	store.OnEnded(l.waits.notify)
	writerReady.Set(1)
	keysWaiting.serve(l)
	approvalsPending.serve(l)
	return l
}

// Store returns the storage driver.
func (l *Ledger) Store() Store { return l.store }

// Ready reports whether the database accepts writes. While writes work it
// runs an empty transaction of the default namespace through its queue
// (cheap). Once a write transaction has failed it answers not ready at
// once, and makes a real durable probe write on each check; the first
// that succeeds makes the next check ready, so readiness comes back by
// itself when the database recovers (a successful batch clears the
// failure too). Damaged stored data (Fault) keeps it not ready.
func (l *Ledger) Ready(ctx context.Context) error {
	if f := l.fault.Load(); f != nil {
		return f
	}
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

// Close stops accepting writes, writes what is queued and closes the
// store.
func (l *Ledger) Close() error {
	keysWaiting.stop(l)
	approvalsPending.stop(l)
	l.EndWaits()
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.bgCancel()
	l.bg.Wait()
	l.queue.Close()
	return l.store.Close()
}
