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
	"strings"
	"time"
)

// Ledgers of the earlier layout kept each namespace but default in a file
// of its own (<ledger file>.ns/ns-NAME.db). A writing Store moves every
// such namespace into the shared tables when it opens, one namespace per
// transaction:
//
//  0. read only, before the Store writes anything (checkNamespaceFiles,
//     for every such namespace): the file must hold the head the registry
//     recorded for it, and its recorded head must be its receipts' tail;
//     a file that is missing, behind or edited stops the start, naming
//     the ways out;
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
		path := namespacePath(s.path, r.name)
		if r.id >= 0 {
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
	// 0 was done when the Store opened (checkNamespaceFiles).
	// 1. The file on its own: migrated, checked, its WAL folded in.
	opts := s.opts
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	opts.index, opts.ReadConns = nil, 1
	fc, err := openChainWriter(ctx, path, r.name, opts)
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
	if err := copyNamespace(ctx, tx, "src", defaultID, "main", id); err != nil {
		return fmt.Errorf("copy: %w (nothing was changed)", err)
	}
	ref := chainRef{id: id}
	got, err := readTail(ctx, tx, ref)
	if err == nil {
		err = checkDerived(ctx, tx, ref, got, dbFlags(s.path, r.name))
	}
	if err != nil {
		return fmt.Errorf("check the copy: %w (nothing was changed)", err)
	}
	if got != head {
		return fmt.Errorf("the copy ends at %d, the file at %d (nothing was changed)", got.Seq, head.Seq)
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

// copyNamespace copies namespace fromID of the database attached as
// schema from into a new namespace toID of schema to, in tx: its head row
// and settings (unless toID has them: a new file's default), its receipts in seq order through the linking trigger
// (a broken chain is refused, not carried over), the tree and token rows
// of each receipt, its checkpoints, asked inputs and state key. It checks
// that every receipt arrived.
func copyNamespace(ctx context.Context, tx *sql.Tx, from string, fromID int64, to string, toID int64) error {
	r := strings.NewReplacer("FROM.", from+".", "TO.", to+".")
	var pruned bool
	if err := tx.QueryRowContext(ctx, r.Replace(`SELECT EXISTS (SELECT 1 FROM FROM.sqlite_schema WHERE type = 'table' AND name = 'ns_prunes')`)).Scan(&pruned); err != nil {
		return classify(err)
	}
	if pruned {
		// A pruned chain (SPEC §16) starts after its deleted bodies, from
		// the kept hash of the last one; what the prunes keep goes along.
		for _, q := range []string{
			`INSERT INTO TO.ns_head (ns, seq, hash) SELECT ?2, p.k, substr(t.hashes, ((p.k - 1) % 256) * 32 + 1, 32)
				FROM (SELECT coalesce((SELECT deleted_through FROM FROM.ns_prunes WHERE ns = ?1 AND deleted_through < through ORDER BY seq LIMIT 1),
					(SELECT max(deleted_through) FROM FROM.ns_prunes WHERE ns = ?1)) AS k) AS p
				JOIN FROM.ns_kept AS t ON t.ns = ?1 AND t.tile = (p.k - 1) / 256 WHERE p.k > 0
				ON CONFLICT (ns) DO UPDATE SET seq = excluded.seq, hash = excluded.hash`,
			`INSERT INTO TO.ns_prunes SELECT ?2, seq, from_seq, through, digest, segment, deleted_through FROM FROM.ns_prunes WHERE ns = ?1`,
			`INSERT INTO TO.ns_kept (ns, tile, hashes, upper) SELECT ?2, tile, hashes, upper FROM FROM.ns_kept WHERE ns = ?1 ORDER BY tile`,
			`INSERT INTO TO.ns_pruned_keys SELECT ?2, h, prune_seq FROM FROM.ns_pruned_keys WHERE ns = ?1`,
			`INSERT INTO TO.ns_kept_receipts SELECT ?2, seq, body FROM FROM.ns_kept_receipts WHERE ns = ?1`,
		} {
			if _, err := tx.ExecContext(ctx, r.Replace(q), fromID, toID); err != nil {
				return classify(err)
			}
		}
	}
	for _, q := range []string{
		`INSERT OR IGNORE INTO TO.ns_head (ns, seq, hash) VALUES (?2, 0, zeroblob(32))`,
		`INSERT OR IGNORE INTO TO.ns_settings (ns, key_ttl_ms, payloads) SELECT ?2, key_ttl_ms, payloads FROM FROM.ns_settings WHERE ns = ?1`,
		`INSERT INTO TO.ns_receipts (ns, ` + receiptColumns + `) SELECT ?2, ` + receiptColumns + `
			FROM FROM.ns_receipts WHERE ns = ?1 ORDER BY seq`,
		`INSERT INTO TO.ns_tree (rid, hashes) SELECT n.rowid, t.hashes FROM FROM.ns_receipts AS o
			JOIN FROM.ns_tree AS t ON t.rid = o.rowid JOIN TO.ns_receipts AS n ON n.ns = ?2 AND n.seq = o.seq
			WHERE o.ns = ?1 ORDER BY o.seq`,
		`INSERT INTO TO.ns_tokens (rid, token_hash) SELECT n.rowid, t.token_hash FROM FROM.ns_receipts AS o
			JOIN FROM.ns_tokens AS t ON t.rid = o.rowid JOIN TO.ns_receipts AS n ON n.ns = ?2 AND n.seq = o.seq
			WHERE o.ns = ?1 ORDER BY o.seq`,
		`INSERT INTO TO.ns_payloads SELECT n.rowid, ` + payloadColumns + ` FROM FROM.ns_receipts AS o
			JOIN FROM.ns_payloads AS p ON p.rid = o.rowid JOIN TO.ns_receipts AS n ON n.ns = ?2 AND n.seq = o.seq
			WHERE o.ns = ?1 ORDER BY o.seq`,
		`INSERT INTO TO.ns_checkpoints (ns, size, root, note, signed_at) SELECT ?2, size, root, note, signed_at
			FROM FROM.ns_checkpoints WHERE ns = ?1 ORDER BY size`,
		`INSERT INTO TO.ns_approval_inputs (ns, ask_seq, input, delete_after) SELECT ?2, ask_seq, input, delete_after
			FROM FROM.ns_approval_inputs WHERE ns = ?1`,
		`INSERT INTO TO.ns_state_key (ns, key) SELECT ?2, key FROM FROM.ns_state_key WHERE ns = ?1`,
		`INSERT INTO TO.ns_erasures (ns, seq, salt, ranges, purged_at) SELECT ?2, seq, salt, ranges, purged_at
			FROM FROM.ns_erasures WHERE ns = ?1`,
		`INSERT INTO TO.ns_erasure_subjects (ns, seq, mac) SELECT ?2, seq, mac FROM FROM.ns_erasure_subjects WHERE ns = ?1`,
	} {
		if _, err := tx.ExecContext(ctx, r.Replace(q), fromID, toID); err != nil {
			return classify(err)
		}
	}
	var n, want uint64
	if err := tx.QueryRowContext(ctx, r.Replace(`SELECT (SELECT count(*) FROM TO.ns_receipts WHERE ns = ?2),
		(SELECT count(*) FROM FROM.ns_receipts WHERE ns = ?1)`), fromID, toID).Scan(&n, &want); err != nil {
		return classify(err)
	}
	if n != want {
		return fmt.Errorf("%d of %d receipts copied", n, want)
	}
	return nil
}
