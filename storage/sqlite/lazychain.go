package sqlite

import (
	"container/list"
	"context"

	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// A writing Store keeps at most Options.MaxOpenNamespaces namespaces open at
// once: a namespace is handed out as an lazyChain, a stable ledger.Chain that
// opens its chain (head, caches, tree, key index sync) when a write or a
// key read needs it, and that the Store closes again when it is the least
// recently used of too many open ones. Its rows are in the ledger file's
// shared tables either way; an open namespace costs its caches, a closed
// one nothing but its registry row. So thousands of namespaces cost memory
// only while they are in use, and a start-up does not open them.
//
// Lock order: Store.mu, then lazyChain.mu, then the ledger file's writer
// lock (chainWriter.mu), then Store.lruMu.

// lazyChain is one namespace behind the open-namespaces bound.
type lazyChain struct {
	s  *Store
	ns string
	id int64   // in the registry and the shared tables
	rd *Reader // the namespace's rows through the ledger file's read pool

	mu    chanMutex    // guards the fields below; waits honour contexts
	fc    *chainWriter // nil while closed
	users int
	elem  *list.Element // in s.lru while open
}

var _ ledger.Chain = (*lazyChain)(nil)

// chanMutex is a mutex whose Lock gives up when a context ends (opening a
// file can take a while; a request must not wait past its deadline).
type chanMutex chan struct{}

func newChanMutex() chanMutex { return make(chanMutex, 1) }

func (m chanMutex) lock(ctx context.Context) error {
	select {
	case m <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m chanMutex) tryLock() bool {
	select {
	case m <- struct{}{}:
		return true
	default:
		return false
	}
}

func (m chanMutex) unlock() { <-m }

// DefaultMaxOpenNamespaces is the most namespaces a writing Store keeps open
// by default.
const DefaultMaxOpenNamespaces = 1024

// maxOpenNamespaces is the default bound on open namespaces. An open namespace
// holds a few KiB (its head, its tree cache of at most 128 hashes; the
// key cache is the ledger file's, shared by every namespace), so the
// memory budget allows 32 per MiB of cacheMiB. At least 64, at most
// DefaultMaxOpenNamespaces.
func maxOpenNamespaces(cacheMiB int) int {
	return max(64, min(DefaultMaxOpenNamespaces, cacheMiB*32))
}

// acquire opens the namespace if it is closed and marks it in use until
// release.
func (f *lazyChain) acquire(ctx context.Context) (*chainWriter, error) {
	if err := f.mu.lock(ctx); err != nil {
		return nil, err
	}
	if f.fc == nil {
		fc, err := f.s.openShared(ctx, f.ns, f.id)
		if err != nil {
			f.mu.unlock()
			return nil, err
		}
		f.fc = fc
	}
	f.users++
	f.s.lruMu.Lock()
	if f.elem == nil {
		f.elem = f.s.lru.PushFront(f)
	} else {
		f.s.lru.MoveToFront(f.elem)
	}
	over := f.s.lru.Len() - f.s.opts.MaxOpenNamespaces
	f.s.lruMu.Unlock()
	fc := f.fc
	f.mu.unlock()
	if over > 0 {
		f.s.evict(over)
	}
	return fc, nil
}

// release ends a use that acquire began.
func (f *lazyChain) release() {
	f.mu <- struct{}{}
	f.users--
	f.mu.unlock()
}

// closeIdle closes the namespace if it is open and nobody uses it. It
// reports whether it closed it.
func (f *lazyChain) closeIdle() bool {
	if !f.mu.tryLock() {
		return false
	}
	defer f.mu.unlock()
	if f.fc == nil || f.users > 0 {
		return false
	}
	_ = f.fc.Close() // a namespace's chain closes nothing it shares
	f.fc = nil
	f.s.lruMu.Lock()
	f.s.lru.Remove(f.elem)
	f.elem = nil
	f.s.lruMu.Unlock()
	return true
}

// evict closes up to n of the least recently used open files that are
// idle.
func (s *Store) evict(n int) {
	s.lruMu.Lock()
	var victims []*lazyChain
	for e := s.lru.Back(); e != nil && len(victims) < n; e = e.Prev() {
		victims = append(victims, e.Value.(*lazyChain))
	}
	s.lruMu.Unlock()
	for _, f := range victims {
		f.closeIdle()
	}
}

// OpenNamespaces returns how many namespaces other than default are open
// now.
func (s *Store) OpenNamespaces() int {
	s.lruMu.Lock()
	defer s.lruMu.Unlock()
	return s.lru.Len()
}

// use runs fn on the open file.
func use[T any](ctx context.Context, f *lazyChain, fn func(*chainWriter) (T, error)) (T, error) {
	fc, err := f.acquire(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	defer f.release()
	return fn(fc)
}

// Head returns the durable head without opening a closed file.
func (f *lazyChain) Head(ctx context.Context) (ledger.Head, error) {
	if err := f.mu.lock(ctx); err != nil {
		return ledger.Head{}, err
	}
	defer f.mu.unlock()
	if f.fc != nil {
		return *f.fc.head.Load(), nil
	}
	return f.rd.ReadHead(ctx)
}

// GetKey implements ledger.ChainReader.
func (f *lazyChain) GetKey(ctx context.Context, key string) (*ledger.KeyView, error) {
	return use(ctx, f, func(fc *chainWriter) (*ledger.KeyView, error) { return fc.GetKey(ctx, key) })
}

// GetReceipt implements ledger.ChainReader.
func (f *lazyChain) GetReceipt(ctx context.Context, seq uint64) (*chain.Receipt, error) {
	return use(ctx, f, func(fc *chainWriter) (*chain.Receipt, error) { return fc.GetReceipt(ctx, seq) })
}

// ListReceipts implements ledger.ChainReader.
func (f *lazyChain) ListReceipts(ctx context.Context, rf ledger.ReceiptFilter) ([]chain.Receipt, *uint64, error) {
	var next *uint64
	rs, err := use(ctx, f, func(fc *chainWriter) ([]chain.Receipt, error) {
		rs, n, err := fc.ListReceipts(ctx, rf)
		next = n
		return rs, err
	})
	return rs, next, err
}

// Receipts implements ledger.ChainReader.
func (f *lazyChain) Receipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	_, err := use(ctx, f, func(fc *chainWriter) (struct{}, error) { return struct{}{}, fc.Receipts(ctx, after, fn) })
	return err
}

// KeyReceipts implements ledger.ChainReader.
func (f *lazyChain) KeyReceipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	_, err := use(ctx, f, func(fc *chainWriter) (struct{}, error) { return struct{}{}, fc.KeyReceipts(ctx, after, fn) })
	return err
}

// Keys implements ledger.ChainReader.
func (f *lazyChain) Keys(ctx context.Context, fn func(*ledger.KeyRecord) error) error {
	_, err := use(ctx, f, func(fc *chainWriter) (struct{}, error) { return struct{}{}, fc.Keys(ctx, fn) })
	return err
}

// DuplicateSuccesses implements ledger.ChainReader.
func (f *lazyChain) DuplicateSuccesses(ctx context.Context, fn func(*ledger.Success) error) error {
	_, err := use(ctx, f, func(fc *chainWriter) (struct{}, error) { return struct{}{}, fc.DuplicateSuccesses(ctx, fn) })
	return err
}

// RepeatedFailures implements ledger.ChainReader.
func (f *lazyChain) RepeatedFailures(ctx context.Context, tool string, fn func(*ledger.CallAfterFailure) error) error {
	_, err := use(ctx, f, func(fc *chainWriter) (struct{}, error) { return struct{}{}, fc.RepeatedFailures(ctx, tool, fn) })
	return err
}

// KeyDrift implements ledger.ChainReader.
func (f *lazyChain) KeyDrift(ctx context.Context, key string) ([]string, error) {
	return use(ctx, f, func(fc *chainWriter) ([]string, error) { return fc.KeyDrift(ctx, key) })
}

// TreeSize implements ledger.ChainReader.
func (f *lazyChain) TreeSize(ctx context.Context) (int64, error) {
	return use(ctx, f, func(fc *chainWriter) (int64, error) { return fc.TreeSize(ctx) })
}

// HashReader implements ledger.ChainReader: each read opens the file if
// it was closed in between.
func (f *lazyChain) HashReader(ctx context.Context) sumdb.HashReader {
	return sumdb.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		return use(ctx, f, func(fc *chainWriter) ([]tlog.Hash, error) { return fc.HashReader(ctx).ReadHashes(idx) })
	})
}

