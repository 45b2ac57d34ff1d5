package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// CreateNamespace creates namespace ns of the ledger at path with
// settings st, and registers it. It may run beside
// a ledgerd serving the file (it writes only the registry and a new file).
func CreateNamespace(ctx context.Context, path, ns string, st ledger.NamespaceSettings) error {
	if err := ledger.CheckNamespace(ns); err != nil {
		return err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	if ns == ledger.DefaultNamespace {
		return ledger.ErrNamespaceExists
	}
	w, err := openRegistryWriter(ctx, abs, false)
	if err != nil {
		return err
	}
	defer func() { _ = w.Close() }()
	if err := checkNoLegacyFile(ctx, abs, ns); err != nil {
		return err
	}
	return createShared(ctx, w, ns, st)
}

// openRegistryWriter opens a one-connection writer of the ledger file at
// abs (which must exist) for a command that runs beside (or instead of)
// ledgerd. A file of an older schema is migrated first, under the file's
// lock (held by the caller when locked), so never beside a ledgerd.
func openRegistryWriter(ctx context.Context, abs string, locked bool) (*sql.DB, error) {
	if err := precheck(abs); err != nil {
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	w, err := sql.Open("sqlite3", dsn(abs, "rw", 5*time.Second, DefaultCacheMiB))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", abs, err)
	}
	w.SetMaxOpenConns(1)
	var version int
	if err := w.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&version); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("open ledger %s: %w", abs, classify(err))
	}
	if version != SchemaVersion {
		err = upgradeLocked(ctx, w, abs, locked)
	}
	if err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("open ledger %s: %w", abs, err)
	}
	return w, nil
}

// upgradeLocked migrates the file at abs through w, taking its lock unless
// the caller holds it.
func upgradeLocked(ctx context.Context, w *sql.DB, abs string, locked bool) error {
	if !locked {
		lock, err := acquireLock(abs)
		if err != nil {
			return err
		}
		defer func() { _ = lock.release() }()
	}
	return upgrade(ctx, w, abs, ledger.NamespaceSettings{}.Resolved(), slog.Default())
}

// removeFileSet removes a database file and the files SQLite and the lock
// keep beside it.
func removeFileSet(path string) {
	for _, suffix := range []string{"", "-wal", "-shm", "-journal", ".lock"} {
		_ = os.Remove(path + suffix)
	}
}

// ForgetResult says what ForgetNamespace did.
type ForgetResult struct {
	// Head is the head the registry had recorded for the namespace.
	Head ledger.Head
	// MovedTo is where the namespace's file went, or "" if it was missing;
	// with Kept, the file its rows were copied to from the ledger file.
	MovedTo string
	Kept    bool
}

