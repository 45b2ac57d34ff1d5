package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	sqlRegistryRows   = `SELECT name, head_seq, head_hash, coalesce(id, 0) FROM namespaces ORDER BY name`
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
	// Seals of namespace files, which the layout before the shared
	// tables kept; nothing reads them now.
	if _, err := w.ExecContext(ctx, `DROP TABLE IF EXISTS namespace_seals`); err != nil {
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
	head ledger.Head // recorded for a namespace file (the earlier layout)
	id   int64       // in the shared tables; 0 while the namespace has a file
}

// readRegistry lists the registered namespaces with their recorded heads.
// A registry without the head columns (a file opened read-only that no
// ledgerd of this version has written) records head 0.
func readRegistry(ctx context.Context, db *sql.DB) ([]registryRow, error) {
	rows, err := db.QueryContext(ctx, sqlRegistryRows)
	if err != nil {
		rows, err = db.QueryContext(ctx, `SELECT name, head_seq, head_hash, 0 FROM namespaces ORDER BY name`)
	}
	if err != nil {
		rows, err = db.QueryContext(ctx, `SELECT name, 0, NULL, 0 FROM namespaces ORDER BY name`)
	}
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var out []registryRow
	for rows.Next() {
		var r registryRow
		var hash []byte
		if err := rows.Scan(&r.name, &r.head.Seq, &hash, &r.id); err != nil {
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

// nsState is what the check of a namespace's file learns of it.
type nsState struct {
	head ledger.Head
	ttl  uint64 // key_ttl_ms, fixed at creation
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

// DefaultHeadRecordInterval is how often a writing Store looks whether
// the key index lacks committed batches of the default namespace
// (Options.HeadRecordEvery).
const DefaultHeadRecordInterval = time.Second

// healLoop heals the index every interval until ctx ends.
func (s *Store) healLoop(ctx context.Context, every time.Duration) {
	defer close(s.healDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.healIndex(ctx)
		}
	}
}

// healIndex replays the key index of the default namespace when it lacks
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
