package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// DefaultBackupPagesPerStep is how many database pages one step of Backup
// copies (4 MiB at SQLite's default page size).
const DefaultBackupPagesPerStep = 1024

// BackupOptions tune Backup.
type BackupOptions struct {
	// Overwrite lets Backup replace an existing destination file.
	Overwrite bool
	// PagesPerStep is how many pages one step copies; between steps
	// Backup checks its context. Default DefaultBackupPagesPerStep.
	PagesPerStep int
	// Progress, when set, is called after every step with the pages
	// copied so far and the total.
	Progress func(copied, total int)
}

// ErrBackupExists means the destination of a backup already exists and
// BackupOptions.Overwrite is not set. It wraps fs.ErrExist.
var ErrBackupExists = fmt.Errorf("backup destination exists: %w", fs.ErrExist)

// BackupResult describes a finished backup.
type BackupResult struct {
	Path  string      // absolute path of the copy
	Head  ledger.Head // head of the snapshot that was copied
	Pages int         // database pages copied
	Bytes int64       // size of the copy
}

// Backup writes a consistent copy of the ledger at src to dst with SQLite's
// online backup API, while a ledgerd may be writing src. The copy is one
// snapshot: Backup holds a single read transaction on src for the whole
// copy, so receipts appended meanwhile are not in it and the copy never
// restarts. In WAL mode (the way ledgerd runs) a reader never blocks the
// writer; the WAL only cannot be checkpointed past the snapshot until the
// copy is done. Backup takes no lock file and writes nothing to src.
//
// The copy is written to a temporary file in dst's directory, switched to
// a rollback journal (a self-contained single file that also opens on
// read-only media), fsync'd, and then moved to dst: dst is either absent
// or complete. An existing dst is ErrBackupExists unless opts.Overwrite.
// Backup does not verify the copy's chain; run the verifier on it.
func Backup(ctx context.Context, src, dst string, opts BackupOptions) (*BackupResult, error) {
	if opts.PagesPerStep <= 0 {
		opts.PagesPerStep = DefaultBackupPagesPerStep
	}
	if dst == "" {
		return nil, errors.New("backup: empty destination path")
	}
	absDst, err := filepath.Abs(dst)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	dstInfo, err := os.Stat(absDst)
	if err == nil {
		if dstInfo.IsDir() {
			return nil, fmt.Errorf("backup: %s is a directory", absDst)
		}
		if !opts.Overwrite {
			return nil, fmt.Errorf("backup: %s: %w", absDst, ErrBackupExists)
		}
	}
	rd, err := OpenReader(ctx, src, Options{ReadConns: 1}) // checks that src is a ledger
	if err != nil {
		return nil, err
	}
	defer func() { _ = rd.Close() }()
	srcInfo, err := os.Stat(rd.path)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	if dstInfo != nil && os.SameFile(srcInfo, dstInfo) {
		return nil, errors.New("backup: the destination is the ledger itself")
	}

	tmpPattern := "." + filepath.Base(absDst) + ".tmp-*"
	sweepTemporaries(filepath.Dir(absDst), tmpPattern)
	tmpFile, err := os.CreateTemp(filepath.Dir(absDst), tmpPattern)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	tmp := tmpFile.Name()
	// The lock marks the temporary as in use until this call returns; one
	// left unlocked belongs to a backup that was killed.
	_, _ = tryLock(tmpFile)
	defer func() { _ = tmpFile.Close() }()
	done := false
	defer func() {
		if !done {
			removeTemporary(tmp)
		}
	}()

	res := &BackupResult{Path: absDst}
	if err := copyDatabase(ctx, rd, tmp, opts, res); err != nil {
		return nil, fmt.Errorf("backup %s: %w", rd.path, err)
	}
	if err := os.Chmod(tmp, srcInfo.Mode().Perm()); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	if res.Bytes, err = syncFile(tmp); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	if err := moveInto(tmp, absDst, opts.Overwrite); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	done = true
	if err := syncDir(filepath.Dir(absDst)); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	return res, nil
}

// tmpSuffixes are the files of a temporary copy: the file and SQLite's.
var tmpSuffixes = []string{"", "-journal", "-wal", "-shm"}

func removeTemporary(tmp string) {
	for _, suffix := range tmpSuffixes {
		_ = os.Remove(tmp + suffix)
	}
}

// sweepTemporaries removes the temporary copies that earlier backups to
// the same destination left when they were killed: those that no running
// backup holds locked.
func sweepTemporaries(dir, pattern string) {
	found, _ := filepath.Glob(filepath.Join(dir, pattern))
	for _, tmp := range found {
		if strings.HasSuffix(tmp, "-journal") || strings.HasSuffix(tmp, "-wal") || strings.HasSuffix(tmp, "-shm") {
			continue
		}
		f, err := os.Open(tmp)
		if err != nil {
			continue
		}
		if ok, _ := tryLock(f); ok {
			removeTemporary(tmp)
		}
		_ = f.Close()
	}
}

