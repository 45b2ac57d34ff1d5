package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	sumdb "golang.org/x/mod/sumdb/tlog"
)

// Ledgers of the earlier layout kept each namespace but default in a file
// of its own (<ledger file>.ns/ns-NAME.db). A writing Store moves every
// such namespace into the shared tables when it opens, one namespace per
// transaction:
//
//  0. read only, the file must hold the head the registry recorded for
//     it, and its recorded head must be its receipts' tail; a file that
//     is missing, behind or edited stops the start, naming the ways out;
//  1. the namespace's file is opened on its own, under its lock, as
//     ledgerd always opened it: its schema brought to this version, its
//     Merkle tree checked (and built if it has none), its write-ahead log
//     folded in at close;
//  2. in one transaction of the ledger file, the namespace gets an id and
//     each of its tables is copied into the shared ones — the receipts in
//     seq order through the linking trigger, so that a broken chain is
//     refused, not carried over — and the copy's head and count are
//     checked against the file's before the registry row takes the id;
//  3. the file is renamed to <file>.migrated, never deleted.
//
// Step 1 writes to the file only once step 0 found it whole and
// current. A crash before step 2 commits leaves the namespace in its file, copied
// again at the next start; after it, the registry has the id and the next
// start only renames the file. The key index is keyed by namespace name
// and the chain is the same, so it needs no replay.

// migratedSuffix ends the name of a namespace file that was moved into
// the shared tables.
const migratedSuffix = ".migrated"

// migrateFiles moves every namespace that still has a file into the
// shared tables.
func (s *Store) migrateFiles(ctx context.Context) error {
	regs, err := readRegistry(ctx, s.main.w)
	if err != nil {
		return err
	}
	for _, r := range regs {
		path := NamespacePath(s.path, r.name)
		if r.id > 0 {
			// Moved; the file is left only by a crash before its rename.
			if _, err := os.Stat(path); err == nil {
				if err := setMigratedAside(path); err != nil {
					return fmt.Errorf("namespace %s: %w", r.name, err)
				}
			}
			continue
		}
		if err := s.migrateFile(ctx, r, path); err != nil {
			return fmt.Errorf("move namespace %s into the ledger file: %w", r.name, err)
		}
	}
	return nil
}

