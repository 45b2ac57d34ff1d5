package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// The registry of namespaces (schema.sql's namespaces) lives in the
// ledger file. For a ledger made before version 6, whose namespaces had
// files of their own, it recorded each namespace's head as the namespace
// moved, so that a namespace file that is missing or behind it — the
// ledger file restored without its namespace files, a namespace file from
// an older backup — is refused when it is moved in, instead of being
// served empty or stale: serving it would run committed effects again.

const (
	sqlRegistryRow    = `SELECT head_seq, head_hash FROM namespaces WHERE name = ?`
	sqlUnregister     = `DELETE FROM namespaces WHERE name = ?`
	sqlNamespaceEvent = `INSERT INTO namespace_events (name, action, decided_by, reason, at, head_seq, head_hash, moved_to)
		VALUES (?, 'forget', ?, ?, ?, ?, ?, ?)`
)

// registryRow is one registered namespace and its recorded head.
type registryRow struct {
	name string
	head ledger.Head // recorded for a namespace file (before version 6)
	id   int64       // -1 while the namespace has a file of its own
}

// readRegistry lists the registered namespaces with their recorded heads,
// from a registry of any version (one made before the recorded heads or
// the ids records none).
func readRegistry(ctx context.Context, db *sql.DB) ([]registryRow, error) {
	cols, err := tableColumns(ctx, db, "namespaces")
	if err != nil {
		return nil, fmt.Errorf("namespaces: %w", err)
	}
	if len(cols) == 0 {
		return nil, nil // a file made before namespaces
	}
	col := func(name, absent string) string { // a column of the registry, or what its absence means
		if slices.Contains(cols, name) {
			return name
		}
		return absent
	}
	rows, err := db.QueryContext(ctx, fmt.Sprintf(`SELECT name, %s, %s, coalesce(%s, -1) FROM namespaces ORDER BY name`,
		col("head_seq", "0"), col("head_hash", "NULL"), col("id", "NULL")))
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
	if err := db.QueryRowContext(ctx, sqlRegistryRow, ns).Scan(&h.Seq, &hash); err != nil {
		return h, fmt.Errorf("namespaces: %w", classify(err))
	}
	if len(hash) > 0 {
		var err error
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

// checkNamespaceFiles checks, reading only, every namespace of the ledger
// at abs that still has a file of its own (checkNamespaceFile), so that a
// start that is to be refused writes nothing.
func checkNamespaceFiles(ctx context.Context, abs string) error {
	if _, err := os.Stat(abs); err != nil {
		return nil // a new ledger
	}
	db, err := sql.Open("sqlite3", dsn(abs, "ro", 5*time.Second, 0))
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	regs, err := readRegistry(ctx, db)
	if err != nil {
		return err
	}
	for _, r := range regs {
		if r.id < 0 {
			if err := checkNamespaceFile(ctx, abs, r.name, namespacePath(abs, r.name), r.head); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkNamespaceFile checks, reading only, that namespace ns's file at
// path (of a ledger made before version 6) holds the head rec the
// registry recorded for it, and that its recorded head is its receipts'
// tail. It reads the table receipts and the head row, which every
// version of a ledger file has (a view and ns_head since version 7).
func checkNamespaceFile(ctx context.Context, ledgerPath, ns, path string, rec ledger.Head) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return lostError(ledgerPath, ns, path, fmt.Sprintf("its file %s is missing (the registry recorded %d receipts)", path, rec.Seq))
	}
	if err := precheck(path); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	db, err := sql.Open("sqlite3", dsn(path, "ro", 5*time.Second, 0))
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	tx, err := db.BeginTx(ctx, nil) // one snapshot
	if err != nil {
		return fmt.Errorf("namespace %s: %w", ns, classify(err))
	}
	defer func() { _ = tx.Rollback() }()
	headRow := `SELECT seq, hash FROM ns_head WHERE ns = 0`
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE name = 'head'`).Scan(&n); err == nil && n == 1 {
		headRow = `SELECT seq, hash FROM head WHERE id = 1` // before version 7
	}
	var tail, recorded, atRec ledger.Head
	for _, q := range []struct {
		dst  *ledger.Head
		sql  string
		args []any
	}{
		{&tail, `SELECT seq, hash FROM receipts WHERE typeof(seq) = 'integer' ORDER BY seq DESC LIMIT 1`, nil},
		{&recorded, headRow, nil},
		{&atRec, `SELECT seq, hash FROM receipts WHERE seq = ?`, []any{rec.Seq}},
	} {
		if err := tx.QueryRowContext(ctx, q.sql, q.args...).Scan(&q.dst.Seq, hashScanner{&q.dst.Hash}); err != nil &&
			!errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("namespace %s: %s: %w", ns, path, classify(err))
		}
	}
	switch {
	case rec.Seq > 0 && atRec.Seq == 0:
		return lostError(ledgerPath, ns, path, fmt.Sprintf("its file %s ends at receipt %d but the registry recorded %d (a file from an older backup?)", path, tail.Seq, rec.Seq))
	case rec.Seq > 0 && atRec.Hash != rec.Hash:
		return lostError(ledgerPath, ns, path, fmt.Sprintf("its file %s holds another chain (receipt %d is %s, the registry recorded %s)",
			path, rec.Seq, shortHash(atRec.Hash), shortHash(rec.Hash)))
	case recorded != tail:
		flags := dbFlags(ledgerPath, ns)
		return fmt.Errorf("open ledger %s: %w: the last append recorded head %d but the receipts end at %d — "+
			"receipts were removed or added outside ledgerd (a bad restore or a tampered file); "+
			"check the chain with `ledgerctl verify %s`, then recompute the derived state with `ledgerctl rebuild-index %s`",
			path, ledger.ErrDerivedState, recorded.Seq, tail.Seq, flags, flags)
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
	_ = s.main.update(ctx, func(context.Context, ledger.Tx) error { return nil })
}