// copyDatabase copies the ledger read by rd into the empty file tmp inside
// one read transaction of rd, and records the snapshot's head in res.
func copyDatabase(ctx context.Context, rd *Reader, tmp string, opts BackupOptions, res *BackupResult) error {
	srcConn, err := rd.r.Conn(ctx)
	if err != nil {
		return fmt.Errorf("source: %w", classify(err))
	}
	defer func() { _ = srcConn.Close() }()
	// One read transaction for the head and every page: the snapshot
	// cannot change under the copy, so SQLite never restarts it.
	if _, err := srcConn.ExecContext(ctx, `BEGIN`); err != nil {
		return fmt.Errorf("source: begin: %w", classify(err))
	}
	defer func() { _, _ = srcConn.ExecContext(context.Background(), `ROLLBACK`) }()
	var hash []byte
	err = srcConn.QueryRowContext(ctx, sqlHead, rd.args()...).Scan(&res.Head.Seq, &hash)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return fmt.Errorf("source: read head: %w", classify(err))
	default:
		if res.Head.Hash, err = chain.HashFromBytes(hash); err != nil {
			return fmt.Errorf("source: read head: %w", err)
		}
	}

	// No journal mode in the DSN: the copy gets a rollback journal below.
	p := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(tmp)
	dst := "file:" + p + "?mode=rw&_synchronous=FULL"
	dstDB, err := sql.Open("sqlite3", dst)
	if err != nil {
		return fmt.Errorf("destination: %w", err)
	}
	defer func() { _ = dstDB.Close() }()
	dstConn, err := dstDB.Conn(ctx)
	if err != nil {
		return fmt.Errorf("destination: %w", err)
	}
	defer func() { _ = dstConn.Close() }()

	err = withBackup(srcConn, dstConn, dst, func(b pageCopier) error { return stepBackup(ctx, b, opts, res) })
	if err != nil {
		return err
	}
	// The pages carry the source's WAL flag; a backup is one file.
	var mode string
	if err := dstConn.QueryRowContext(ctx, `PRAGMA journal_mode=DELETE`).Scan(&mode); err != nil {
		return fmt.Errorf("destination: journal mode: %w", err)
	}
	if mode != "delete" {
		return fmt.Errorf("destination: journal mode is %q, want delete", mode)
	}
	if err := dstConn.Close(); err != nil {
		return fmt.Errorf("destination: %w", err)
	}
	return dstDB.Close()
}

// pageCopier is SQLite's online backup as the driver exposes it
// (withBackup starts one).
type pageCopier interface {
	// Step copies up to n pages; finished is true once every page is
	// copied. A busy or locked source copies none and is no error.
	Step(n int) (finished bool, err error)
	PageCount() int
	Remaining() int
	Finish() error
}

// stepBackup runs the backup b in steps of opts.PagesPerStep pages,
// checking ctx between steps.
func stepBackup(ctx context.Context, b pageCopier, opts BackupOptions, res *BackupResult) error {
	for {
		before := res.Pages
		finished, err := b.Step(opts.PagesPerStep)
		if err != nil {
			_ = b.Finish()
			return fmt.Errorf("step: %w", classify(err))
		}
		total := b.PageCount()
		res.Pages = total - b.Remaining()
		if opts.Progress != nil {
			opts.Progress(res.Pages, total)
		}
		if finished {
			break
		}
		if err := ctx.Err(); err != nil {
			_ = b.Finish()
			return err
		}
		if res.Pages == before {
			time.Sleep(10 * time.Millisecond) // busy or locked: try again shortly
		}
	}
	if err := b.Finish(); err != nil {
		return fmt.Errorf("finish: %w", classify(err))
	}
	return nil
}

// moveInto renames tmp to dst; without overwrite it links instead, so an
// existing dst (even one created meanwhile) is never replaced.
func moveInto(tmp, dst string, overwrite bool) error {
	if overwrite {
		return os.Rename(tmp, dst)
	}
	err := os.Link(tmp, dst)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s: %w", dst, ErrBackupExists)
	}
	if err != nil {
		// A file system without hard links: check, then rename.
		if _, serr := os.Lstat(dst); serr == nil {
			return fmt.Errorf("%s: %w", dst, ErrBackupExists)
		}
		return os.Rename(tmp, dst)
	}
	return os.Remove(tmp)
}

// syncFile fsyncs the file at path and returns its size.
func syncFile(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("fsync %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), f.Close()
}

// syncDir fsyncs a directory, so that a rename in it is durable. Windows
// cannot flush a directory (FlushFileBuffers needs a handle open for
// writing, which a directory's is not); NTFS journals the rename itself.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