// ForgetNamespace gives up namespace ns of the ledger at path: its file
// (if any) is moved aside to NAME.forgotten-UNIXMS, its registry row is
// removed, and the decision — who took it, why, and the head the registry
// had recorded — is kept in the ledger file's namespace_events table. The
// name may then be created again, empty: keys used before run again. It
// needs ledgerd stopped (it takes the ledger file's lock).
func ForgetNamespace(ctx context.Context, path, ns, by, reason string) (*ForgetResult, error) {
	if err := ledger.CheckNamespace(ns); err != nil {
		return nil, err
	}
	if ns == ledger.DefaultNamespace {
		return nil, errors.New("forget: the default namespace is the ledger file itself")
	}
	if strings.TrimSpace(by) == "" || strings.TrimSpace(reason) == "" {
		return nil, errors.New("forget: say who decides (--by) and why (--reason): the decision is recorded")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	if err := precheck(abs); err != nil {
		return nil, fmt.Errorf("forget: %w", err)
	}
	lock, err := acquireLock(abs)
	if err != nil {
		return nil, fmt.Errorf("forget (stop ledgerd first): %w", err)
	}
	defer func() { _ = lock.release() }()
	w, err := openRegistryWriter(ctx, abs, true)
	if err != nil {
		return nil, fmt.Errorf("forget: %w", err)
	}
	defer func() { _ = w.Close() }()
	var n int
	if err := w.QueryRowContext(ctx, `SELECT count(*) FROM namespaces WHERE name = ?`, ns).Scan(&n); err != nil {
		return nil, fmt.Errorf("forget: %w", classify(err))
	}
	if n == 0 {
		return nil, ledger.ErrUnknownNamespace
	}
	id, _, err := namespaceID(ctx, w, ns)
	if err != nil {
		return nil, fmt.Errorf("forget: %w", err)
	}
	if id >= 0 {
		return forgetShared(ctx, w, abs, ns, id, by, reason)
	}
	rec, err := recordedHead(ctx, w, ns)
	if err != nil {
		return nil, err
	}
	res := &ForgetResult{Head: rec}
	if res.MovedTo, err = moveAside(namespacePath(abs, ns)); err != nil {
		return nil, fmt.Errorf("forget: %w", err)
	}
	if err := recordForget(ctx, w, ns, by, reason, rec, res.MovedTo, nil); err != nil {
		return nil, fmt.Errorf("forget: %w", err)
	}
	if err := dropFromIndex(abs, ns); err != nil {
		return res, fmt.Errorf("forget: recorded, but %w (it is dropped when the name is used again)", err)
	}
	return res, nil
}

// NamespaceKeepsPayloads reports whether namespace ns of the ledger at
// path keeps a value an erase would take (SPEC §14): a payload of a
// receipt other than an erase receipt.
// `ledgerctl namespace forget` erases them before the namespace's rows
// leave the file. A namespace of the earlier layout keeps none.
func NamespaceKeepsPayloads(ctx context.Context, path, ns string) (bool, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return false, err
	}
	w, err := openRegistryWriter(ctx, abs, false)
	if err != nil {
		return false, err
	}
	defer func() { _ = w.Close() }()
	id, found, err := namespaceID(ctx, w, ns)
	if err != nil || !found || id < 0 {
		return false, err
	}
	var keeps bool
	err = w.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM ns_payloads AS p JOIN ns_receipts AS r ON r.rowid = p.rid
		WHERE r.ns = ?1 AND r.kind <> 'erase' AND (p.external_ref IS NOT NULL OR p.result IS NOT NULL
			OR p.error_message IS NOT NULL OR p.note IS NOT NULL))`, id).Scan(&keeps)
	if err != nil {
		return false, fmt.Errorf("read namespace %s's payloads: %w", ns, classify(err))
	}
	return keeps, nil
}

// moveAside renames a forgotten namespace's file (with its -wal and -shm) to
// <file>.forgotten-<unix ms> under the file's own lock, and returns the new name; "" when the
// file does not exist.
func moveAside(nsPath string) (string, error) {
	if _, err := os.Stat(nsPath); err != nil {
		return "", nil
	}
	nslock, err := acquireLock(nsPath)
	if err != nil {
		return "", err
	}
	defer func() { _ = nslock.release() }()
	movedTo := fmt.Sprintf("%s.forgotten-%d", nsPath, time.Now().UnixMilli())
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(nsPath+suffix, movedTo+suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
	}
	return movedTo, syncDir(filepath.Dir(nsPath))
}

// recordForget records the decision to forget ns (who, why, its last recorded head, where its
// file went) and removes it from the registry, in one transaction.
func recordForget(ctx context.Context, w *sql.DB, ns, by, reason string, rec ledger.Head, movedTo string, then func(*sql.Tx) error) error {
	tx, err := w.BeginTx(ctx, nil)
	if err != nil {
		return classify(err)
	}
	defer func() { _ = tx.Rollback() }()
	var hash []byte
	if rec.Seq > 0 {
		hash = rec.Hash[:]
	}
	if _, err := tx.ExecContext(ctx, sqlNamespaceEvent, ns, by, reason, time.Now().UnixMilli(), rec.Seq, hash, movedTo); err != nil {
		return classify(err)
	}
	if _, err := tx.ExecContext(ctx, sqlUnregister, ns); err != nil {
		return classify(err)
	}
	if then != nil {
		if err := then(tx); err != nil {
			return err
		}
	}
	return classify(tx.Commit())
}

// dropFromIndex removes namespace ns's part of the key index of the
// ledger at abs, if it has one. Were it left, it would do no harm (a
// namespace made again under the name has another chain, whose first open
// drops it); it would only take space.
func dropFromIndex(abs, ns string) error {
	if _, err := os.Stat(IndexPath(abs)); err != nil {
		return nil
	}
	o := Options{Logger: slog.New(slog.DiscardHandler)}
	o.defaults()
	ix, err := openIndex(abs, o)
	if err != nil {
		return fmt.Errorf("the key index could not be opened to drop the namespace's part: %w", err)
	}
	err = ix.Drop(ns)
	if cerr := ix.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("dropping the namespace's part of the key index failed: %w", err)
	}
	return nil
}

// forgetShared forgets namespace ns (id) of the ledger file: its rows
// are copied into a ledger file of their own beside the ledger file,
// <ledger file>.forgotten-NAME-UNIXMS, which ledgerctl verify --db reads
// as any ledger file; then one transaction records the decision, removes
// the registry row and deletes the rows (the append-only triggers let a
// namespace's rows go only once it is no longer registered).
func forgetShared(ctx context.Context, w *sql.DB, abs, ns string, id int64, by, reason string) (*ForgetResult, error) {
	ref := chainRef{id: id}
	head, err := readTail(ctx, w, ref)
	if err != nil {
		return nil, fmt.Errorf("forget: %w", err)
	}
	var st ledger.NamespaceSettings
	if err := w.QueryRowContext(ctx, sqlSettings, ref.args()...).Scan(&st.KeyTTL, &st.Payloads); err != nil {
		return nil, fmt.Errorf("forget: read settings: %w", classify(err))
	}
	if err := removeUnrecordedCopies(ctx, w, abs, ns); err != nil {
		return nil, fmt.Errorf("forget: %w", err)
	}
	side := fmt.Sprintf("%s.forgotten-%s-%d", abs, ns, time.Now().UnixMilli())
	if err := copyOut(ctx, w, side, id, st, head); err != nil {
		removeFileSet(side)
		return nil, fmt.Errorf("forget: keep the namespace's receipts in %s: %w (nothing was forgotten)", side, err)
	}
	err = recordForget(ctx, w, ns, by, reason, head, side, func(tx *sql.Tx) error {
		for _, q := range []string{
			`DELETE FROM ns_tree WHERE rid IN (SELECT rowid FROM ns_receipts WHERE ns = ?)`,
			`DELETE FROM ns_tokens WHERE rid IN (SELECT rowid FROM ns_receipts WHERE ns = ?)`,
			`DELETE FROM ns_payloads WHERE rid IN (SELECT rowid FROM ns_receipts WHERE ns = ?)`,
			`DELETE FROM ns_erasures WHERE ns = ?`, `DELETE FROM ns_erasure_subjects WHERE ns = ?`, `DELETE FROM ns_subjects WHERE ns = ?`,
			`DELETE FROM ns_pending_erasures WHERE ns = ?`, `DELETE FROM ns_reconciled_tokens WHERE ns = ?`,
			`DELETE FROM ns_receipts WHERE ns = ?`, `DELETE FROM ns_checkpoints WHERE ns = ?`,
			`DELETE FROM ns_approval_inputs WHERE ns = ?`, `DELETE FROM ns_state_key WHERE ns = ?`,
			`DELETE FROM ns_prunes WHERE ns = ?`, `DELETE FROM ns_kept WHERE ns = ?`,
			`DELETE FROM ns_pruned_keys WHERE ns = ?`, `DELETE FROM ns_kept_receipts WHERE ns = ?`,
			`DELETE FROM ns_settings WHERE ns = ?`, `DELETE FROM ns_head WHERE ns = ?`,
		} {
			if _, err := tx.ExecContext(ctx, q, id); err != nil {
				return fmt.Errorf("%s: %w", q, classify(err))
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("forget: %w (its copy %s stays)", err, side)
	}
	res := &ForgetResult{Head: head, MovedTo: side, Kept: true}
	if err := dropFromIndex(abs, ns); err != nil {
		return res, fmt.Errorf("forget: recorded, but %w (it is dropped when the name is used again)", err)
	}
	return res, nil
}

// removeUnrecordedCopies removes the copies of namespace ns that a forget
// killed before it recorded its decision left beside the ledger file at
// abs (its half-made `.new` files too): a copy is the forget's only when
// namespace_events names it. The next forget makes its own.
func removeUnrecordedCopies(ctx context.Context, w *sql.DB, abs, ns string) error {
	found, err := filepath.Glob(fmt.Sprintf("%s.forgotten-%s-*", abs, ns))
	if err != nil {
		return err
	}
	for _, path := range found {
		base, _, _ := strings.Cut(path, ".new")
		base = strings.TrimSuffix(strings.TrimSuffix(base, "-wal"), "-shm")
		if _, err := strconv.ParseUint(strings.TrimPrefix(base, abs+".forgotten-"+ns+"-"), 10, 64); err != nil {
			continue // not ns's (another namespace's, whose name starts with ns and a dash)
		}
		var recorded bool
		if err := w.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM namespace_events WHERE moved_to = ?)`, base).Scan(&recorded); err != nil {
			return classify(err)
		}
		if !recorded {
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

// copyOut copies namespace id's rows into a new ledger file at path (with
// its settings st), as its default namespace, checks that it ends at head,
// and syncs it.
func copyOut(ctx context.Context, w *sql.DB, path string, id int64, st ledger.NamespaceSettings, head ledger.Head) error {
	o := Options{}
	o.defaults()
	if err := createFile(ctx, path, o.PageSize, st); err != nil {
		return err
	}
	if _, err := w.ExecContext(ctx, `ATTACH DATABASE ? AS out`, path); err != nil {
		return classify(err)
	}
	err := func() error {
		tx, err := w.BeginTx(ctx, nil)
		if err != nil {
			return classify(err)
		}
		defer func() { _ = tx.Rollback() }()
		if err := copyNamespace(ctx, tx, "main", id, "out", defaultID); err != nil {
			return err
		}
		// The inputs shown to approvers are values beside the chain, kept
		// only until their asks are answered (SPEC §13): a namespace given
		// up has no approver left, and its copy keeps none (SPEC §14).
		if _, err := tx.ExecContext(ctx, `DELETE FROM out.ns_approval_inputs`); err != nil {
			return classify(err)
		}
		return classify(tx.Commit())
	}()
	if _, derr := w.ExecContext(context.Background(), `DETACH DATABASE out`); err == nil && derr != nil {
		err = classify(derr)
	}
	if err != nil {
		return err
	}
	// Fold the copy's write-ahead log into it, and check it on its own.
	c, err := sql.Open("sqlite3", dsn(path, "rw", 5*time.Second, 0))
	if err != nil {
		return err
	}
	c.SetMaxOpenConns(1)
	got, err := readTail(ctx, c, chainRef{id: defaultID})
	if err == nil {
		err = checkDerived(ctx, c, chainRef{id: defaultID}, got, "--db "+path)
	}
	if err == nil && got != head {
		err = fmt.Errorf("the copy ends at %d, the namespace at %d", got.Seq, head.Seq)
	}
	if err == nil {
		_, err = c.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`)
	}
	if cerr := c.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if _, err := syncFile(path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}