// migrateFile moves the namespace of registry row r from its file at path
// into the shared tables.
func (s *Store) migrateFile(ctx context.Context, r registryRow, path string) error {
	start := time.Now()
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return lostError(s.path, r.name, path, fmt.Sprintf("its file %s is missing (the registry recorded %d receipts)", path, r.head.Seq))
	}
	if err := precheck(path); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	// 0. Read only: the file holds the head the registry recorded, and its
	// recorded head is its tail. A refused file is left as it was.
	if _, err := checkNamespaceFile(ctx, s.path, r.name, path, r.head, s.opts); err != nil {
		return err
	}
	// 1. The file on its own: migrated, checked, its WAL folded in.
	opts := s.opts
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	opts.index, opts.ReadConns = nil, 1
	fc, err := openFileChain(ctx, path, r.name, opts)
	if err != nil {
		return err
	}
	head := *fc.head.Load()
	if err := fc.Close(); err != nil {
		return err
	}
	lock, err := acquireLock(path)
	if err != nil {
		return err
	}
	defer func() { _ = lock.release() }()

	// 2. One transaction of the ledger file.
	m := s.main
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.w.ExecContext(ctx, `ATTACH DATABASE ? AS src`, path); err != nil {
		return fmt.Errorf("attach %s: %w", path, classify(err))
	}
	defer func() { _, _ = m.w.ExecContext(context.Background(), `DETACH DATABASE src`) }()
	tx, err := m.w.BeginTx(ctx, nil)
	if err != nil {
		return classify(err)
	}
	defer func() { _ = tx.Rollback() }()
	id, err := allocateID(ctx, tx, r.name)
	if err != nil {
		return err
	}
	for _, q := range []string{
		sqlNewHead,
		`INSERT INTO ns_settings (ns, key_ttl_ms) SELECT ?, coalesce((SELECT key_ttl_ms FROM src.settings WHERE id = 1), 0)`,
		`INSERT INTO ns_receipts (ns, ` + receiptColumns + `) SELECT ?, ` + receiptColumns + ` FROM src.receipts ORDER BY seq`,
		`INSERT INTO ns_checkpoints (ns, size, root, note, signed_at) SELECT ?, size, root, note, signed_at FROM src.checkpoints ORDER BY size`,
		`INSERT INTO ns_tokens (rid, token_hash) SELECT r.rowid, s.token_hash FROM src.reserve_tokens AS s
			JOIN ns_receipts AS r ON r.ns = ?1 AND r.seq = s.seq ORDER BY s.seq`,
		`INSERT INTO ns_approval_inputs (ns, ask_seq, input, delete_after) SELECT ?, ask_seq, input, delete_after FROM src.approval_inputs`,
		`INSERT INTO ns_state_key (ns, key) SELECT ?, key FROM src.state_key`,
	} {
		if _, err := tx.ExecContext(ctx, q, id); err != nil {
			return fmt.Errorf("copy: %w (nothing was changed)", classify(err))
		}
	}
	if err := copyTreeIn(ctx, tx, id, head.Seq); err != nil {
		return fmt.Errorf("copy the Merkle tree: %w (nothing was changed)", err)
	}
	ref := chainRef{q: sharedSQL, id: id}
	got, err := readTail(ctx, tx, ref)
	if err == nil {
		err = checkDerived(ctx, tx, ref, got, dbFlags(s.path, r.name))
	}
	if err != nil {
		return fmt.Errorf("check the copy: %w (nothing was changed)", err)
	}
	var n, want uint64
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM ns_receipts WHERE ns = ?`, id).Scan(&n); err != nil {
		return classify(err)
	}
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM src.receipts`).Scan(&want); err != nil {
		return classify(err)
	}
	if got != head || n != want || n != head.Seq {
		return fmt.Errorf("the copy ends at %d (%d receipts), the file at %d (%d receipts) (nothing was changed)", got.Seq, n, head.Seq, want)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE namespaces SET id = ? WHERE name = ?`, id, r.name); err != nil {
		return classify(err)
	}
	if err := tx.Commit(); err != nil {
		return classify(err)
	}
	if _, err := m.w.ExecContext(ctx, `DETACH DATABASE src`); err != nil {
		return fmt.Errorf("detach %s: %w", path, classify(err))
	}

	// 3. The file goes aside.
	if err := setMigratedAside(path); err != nil {
		return err
	}
	s.opts.Logger.Info("moved a namespace into the ledger file", "namespace", r.name, "receipts", head.Seq,
		"file", path+migratedSuffix, "duration", time.Since(start))
	return nil
}

// setMigratedAside renames a moved namespace's file (and its -wal and
// -shm, if any) to <file>.migrated.
func setMigratedAside(path string) error {
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(path+suffix, path+migratedSuffix+suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return syncDir(filepath.Dir(path))
}

// copyTreeIn copies the stored tree hashes of the attached file src, one
// row per hash, into ns_tree rows of namespace id, one per leaf, for its
// leaves 0 … size-1 (the file's tree has exactly its receipts: step 1
// checked it).
func copyTreeIn(ctx context.Context, tx *sql.Tx, id int64, size uint64) error {
	rows, err := tx.QueryContext(ctx, `SELECT idx, hash FROM src.tree_hashes ORDER BY idx`)
	if err != nil {
		return classify(err)
	}
	defer func() { _ = rows.Close() }()
	st, err := tx.PrepareContext(ctx, sharedSQL.treeRowBySeq)
	if err != nil {
		return classify(err)
	}
	defer func() { _ = st.Close() }()
	var leaf []byte
	n := int64(0) // the leaf being gathered
	end := sumdb.StoredHashIndex(0, n+1)
	next := int64(0)
	for rows.Next() {
		var idx int64
		var h []byte
		if err := rows.Scan(&idx, &h); err != nil {
			return err
		}
		if idx != next || len(h) != 32 {
			return fmt.Errorf("stored tree hash %d out of order or not 32 bytes", idx)
		}
		next++
		leaf = append(leaf, h...)
		if idx+1 == end {
			res, err := st.ExecContext(ctx, id, n+1, leaf)
			if err != nil {
				return classify(err)
			}
			if k, _ := res.RowsAffected(); k != 1 {
				return fmt.Errorf("leaf %d has no receipt", n)
			}
			leaf, n = leaf[:0], n+1
			end = sumdb.StoredHashIndex(0, n+1)
		}
	}
	if err := rows.Err(); err != nil {
		return classify(err)
	}
	if len(leaf) > 0 || uint64(n) != size {
		return fmt.Errorf("the tree has %d whole leaves, the chain %d receipts", n, size)
	}
	return nil
}