// ReceiptHashes implements ledger.ChainReader.
func (f *lazyChain) ReceiptHashes(ctx context.Context, from uint64, n int) ([]chain.Hash, error) {
	return use(ctx, f, func(fc *chainWriter) ([]chain.Hash, error) { return fc.ReceiptHashes(ctx, from, n) })
}

// LatestCheckpoint implements ledger.ChainReader.
func (f *lazyChain) LatestCheckpoint(ctx context.Context) (*tlog.Signed, error) {
	return use(ctx, f, func(fc *chainWriter) (*tlog.Signed, error) { return fc.LatestCheckpoint(ctx) })
}

// CheckpointAt implements ledger.ChainReader.
func (f *lazyChain) CheckpointAt(ctx context.Context, n int64) (*tlog.Signed, error) {
	return use(ctx, f, func(fc *chainWriter) (*tlog.Signed, error) { return fc.CheckpointAt(ctx, n) })
}

// CheckpointCovering implements ledger.ChainReader.
func (f *lazyChain) CheckpointCovering(ctx context.Context, n int64) (*tlog.Signed, error) {
	return use(ctx, f, func(fc *chainWriter) (*tlog.Signed, error) { return fc.CheckpointCovering(ctx, n) })
}

// FirstCheckpointCovering implements ledger.ChainReader.
func (f *lazyChain) FirstCheckpointCovering(ctx context.Context, n int64) (*tlog.Signed, error) {
	return use(ctx, f, func(fc *chainWriter) (*tlog.Signed, error) { return fc.FirstCheckpointCovering(ctx, n) })
}

// close closes the namespace if open (the Store is closing).
func (f *lazyChain) close() error {
	f.mu <- struct{}{}
	defer f.mu.unlock()
	if f.fc == nil {
		return nil
	}
	err := f.fc.Close()
	f.fc = nil
	return err
}

// KeyTTL returns the namespace's key_ttl_ms.
func (f *lazyChain) KeyTTL(ctx context.Context) (uint64, error) { return f.rd.KeyTTL(ctx) }
