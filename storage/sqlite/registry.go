package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// The registry of namespaces lives in the ledger file (the default
// namespace's). Besides the names it records each namespace's head (seq,
// hash) as the namespace moves, so that a namespace file that is missing
// or behind it — the ledger file restored without its namespace files, a
// namespace file from an older backup — is refused instead of being served
// empty or stale: serving it would run committed effects again.
//
// The recorded head is written after the namespace's own COMMIT (it can
// lag, never lead): periodically while ledgerd runs, and exactly when a
// namespace file is closed.

// sqlNamespacesSchema is the registry.
const sqlNamespacesSchema = `CREATE TABLE IF NOT EXISTS namespaces (
	name       TEXT    PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64 AND name NOT GLOB '*[^a-z0-9._-]*'),
	created_at INTEGER NOT NULL, -- unix ms
	head_seq   INTEGER NOT NULL DEFAULT 0, -- the namespace's head as last recorded
	head_hash  BLOB
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS namespace_events (
	id         INTEGER PRIMARY KEY,
	name       TEXT    NOT NULL,
	action     TEXT    NOT NULL CHECK (action IN ('forget')),
	decided_by TEXT    NOT NULL,
	reason     TEXT    NOT NULL,
	at         INTEGER NOT NULL, -- unix ms
	head_seq   INTEGER NOT NULL, -- the head the registry had recorded
	head_hash  BLOB,
	moved_to   TEXT    NOT NULL  -- where the namespace's file was moved, or '' when it was missing
)`

// sqlRegistryHeadColumns adds the recorded head to a registry made before
// it was kept.
var sqlRegistryHeadColumns = []string{
	`ALTER TABLE namespaces ADD COLUMN head_seq INTEGER NOT NULL DEFAULT 0`,
	`ALTER TABLE namespaces ADD COLUMN head_hash BLOB`,
}

const (
	sqlRegistryRows   = `SELECT name, head_seq, head_hash FROM namespaces ORDER BY name`
	sqlRegistryRow    = `SELECT head_seq, head_hash FROM namespaces WHERE name = ?`
	sqlRecordHead     = `UPDATE namespaces SET head_seq = ?, head_hash = ? WHERE name = ? AND head_seq < ?`
	sqlRegister       = `INSERT OR IGNORE INTO namespaces (name, created_at, head_seq) VALUES (?, ?, 0)`
	sqlUnregister     = `DELETE FROM namespaces WHERE name = ?`
	sqlNamespaceEvent = `INSERT INTO namespace_events (name, action, decided_by, reason, at, head_seq, head_hash, moved_to)
		VALUES (?, 'forget', ?, ?, ?, ?, ?, ?)`
)

