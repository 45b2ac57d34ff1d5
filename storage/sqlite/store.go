package sqlite

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// The SQLite driver keeps every namespace in the ledger file named by
// --db, in the same tables (schema.sql, tables.go), all written by one
// writer connection, so that the batches of any number of namespaces
// commit with one durable write (Write). The file also holds the registry
// of namespaces and the API tokens. Ledgers made before schema 6 kept
// namespace NAME in a file of its own, <ledger file>.ns/ns-NAME.db; a
// writing Store moves each into the ledger file when it opens
// (migratefiles.go).

// namespacePath returns the file that namespace ns of the ledger at path
// had in ledgers made before version 6 (the ledger file itself for
// default).
func namespacePath(path, ns string) string {
	if ns == ledger.DefaultNamespace {
		return path
	}
	return filepath.Join(path+".ns", "ns-"+ns+".db")
}

// Store is the SQLite storage driver (a ledger.Store).
type Store struct {
	path     string // absolute
	opts     Options
	readOnly bool

	mu      sync.Mutex // guards chains, closed
	chains  map[string]ledger.Chain
	closed  bool
	onEnded func(ns string, keys []string)

	main   *chainWriter // nil when read-only
	index  *ledgerIndex // the key index of every namespace; nil when read-only
	reader *Reader      // the default file's read pool
	tokens *sqliteTokens

	lruMu sync.Mutex // guards lru
	lru   *list.List // open *lazyChain, most recently used first

	stopHeal context.CancelFunc
	healDone chan struct{}

	open openKeys // openkeys.go
}

var _ ledger.Store = (*Store)(nil)

