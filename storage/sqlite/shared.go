package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// Every namespace lives in the tables of the ledger file (schema.sql,
// tables.go). Each but default (id 0) has an id in the registry, allocated
// once from namespace_ids and never used again, even after the namespace
// is forgotten. A namespace's chain is a chainWriter that shares the ledger
// file's writer connection, its lock (one writer for the whole file), read
// pool, statements and checkpointer, and has its own head, caches and
// tree.

const (
	sqlAllocateID     = `INSERT INTO namespace_ids (name) VALUES (?)`
	sqlRegisterShared = `INSERT INTO namespaces (name, created_at, head_seq, id) VALUES (?, ?, 0, ?)`
	sqlNamespaceID    = `SELECT coalesce(id, -1) FROM namespaces WHERE name = ?`
)

// allocateID takes the next namespace id for ns in tx.
func allocateID(ctx context.Context, tx *sql.Tx, ns string) (int64, error) {
	res, err := tx.ExecContext(ctx, sqlAllocateID, ns)
	if err != nil {
		return 0, classify(err)
	}
	return res.LastInsertId()
}

// createShared registers namespace ns in the shared tables, empty, with
// key lifetime keyTTL, in one transaction of w: once it returns, the
// namespace exists.
func createShared(ctx context.Context, w *sql.DB, ns string, st ledger.NamespaceSettings) error {
	tx, err := w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create namespace: %w", classify(err))
	}
	defer func() { _ = tx.Rollback() }()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM namespaces WHERE name = ?`, ns).Scan(&n); err != nil {
		return fmt.Errorf("create namespace: %w", classify(err))
	}
	if n > 0 {
		return ledger.ErrNamespaceExists
	}
	id, err := allocateID(ctx, tx, ns)
	if err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	for _, st := range []struct {
		q    string
		args []any
	}{
		{sqlNewHead, []any{id}},
		{sqlNewSettings, []any{id, st.KeyTTL, string(st.Resolved().Payloads)}},
		{sqlRegisterShared, []any{ns, time.Now().UnixMilli(), id}},
	} {
		if _, err := tx.ExecContext(ctx, st.q, st.args...); err != nil {
			return fmt.Errorf("create namespace: %w", classify(err))
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create namespace: %w", classify(err))
	}
	return nil
}

// namespaceID returns ns's id in the registry read through db: -1 for a
// namespace that still has a file of its own (a ledger of the layout
// before version 6, not yet opened by a writing ledgerd), and found false
// for a name not registered.
func namespaceID(ctx context.Context, db *sql.DB, ns string) (id int64, found bool, err error) {
	err = db.QueryRowContext(ctx, sqlNamespaceID, ns).Scan(&id)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, false, nil
	case err != nil:
		// A registry without ids (made before version 6) has only
		// namespaces with files.
		var n int
		if qerr := db.QueryRowContext(ctx, `SELECT count(*) FROM namespaces WHERE name = ?`, ns).Scan(&n); qerr == nil {
			return -1, n == 1, nil
		}
		return 0, false, fmt.Errorf("namespaces: %w", classify(err))
	}
	return id, true, nil
}

// namespaceReader reads namespace ns (id) of the ledger file that m reads,
// through m's pool.
func namespaceReader(m *Reader, ns string, id int64) *Reader {
	return &Reader{path: m.path, r: m.r, now: m.now, busy: m.busy, chainRef: chainRef{id: id}, ns: ns, borrowed: true}
}

// openShared opens namespace ns (id) of the shared tables for writing:
// its head checked against the recorded one, its tree checked, and the key
// index brought up to its chain.
func (s *Store) openShared(ctx context.Context, ns string, id int64) (*chainWriter, error) {
	m := s.main
	opts := s.opts
	c := &chainWriter{Reader: namespaceReader(m.Reader, ns, id), ns: ns, now: opts.Now, logger: opts.Logger,
		w: m.w, mu: m.mu, main: m, stmts: m.stmts, ckpt: m.ckpt, idx: m.idx,
		cache: m.cache, onEnded: s.ended}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ledger.ErrClosed
	}
	if err := c.loadHead(ctx, c.chainRef, dbFlags(s.path, ns), opts.Repair); err != nil {
		return nil, fmt.Errorf("namespace %s: %w", ns, err)
	}
	if err := c.initTree(ctx, *c.head.Load(), opts.Repair); err != nil {
		return nil, fmt.Errorf("namespace %s: %w", ns, err)
	}
	if err := c.openIndex(ctx, opts); err != nil {
		return nil, fmt.Errorf("namespace %s: %w", ns, err)
	}
	return c, nil
}

// Write runs every batch in one transaction of the ledger file's single
// writer, with one COMMIT: the batches of any number of namespaces cost
// one durable write (ledger.Store.Write). Each batch has its own Tx over
// its own chain. A batch whose run fails, or whose namespace cannot be
// opened, rolls the write back and is named in a *ledger.PartError
// (SQLite runs one statement at a time, so the failure is that batch's).
// A failed COMMIT is every batch's.
func (s *Store) Write(ctx context.Context, batches []ledger.Batch) error {
	if s.readOnly {
		return ledger.ErrOpenedReadOnly
	}
	chains := make([]*chainWriter, len(batches))
	seen := make(map[string]bool, len(batches))
	for i, b := range batches {
		if seen[b.NS] {
			return &ledger.PartError{Part: i, Err: fmt.Errorf("write: namespace %s twice in one write", b.NS)}
		}
		seen[b.NS] = true
		c, release, err := s.writer(ctx, b.NS)
		if err != nil {
			return &ledger.PartError{Part: i, Err: err}
		}
		defer release()
		chains[i] = c
	}
	m := s.main
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ledger.ErrClosed
	}
	start := time.Now()
	txs := make([]*writeTx, len(batches))
	for i, c := range chains {
		if c.closed {
			return &ledger.PartError{Part: i, Err: ledger.ErrClosed}
		}
		if err := c.indexUsable(ctx); err != nil {
			return &ledger.PartError{Part: i, Err: err}
		}
		txs[i] = c.newTx()
	}
	tx, err := m.w.BeginTx(context.Background(), nil) // a request's end must not interrupt a shared transaction
	if err != nil {
		return fmt.Errorf("begin: %w", classify(err))
	}
	appended := 0
	for i, b := range batches {
		t := txs[i]
		t.tx = tx
		err := b.Run(ctx, t)
		if err == nil {
			err = t.flushPayloads(ctx)
		}
		if err != nil {
			_ = tx.Rollback()
			return &ledger.PartError{Part: i, Err: err}
		}
		appended += t.appended
	}
	if err := m.commit(tx); err != nil {
		return err
	}
	// Every part's index entries and watermark in one Pebble batch.
	for i, c := range chains {
		c.record(txs[i])
	}
	if f := m.afterCommit; f != nil {
		f()
	}
	if appended > 0 {
		b := m.idx.NewBatch(ledger.DefaultNamespace)
		var err error
		for i, c := range chains {
			if txs[i].appended > 0 && err == nil {
				err = c.addToIndex(b, txs[i])
			}
		}
		if err == nil {
			err = b.Apply()
		}
		b.Close()
		if err != nil {
			for i, c := range chains {
				if txs[i].appended > 0 {
					c.indexFailed(txs[i], err)
				}
			}
		}
	}
	for i, c := range chains {
		c.settle(txs[i])
	}
	m.counted(start, appended)
	return nil
}

// NamespaceFile returns the file of its own that namespace ns of the
// ledger at path still has, and true: a ledger made before version 6 that
// no writing ledgerd of this version has opened yet (ledgerd moves each
// into the ledger file). It returns false for every other namespace.
func NamespaceFile(ctx context.Context, path, ns string) (string, bool, error) {
	abs, err := ledgerPath(path)
	if err != nil || ns == ledger.DefaultNamespace {
		return "", false, err
	}
	if err := precheck(abs); err != nil {
		return "", false, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	r, err := sql.Open("sqlite3", dsn(abs, "ro", 5*time.Second, 0))
	if err != nil {
		return "", false, err
	}
	defer func() { _ = r.Close() }()
	id, found, err := namespaceID(ctx, r, ns)
	if err != nil {
		return "", false, err
	}
	if !found {
		return "", false, ledger.ErrUnknownNamespace
	}
	return namespacePath(abs, ns), id < 0, nil
}

// sqlHeadsOff lists the registered namespaces whose recorded
// head is missing or is not their receipts' tail (receipts removed or
// added, or the head edited or deleted, behind ledgerd's back): one
// lookup of the (ns, seq) index per namespace.
const sqlHeadsOff = `
	SELECT n.name, h.seq, t.seq
	FROM namespaces AS n LEFT JOIN ns_head AS h ON h.ns = n.id
	LEFT JOIN ns_receipts AS t ON t.ns = n.id AND t.seq = (SELECT max(seq) FROM ns_receipts WHERE ns = n.id)
	WHERE n.id IS NOT NULL AND (h.ns IS NULL OR coalesce(t.seq, 0) != h.seq OR (t.seq IS NOT NULL AND t.hash != h.hash))
	ORDER BY n.name LIMIT 1`

// checkSharedHeads checks every namespace's recorded head against its
// receipts' tail, as the open of each file did in the earlier layout, so
// that a tampered namespace stops ledgerd at start, not at its first use.
func (s *Store) checkSharedHeads(ctx context.Context) error {
	var name string
	var rec, tail sql.NullInt64
	err := s.main.w.QueryRowContext(ctx, sqlHeadsOff).Scan(&name, &rec, &tail)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check the namespaces' heads: %w", classify(err))
	}
	flags := dbFlags(s.path, name)
	if !rec.Valid {
		return &lostHead{fmt.Sprintf("namespace %s: its recorded head is missing while its receipts end at %d (removed outside ledgerd); "+
			"check the chain with `ledgerctl verify %s`, then recompute the derived state with `ledgerctl rebuild-index %s`",
			name, tail.Int64, flags, flags)}
	}
	return fmt.Errorf("namespace %s: %w: the last append recorded head %d but the receipts end at %d — "+
		"receipts were removed or added outside ledgerd (a bad restore or a tampered file); "+
		"check the chain with `ledgerctl verify %s`, then recompute the derived state with `ledgerctl rebuild-index %s`",
		name, ledger.ErrDerivedState, rec.Int64, tail.Int64, flags, flags)
}

// checkNoLegacyFile refuses to create namespace ns of the ledger at abs
// while a file of the earlier layout that the registry does not know
// holds receipts under its name (the ledger file restored from before the
// namespace was created, say): its keys would run again in a new, empty
// namespace. An empty one (left by a creation that died) is no history.
func checkNoLegacyFile(ctx context.Context, abs, ns string) error {
	path := namespacePath(abs, ns)
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	rd, err := OpenReader(ctx, path, Options{ReadConns: 1})
	if err != nil {
		return fmt.Errorf("%w: %s is not a readable ledger file (%w); move it away to create namespace %s",
			ledger.ErrNamespaceLost, path, err, ns)
	}
	h, err := rd.ReadHead(ctx)
	_ = rd.Close()
	if err != nil {
		return err
	}
	if h.Seq > 0 {
		return fmt.Errorf("%w: %s already holds %d receipts that the registry of %s does not know; "+
			"restore the ledger file that goes with it, or move the file away", ledger.ErrNamespaceLost, path, h.Seq, abs)
	}
	return nil
}

// lostHead is a namespace whose head row is gone: damaged storage
// (ledger.ErrStorageCorrupt: 503, nothing recorded) whose derived state
// does not match its chain (ledger.ErrDerivedState).
type lostHead struct{ msg string }

func (e *lostHead) Error() string { return e.msg }

func (e *lostHead) Unwrap() []error { return []error{ledger.ErrStorageCorrupt, ledger.ErrDerivedState} }