// ensureRegistry creates the registry in the ledger file, or adds the
// recorded head to one that predates it.
func ensureRegistry(ctx context.Context, w *sql.DB) error {
	if _, err := w.ExecContext(ctx, sqlNamespacesSchema); err != nil {
		return fmt.Errorf("namespaces: %w", classify(err))
	}
	if _, err := w.ExecContext(ctx, sqlSealsSchema); err != nil {
		return fmt.Errorf("namespaces: %w", classify(err))
	}
	var n int
	if err := w.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info('namespaces') WHERE name = 'head_seq'`).Scan(&n); err != nil {
		return fmt.Errorf("namespaces: %w", classify(err))
	}
	if n == 1 {
		return nil
	}
	for _, q := range sqlRegistryHeadColumns {
		if _, err := w.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("namespaces: %w", classify(err))
		}
	}
	return nil
}

// registryRow is one registered namespace and its recorded head.
type registryRow struct {
	name string
	head ledger.Head
}

// readRegistry lists the registered namespaces with their recorded heads.
// A registry without the head columns (a file opened read-only that no
// ledgerd of this version has written) records head 0.
func readRegistry(ctx context.Context, db *sql.DB) ([]registryRow, error) {
	rows, err := db.QueryContext(ctx, sqlRegistryRows)
	if err != nil {
		rows, err = db.QueryContext(ctx, `SELECT name, 0, NULL FROM namespaces ORDER BY name`)
	}
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var out []registryRow
	for rows.Next() {
		var r registryRow
		var hash []byte
		if err := rows.Scan(&r.name, &r.head.Seq, &hash); err != nil {
			return nil, fmt.Errorf("namespaces: %w", err)
		}
		if len(hash) > 0 {
			if r.head.Hash, err = chain.HashFromBytes(hash); err != nil {
				return nil, fmt.Errorf("namespaces: %s: %w", r.name, err)
			}
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// recordedHead returns the head the registry recorded for ns.
func recordedHead(ctx context.Context, db *sql.DB, ns string) (ledger.Head, error) {
	var h ledger.Head
	var hash []byte
	err := db.QueryRowContext(ctx, sqlRegistryRow, ns).Scan(&h.Seq, &hash)
	if err != nil {
		// A registry without the head columns records nothing yet.
		if n, e := db.QueryContext(ctx, `SELECT 1 FROM pragma_table_info('namespaces') WHERE name = 'head_seq'`); e == nil {
			found := n.Next()
			_ = n.Close()
			if !found {
				return h, nil
			}
		}
		return h, fmt.Errorf("namespaces: %w", classify(err))
	}
	if len(hash) > 0 {
		if h.Hash, err = chain.HashFromBytes(hash); err != nil {
			return h, fmt.Errorf("namespaces: %s: %w", ns, err)
		}
	}
	return h, nil
}

// lostError explains a lost namespace and names the two ways forward.
func lostError(ledgerPath, ns, path, what string) error {
	return fmt.Errorf("%w: namespace %q: %s; restore the namespace files (%s) from the backup that goes with %s, "+
		"or, if the namespace is to be given up, record that decision with "+
		"`ledgerctl namespace forget %s --db %s --by NAME --reason TEXT` (its keys then run again if reused)",
		ledger.ErrNamespaceLost, ns, what, filepath.Dir(path), ledgerPath, ns, ledgerPath)
}

// nsState is what the start-up check learns of a namespace's file.
type nsState struct {
	head ledger.Head
	ttl  uint64 // key_ttl_ms, fixed at creation
	// fp is the file's fingerprint (seal.go) while it held head, "" if
	// it changed while it was checked.
	fp string
}

// checkNamespaceFile compares namespace ns's file at path with the head
// the registry recorded for it (the file must exist and hold that head),
// checks its derived state, and returns its head and key lifetime.
func checkNamespaceFile(ctx context.Context, ledgerPath, ns, path string, rec ledger.Head, opts Options) (nsState, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nsState{}, lostError(ledgerPath, ns, path, fmt.Sprintf("its file %s is missing (the registry recorded %d receipts)", path, rec.Seq))
	}
	opts.ReadConns = 1
	rd, err := OpenReader(ctx, path, opts)
	if err != nil {
		return nsState{}, fmt.Errorf("namespace %s: %w", ns, err)
	}
	defer func() { _ = rd.Close() }()
	if err := checkAgainstRecorded(ctx, rd.r, ledgerPath, ns, path, rec); err != nil {
		return nsState{}, err
	}
	tail, err := checkTail(ctx, rd.r, rd.chainRef, dbFlags(ledgerPath, ns))
	if err != nil {
		return nsState{}, fmt.Errorf("open ledger %s: %w", path, err)
	}
	ttl, err := rd.KeyTTL(ctx)
	if err != nil {
		return nsState{}, fmt.Errorf("namespace %s: %w", ns, err)
	}
	return nsState{head: tail, ttl: ttl}, nil
}

// checkAgainstRecorded checks, through db (a pool or connection of the
// namespace's file), that the file holds the recorded head.
func checkAgainstRecorded(ctx context.Context, db *sql.DB, ledgerPath, ns, path string, rec ledger.Head) error {
	if rec.Seq == 0 {
		return nil
	}
	var hash []byte
	err := db.QueryRowContext(ctx, sqlHashAt, rec.Seq).Scan(&hash) // a namespace's own file
	if errors.Is(err, sql.ErrNoRows) {
		tail, terr := readTail(ctx, db, chainRef{q: defaultSQL})
		if terr != nil {
			return fmt.Errorf("namespace %s: %w", ns, terr)
		}
		return lostError(ledgerPath, ns, path, fmt.Sprintf("its file %s ends at receipt %d but the registry recorded %d (a file from an older backup?)", path, tail.Seq, rec.Seq))
	}
	if err != nil {
		return fmt.Errorf("namespace %s: %w", ns, classify(err))
	}
	if h, _ := chain.HashFromBytes(hash); h != rec.Hash {
		return lostError(ledgerPath, ns, path, fmt.Sprintf("its file %s holds another chain (receipt %d is %s, the registry recorded %s)",
			path, rec.Seq, shortHash(h), shortHash(rec.Hash)))
	}
	return nil
}

// CheckNamespaces checks every registered namespace's file against the
// head the registry recorded for it, and its derived state (see
// checkNamespaceFile), a few files at a time, and returns their heads and
// key lifetimes.
func (s *Store) CheckNamespaces(ctx context.Context) (map[string]nsState, error) {
	states := map[string]nsState{}
	if s.readOnly && !s.hasRegistry(ctx) {
		return states, nil
	}
	regs, err := readRegistry(ctx, s.reader.r)
	if err != nil {
		return nil, err
	}
	// A file unchanged since the last clean stop is not opened (seal.go);
	// the others a few files at a time: each check is mostly waiting on
	// opening the file and a handful of index lookups.
	seals := readSeals(ctx, s.reader.r)
	results := make([]nsState, len(regs))
	errs := make([]error, len(regs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range checkWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r := regs[i]
				path := NamespacePath(s.path, r.name)
				if st, ok := sealed(seals, r.name, path, r.head); ok {
					results[i] = st
					continue
				}
				before := fingerprint(path)
				results[i], errs[i] = checkNamespaceFile(ctx, s.path, r.name, path, r.head, s.opts)
				if before == fingerprint(path) {
					results[i].fp = before
				}
			}
		}()
	}
	for i := range regs {
		next <- i
	}
	close(next)
	wg.Wait()
	for i, r := range regs { // the first failure in name order, whatever finished first
		if errs[i] != nil {
			return nil, errs[i]
		}
		states[r.name] = results[i]
	}
	return states, nil
}

// checkWorkers is how many namespace files the start-up check reads at
// once.
const checkWorkers = 4

// catchUp records the heads found at start where the registry lags them
// (a kill -9 before the last recording), so that the registry is exact
// for every file that is not open.
func (s *Store) catchUp(ctx context.Context, states map[string]nsState, recorded map[string]ledger.Head) error {
	tx, err := s.main.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("record namespace heads: %w", classify(err))
	}
	defer func() { _ = tx.Rollback() }()
	for ns, st := range states {
		h := st.head
		if h == recorded[ns] {
			continue
		}
		if _, err := tx.ExecContext(ctx, sqlRecordHead, h.Seq, h.Hash[:], ns, h.Seq); err != nil {
			return fmt.Errorf("record namespace heads: %w", classify(err))
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("record namespace heads: %w", classify(err))
	}
	return nil
}

// recordHeads writes the heads of the open namespace files that moved
// since they were last recorded, in one transaction of the ledger file.
func (s *Store) recordHeads(ctx context.Context) error {
	s.mu.Lock()
	moved := s.movedLocked()
	s.mu.Unlock()
	heads, err := s.writeHeads(ctx, moved)
	if err != nil {
		return err
	}
	s.mu.Lock()
	for i, fc := range moved {
		s.recorded[fc.ns] = heads[i]
	}
	s.mu.Unlock()
	return nil
}

// movedLocked lists the open namespace files whose head moved since it
// was recorded; s.mu is held.
func (s *Store) movedLocked() []*fileChain {
	var moved []*fileChain
	for ns, c := range s.chains {
		f, ok := c.(*nsFile)
		if !ok {
			continue
		}
		f.mu <- struct{}{}
		fc := f.fc
		f.mu.unlock()
		if fc != nil && *fc.head.Load() != s.recorded[ns] {
			moved = append(moved, fc)
		}
	}
	return moved
}

// writeHeads records the heads of moved in one transaction and returns
// them. A recorded head only grows (a head read before another write of
// the same namespace never moves it back).
func (s *Store) writeHeads(ctx context.Context, moved []*fileChain) ([]ledger.Head, error) {
	if len(moved) == 0 {
		return nil, nil
	}
	heads := make([]ledger.Head, len(moved))
	tx, err := s.main.w.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("record namespace heads: %w", classify(err))
	}
	defer func() { _ = tx.Rollback() }()
	for i, fc := range moved {
		heads[i] = *fc.head.Load()
		if _, err := tx.ExecContext(ctx, sqlRecordHead, heads[i].Seq, heads[i].Hash[:], fc.ns, heads[i].Seq); err != nil {
			return nil, fmt.Errorf("record namespace heads: %w", classify(err))
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("record namespace heads: %w", classify(err))
	}
	return heads, nil
}

// DefaultHeadRecordInterval is how often a writing Store records the
// heads of namespaces that moved (Options.HeadRecordEvery).
const DefaultHeadRecordInterval = time.Second

// recordLoop records moved heads every interval until ctx ends.
func (s *Store) recordLoop(ctx context.Context, every time.Duration) {
	defer close(s.recordDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.recordHeads(ctx); err != nil && ctx.Err() == nil {
				s.opts.Logger.Warn("recording namespace heads", "err", err)
			}
			s.healIndex(ctx)
		}
	}
}

// healIndex replays the key index of the default file when it lacks
// committed batches (a failed apply, a full disk, a reopened index), so
// that the ledger recovers by itself once the disk has room again, not
// only at its next write; the replay's own backoff (indexRetry) spaces
// the attempts. Other namespaces replay at their next write.
func (s *Store) healIndex(ctx context.Context) {
	if s.main == nil || !s.main.needsSync() {
		return
	}
	_ = s.main.Update(ctx, func(context.Context, ledger.Tx) error { return nil })
}

// RecordHeads records the heads of open namespaces that moved now,
// instead of at the next interval (Close does it too).
func (s *Store) RecordHeads(ctx context.Context) error {
	if s.readOnly {
		return ledger.ErrOpenedReadOnly
	}
	return s.recordHeads(ctx)
}