// OpenStore opens the ledger at path for writing (creating it if
// missing), or only for reading with readOnly (the file must exist).
func OpenStore(ctx context.Context, path string, opts Options, readOnly bool) (*Store, error) {
	abs, err := ledgerPath(path)
	if err != nil {
		return nil, err
	}
	opts.defaults()
	s := &Store{path: abs, opts: opts, readOnly: readOnly, chains: map[string]ledger.Chain{}, lru: list.New()}
	if readOnly {
		rd, err := OpenReader(ctx, abs, opts)
		if err != nil {
			return nil, err
		}
		s.reader = rd
		s.chains[ledger.DefaultNamespace] = readOnlyChain{rd}
		s.tokens = &sqliteTokens{rd: rd}
		return s, nil
	}
	// The index's lock is taken before the ledger file's: a second
	// ledgerd stops at it before touching anything.
	if err := precheck(abs); err != nil {
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	if err := checkNamespaceFiles(ctx, abs); err != nil {
		return nil, err
	}
	if err := bulkBuildIndex(ctx, abs, opts); err != nil {
		return nil, err
	}
	ix, err := openIndex(abs, opts)
	if err != nil {
		return nil, err
	}
	s.index, s.opts.index, opts.index = ix, ix.Index, ix.Index
	setIndexMetrics(ix.Index)
	c, err := openChainWriter(ctx, abs, ledger.DefaultNamespace, opts)
	if err != nil {
		_ = ix.close()
		return nil, err
	}
	fail := func(err error) (*Store, error) {
		_ = c.Close()
		_ = ix.close()
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	c.onEnded = s.ended
	s.main, s.reader = c, c.Reader
	s.chains[ledger.DefaultNamespace] = c
	s.tokens = &sqliteTokens{rd: c.Reader, w: c.w}
	if err := s.migrateFiles(ctx); err != nil {
		return fail(err)
	}
	if !opts.Repair {
		if err := s.checkSharedHeads(ctx); err != nil {
			return fail(err)
		}
	}
	hctx, cancel := context.WithCancel(context.Background())
	s.stopHeal, s.healDone = cancel, make(chan struct{})
	go s.healLoop(hctx, opts.HeadRecordEvery)
	return s, nil
}

// Path is the absolute path of the default namespace's file.
func (s *Store) Path() string { return s.path }

// Describe names the ledger file.
func (s *Store) Describe() string { return s.path }

// Main returns the default namespace's file chain's reader.
func (s *Store) Main() *Reader { return s.reader }

func (s *Store) ended(ns string, keys []string) {
	if f := s.onEnded; f != nil {
		f(ns, keys)
	}
}

// OnEnded registers the wake-up callback.
func (s *Store) OnEnded(fn func(ns string, keys []string)) { s.onEnded = fn }

// lookup returns ns's id (-1: a namespace that still has a file of its
// own, which no Store meets after its open) and whether it is registered.
func (s *Store) lookup(ctx context.Context, ns string) (int64, bool, error) {
	if ns == ledger.DefaultNamespace {
		return defaultID, true, nil
	}
	return namespaceID(ctx, s.reader.r, ns)
}

// Chain opens namespace ns's file on first use.
func (s *Store) Chain(ctx context.Context, ns string) (ledger.Chain, error) {
	s.mu.Lock()
	c, ok := s.chains[ns]
	closed := s.closed
	s.mu.Unlock()
	if ok {
		return c, nil
	}
	if closed {
		return nil, ledger.ErrClosed
	}
	if !ledger.ValidNamespace(ns) {
		return nil, ledger.ErrUnknownNamespace
	}
	id, found, err := s.lookup(ctx, ns)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, ledger.ErrUnknownNamespace
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.chains[ns]; ok {
		return c, nil
	}
	if s.closed {
		return nil, ledger.ErrClosed
	}
	switch {
	case id < 0:
		// Still in a file of its own (a ledger made before version 6)
		// because moving it in was refused: say why.
		path := namespacePath(s.path, ns)
		rec, err := recordedHead(ctx, s.reader.r, ns)
		if err == nil {
			err = checkNamespaceFile(ctx, s.path, ns, path, rec)
		}
		if err == nil {
			err = fmt.Errorf("namespace %s is still in a file of its own, %s: start ledgerd on %s to move it into the ledger file", ns, path, s.path)
		}
		return nil, err
	case s.readOnly:
		c = readOnlyChain{namespaceReader(s.reader, ns, id)}
	default:
		// Opened on first use (nsfile.go).
		c = &lazyChain{s: s, ns: ns, id: id, rd: namespaceReader(s.reader, ns, id), mu: newChanMutex()}
	}
	s.chains[ns] = c
	return c, nil
}

// CreateNamespace registers ns, empty, with settings st: once it returns,
// the namespace exists.
func (s *Store) CreateNamespace(ctx context.Context, ns string, st ledger.NamespaceSettings) error {
	if s.readOnly {
		return ledger.ErrOpenedReadOnly
	}
	if ns == ledger.DefaultNamespace {
		return ledger.ErrNamespaceExists
	}
	if err := checkNoLegacyFile(ctx, s.path, ns); err != nil {
		return err
	}
	s.main.mu.Lock()
	defer s.main.mu.Unlock()
	if s.main.closed {
		return ledger.ErrClosed
	}
	return createShared(ctx, s.main.w, ns, st)
}

// Namespaces lists the registry, default included.
func (s *Store) Namespaces(ctx context.Context) ([]string, error) {
	out := []string{ledger.DefaultNamespace}
	rows, err := s.reader.r.QueryContext(ctx, `SELECT name FROM namespaces ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, fmt.Errorf("namespaces: %w", err)
		}
		out = append(out, name)
	}
	return out, rows.Err()
}

// Tokens is the tokens table of the default file.
func (s *Store) Tokens() ledger.TokenStore { return s.tokens }

// Close closes every file.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	if s.stopHeal != nil {
		s.stopHeal()
		<-s.healDone
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for ns, c := range s.chains {
		switch c := c.(type) {
		case *lazyChain:
			errs = append(errs, c.close())
		case readOnlyChain:
			if ns != ledger.DefaultNamespace {
				errs = append(errs, c.Close())
			}
		}
	}
	// the default file last: it holds the registry
	if s.readOnly {
		errs = append(errs, s.reader.Close())
	} else {
		errs = append(errs, s.main.Close())
		// After every file: a clean stop leaves an index that needs no
		// replay.
		setIndexMetrics(nil)
		if err := s.index.Sync(); err != nil && indexBroken(err) {
			// The ledger files are closed cleanly: the next start replays
			// what the index lacks.
			s.opts.Logger.Warn("the key index could not be synced at stop; the next start replays what it lacks", "err", err)
		} else {
			errs = append(errs, err)
		}
		errs = append(errs, s.index.close())
	}
	return errors.Join(errs...)
}

// WriterStats returns the default file's writer work so far.
func (s *Store) WriterStats() WriterStats {
	if s.main == nil {
		return WriterStats{}
	}
	return s.main.WriterStats()
}

// readOnlyChain is a namespace of a Store opened for reading.
type readOnlyChain struct{ *Reader }

// Head reads the head from the file.
func (rd *Reader) Head(ctx context.Context) (ledger.Head, error) { return rd.ReadHead(ctx) }

// ReceiptHashes returns the chain hashes of receipts from+1 … from+n (fewer
// at the chain's end).
func (rd *Reader) ReceiptHashes(ctx context.Context, from uint64, n int) ([]chain.Hash, error) {
	rows, err := rd.r.QueryContext(ctx, sqlReceiptHashes, rd.args(from, n)...)
	if err != nil {
		return nil, fmt.Errorf("read receipt hashes: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	out := make([]chain.Hash, 0, n)
	next := from + 1
	for rows.Next() {
		var seq uint64
		var h hashBytes
		if err := rows.Scan(&seq, &h); err != nil {
			return nil, fmt.Errorf("read receipt hashes: %w", err)
		}
		if seq != next {
			return nil, fmt.Errorf("read receipt hashes: receipt %d follows %d", seq, next-1)
		}
		next++
		out = append(out, chain.Hash(h))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read receipt hashes: %w", classify(err))
	}
	return out, nil
}

// RebuildIndex rebuilds the default file's part of the key index from its
// receipts, while the Store serves (chainWriter.RebuildIndex).
func (s *Store) RebuildIndex(ctx context.Context) error {
	if s.readOnly {
		return ledger.ErrOpenedReadOnly
	}
	return s.main.RebuildIndex(ctx)
}

// writer returns namespace ns open for writing, and the function that
// ends its use.
func (s *Store) writer(ctx context.Context, ns string) (*chainWriter, func(), error) {
	c, err := s.Chain(ctx, ns)
	if err != nil {
		return nil, nil, err
	}
	switch c := c.(type) {
	case *chainWriter:
		return c, func() {}, nil
	case *lazyChain:
		w, err := c.acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		return w, c.release, nil
	}
	return nil, nil, fmt.Errorf("namespace %s: %T is not written by this store", ns, c)
}
