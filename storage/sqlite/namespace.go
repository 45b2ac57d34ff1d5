package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// Creating a namespace makes its file complete under a temporary name,
// moves it into place, and only then registers the name: a namespace the
// registry knows always has a file, and a crash at any point leaves either
// nothing registered (an empty file left in place is taken up by the next
// creation) or the whole namespace.

// CreateNamespace creates namespace ns of the ledger at path, whose keys
// expire after keyTTL ms (0: never), and registers it. It may run beside
// a ledgerd serving the file (it writes only the registry and a new file).
func CreateNamespace(ctx context.Context, path, ns string, keyTTL uint64) error {
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
	rd, err := OpenReader(ctx, abs, Options{}) // checks the schema version
	if err != nil {
		return err
	}
	_ = rd.Close()
	w, err := openRegistryWriter(abs)
	if err != nil {
		return err
	}
	defer func() { _ = w.Close() }()
	if err := ensureRegistry(ctx, w); err != nil {
		return err
	}
	opts := Options{KeyTTL: keyTTL}
	opts.defaults()
	return createNamespace(ctx, w, abs, ns, opts)
}

// openRegistryWriter opens a one-connection writer of the ledger file's
// registry for a command that runs beside (or instead of) ledgerd.
func openRegistryWriter(abs string) (*sql.DB, error) {
	w, err := sql.Open("sqlite3", dsn(abs, "rw", 5*time.Second, DefaultCacheMiB))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", abs, err)
	}
	w.SetMaxOpenConns(1)
	return w, nil
}

// createNamespace creates namespace ns's file, then registers it.
func createNamespace(ctx context.Context, w *sql.DB, abs, ns string, opts Options) error {
	var n int
	if err := w.QueryRowContext(ctx, `SELECT count(*) FROM namespaces WHERE name = ?`, ns).Scan(&n); err != nil {
		return fmt.Errorf("create namespace: %w", classify(err))
	}
	if n == 1 {
		return ledger.ErrNamespaceExists
	}
	path := NamespacePath(abs, ns)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	if err := placeNamespaceFile(ctx, abs, ns, path, opts); err != nil {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	res, err := w.ExecContext(ctx, sqlRegister, ns, time.Now().UnixMilli())
	if err != nil {
		return fmt.Errorf("create namespace: %w", classify(err))
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return ledger.ErrNamespaceExists
	}
	return nil
}

// placeNamespaceFile makes a new ledger file at path, with opts.KeyTTL:
// made beside it and renamed into place. One left there by a creation
// that did not register (it holds no receipt) is replaced, since its
// settings may differ. A file at path that holds receipts is refused: the
// registry does not know it, so it is someone's history (a ledger file
// restored from before the namespace was created, say), not a new
// namespace.
func placeNamespaceFile(ctx context.Context, abs, ns, path string, opts Options) error {
	tmp := path + ".new"
	removeFileSet(tmp)
	if _, err := os.Stat(path); err == nil {
		rd, err := OpenReader(ctx, path, opts)
		if err != nil {
			return err
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
		removeFileSet(path)
	}
	opts.Logger = slog.New(slog.DiscardHandler) // the file is not the namespace's yet
	opts.index = nil                            // nor is the index: its first open syncs it
	fc, err := openFileChain(ctx, tmp, ns, opts)
	if err != nil {
		removeFileSet(tmp)
		return err
	}
	if err := fc.Close(); err != nil {
		removeFileSet(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		removeFileSet(tmp)
		return err
	}
	_ = os.Remove(tmp + ".lock")
	return syncDir(filepath.Dir(path))
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
	// MovedTo is where the namespace's file went, or "" if it was missing.
	MovedTo string
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
	if _, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("forget: %w", err)
	}
	lock, err := acquireLock(abs)
	if err != nil {
		return nil, fmt.Errorf("forget (stop ledgerd first): %w", err)
	}
	defer func() { _ = lock.release() }()
	w, err := openRegistryWriter(abs)
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Close() }()
	if err := ensureRegistry(ctx, w); err != nil {
		return nil, err
	}
	var n int
	if err := w.QueryRowContext(ctx, `SELECT count(*) FROM namespaces WHERE name = ?`, ns).Scan(&n); err != nil {
		return nil, fmt.Errorf("forget: %w", classify(err))
	}
	if n == 0 {
		return nil, ledger.ErrUnknownNamespace
	}
	rec, err := recordedHead(ctx, w, ns)
	if err != nil {
		return nil, err
	}
	res := &ForgetResult{Head: rec}
	if res.MovedTo, err = moveAside(NamespacePath(abs, ns)); err != nil {
		return nil, fmt.Errorf("forget: %w", err)
	}
	if err := recordForget(ctx, w, ns, by, reason, rec, res.MovedTo); err != nil {
		return nil, fmt.Errorf("forget: %w", err)
	}
	if err := dropFromIndex(abs, ns); err != nil {
		return res, fmt.Errorf("forget: recorded, but %w (it is dropped when the name is used again)", err)
	}
	return res, nil
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
func recordForget(ctx context.Context, w *sql.DB, ns, by, reason string, rec ledger.Head, movedTo string) error {
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
