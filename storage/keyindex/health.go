package keyindex

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// Pebble does not survive every failure of its disk: a failed write of
// its log panics in the committing goroutine (with its commit pipeline's
// lock held, so that the database can never be closed), a failed commit
// calls its Logger's Fatalf, a failed flush is retried at once, forever,
// logging each time, and on-disk corruption calls Fatalf from the reading
// goroutine. The index is derived, so none of this may stop the process:
//
//   - Fatalf, the corruption and the background-error events do not
//     panic: they mark the instance (the open Pebble database) failed;
//   - every call into Pebble goes through use, which refuses a failed
//     instance, turns a panic into an error (recover, the last resort)
//     and marks the instance failed when Pebble reports corruption or an
//     error of the disk, or any error while writing;
//   - a failed instance is retired in the background once no call is in
//     it: closed, or, when Pebble cannot close it (its commit lock is
//     lost), abandoned — every file operation it attempts from then on
//     blocks forever, so that it can neither spin nor touch the directory
//     a new instance uses;
//   - Repair opens a new instance (after moving a corrupt directory
//     aside), and Gen tells the driver that the index changed under it,
//     so that every namespace is replayed from its watermark.

// ErrUnusable: the index cannot be used until Repair succeeds. It wraps
// the cause, which errors.Is finds.
var ErrUnusable = errors.New("the key index is unusable")

// ErrCorrupt marks an error caused by a corrupt index file (Pebble's
// corruption errors, which errors.Is does not find as such).
var ErrCorrupt = errors.New("the key index is corrupt")

// ErrNoSpace: the index's file system has less free space than the index
// keeps in reserve (MinFreeBytes); nothing was written.
var ErrNoSpace = fmt.Errorf("not enough free space for the key index: %w", syscall.ENOSPC)

// instance is one open Pebble database of the index.
type instance struct {
	db      *pebble.DB
	gate    *gate
	refs    atomic.Int64
	fault   atomic.Pointer[fault]
	ready   chan struct{} // closed once pebble.Open has returned (db set, or the open failed)
	failed  chan struct{} // closed when the instance fails
	retired chan struct{} // closed once the instance is closed or abandoned
	retire  sync.Once
}

type fault struct {
	err      error
	corrupt  bool
	panicked bool // Pebble panicked in a write: its commit lock is lost, Close would wait forever
}

func (f *fault) error() error {
	if f.corrupt {
		return fmt.Errorf("%w: %w: %w", ErrUnusable, ErrCorrupt, f.err)
	}
	return fmt.Errorf("%w: %w", ErrUnusable, f.err)
}

// gate is the error injector of an instance's file system: it blocks
// every operation of an abandoned instance, and injects the test fault
// (Options.WriteFault) into writes.
type gate struct {
	dead  atomic.Bool
	fault func() error
	fence fence
}

// abandon blocks every later file operation of the instance, and waits
// for the operations by path that are running (fence).
func (g *gate) abandon() {
	g.dead.Store(true)
	g.fence.close()
}

var never = make(chan struct{})

func (g *gate) String() string { return "key index gate" }

func (g *gate) MaybeError(op errorfs.Op) error {
	if g.dead.Load() {
		<-never // an abandoned instance: it must not touch the directory again
	}
	if g.fault != nil && op.Kind.ReadOrWrite() == errorfs.OpIsWrite &&
		op.Kind != errorfs.OpRemove && op.Kind != errorfs.OpRemoveAll && op.Kind != errorfs.OpFileClose {
		if err := g.fault(); err != nil {
			return &os.PathError{Op: "write", Path: op.Path, Err: err}
		}
	}
	return nil
}

// indexFS is the instance's file system. Its Lock takes the directory's
// LOCK file without Pebble's in-process registry, which would refuse a
// new instance while an abandoned one holds it; the driver's lock file
// (and the fcntl lock here) keep other processes out.
type indexFS struct{ *errorfs.FS }

func (f indexFS) Unwrap() vfs.FS { return f.FS }

func (f indexFS) Lock(name string) (io.Closer, error) {
	l, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := lockFile(l); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	return l, nil
}

// use runs f on the current instance. write says f writes: then any
// error of f, or a failure Pebble reported while f ran (Fatalf returns),
// fails the instance, since Pebble's commit pipeline may be left stuck.
func (ix *Index) use(write bool, f func(db *pebble.DB) error) error {
	return ix.useIn(ix.cur.Load(), write, f)
}

// useIn is use on instance in.
func (ix *Index) useIn(in *instance, write bool, f func(db *pebble.DB) error) (err error) {
	if in == nil {
		return ix.unopened()
	}
	if ft := in.fault.Load(); ft != nil {
		return ft.error()
	}
	in.refs.Add(1)
	defer in.refs.Add(-1)
	if ft := in.fault.Load(); ft != nil { // failed since: retire may be waiting for refs
		return ft.error()
	}
	defer func() {
		if r := recover(); r != nil {
			perr, ok := r.(error)
			if !ok {
				perr = fmt.Errorf("%v", r)
			}
			ix.logger.Error("a call into the key index panicked", "component", "key index", "panic", perr,
				"stack", string(debug.Stack()))
			err = ix.failWith(in, &fault{err: fmt.Errorf("pebble panicked: %w", perr), panicked: write}).error()
		}
	}()
	if write {
		ix.cmu.Lock()
		defer ix.cmu.Unlock()
		if err := ix.checkSpace(); err != nil {
			return err
		}
	}
	err = f(in.db)
	var cb errCallback
	switch {
	case errors.As(err, &cb):
		return err // the caller's: unwrapCallback takes it out
	case err != nil && (write || pebble.IsCorruptionError(err) || isDiskError(err)):
		return ix.fail(in, err).error()
	case err == nil && write:
		if ft := in.fault.Load(); ft != nil {
			return ft.error()
		}
	}
	return err
}

// unopened is the error of an index whose first open failed.
func (ix *Index) unopened() error {
	if ft := ix.openFault.Load(); ft != nil {
		return ft.error()
	}
	return fmt.Errorf("%w: not open", ErrUnusable)
}

// fail marks in failed (the first cause stays) and retires it in the
// background. It returns the fault in holds.
func (ix *Index) fail(in *instance, err error) *fault {
	return ix.failWith(in, &fault{err: err})
}

func (ix *Index) failWith(in *instance, ft *fault) *fault {
	err := ft.err
	ft.corrupt = pebble.IsCorruptionError(err) || errors.Is(err, ErrCorrupt)
	if in.fault.CompareAndSwap(nil, ft) {
		close(in.failed)
		ix.logger.Error("the key index failed; it takes no reads or writes until it is reopened",
			"component", "key index", "index", ix.dir, "corrupt", ft.corrupt, "err", err)
		in.retire.Do(func() { go ix.retireInstance(in) })
		return ft
	}
	if cur := in.fault.Load(); !cur.corrupt && ft.corrupt {
		in.fault.Store(ft) // corruption decides what Repair does
		return ft
	}
	return in.fault.Load()
}

// closeWait bounds how long retiring waits for Pebble's Close before it
// abandons the instance.
var closeWait = 5 * time.Second

// retireInstance closes a failed instance once no call is in it, or
// abandons it when Pebble cannot close it.
func (ix *Index) retireInstance(in *instance) {
	defer close(in.retired)
	<-in.ready
	if in.db == nil {
		return // the open failed
	}
	for start, warned := time.Now(), false; in.refs.Load() > 0; time.Sleep(5 * time.Millisecond) {
		if !warned && time.Since(start) > 10*time.Second {
			warned = true
			ix.logger.Warn("a call into the failed key index has not returned", "component", "key index", "index", ix.dir)
		}
	}
	if ft := in.fault.Load(); ft != nil && ft.panicked {
		in.gate.abandon()
		ix.logger.Warn("abandoning the failed key index, which cannot be closed (its memory stays until the process ends)",
			"component", "key index", "index", ix.dir)
		return
	}
	done := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("close panicked: %v", r)
			}
		}()
		done <- in.db.Close()
	}()
	select {
	case err := <-done:
		if err != nil {
			ix.logger.Debug("closing the failed key index", "component", "key index", "err", err)
		}
		in.gate.abandon() // closed: nothing of it may touch the directory again
	case <-time.After(closeWait):
		in.gate.abandon()
		ix.logger.Warn("the failed key index cannot be closed; abandoning it (its memory stays until the process ends)",
			"component", "key index", "index", ix.dir)
	}
}

// Gen counts the instances opened: it changes when Repair reopens the
// index, whose content is then what was durable (or nothing, after a
// corrupt index was moved aside), so every namespace must be synced again.
func (ix *Index) Gen() uint64 { return ix.gen.Load() }

// Err returns why the index is unusable, or nil when it is usable.
func (ix *Index) Err() error {
	in := ix.cur.Load()
	if in == nil {
		return ix.unopened()
	}
	if ft := in.fault.Load(); ft != nil {
		return ft.error()
	}
	return nil
}

// Repair reopens an unusable index: after the failed instance is retired
// it opens the directory again, or, when the failure was corruption, moves
// the directory aside (<dir>.unreadable-<unix ms>, logged) and makes a new
// one. It returns nil at once for a usable index, and ErrNoSpace (without
// opening Pebble) while the file system lacks MinFreeBytes beside the
// logs the open replays. The caller must then sync every namespace again
// (Gen).
func (ix *Index) Repair() error {
	ix.repairMu.Lock()
	defer ix.repairMu.Unlock()
	in := ix.cur.Load()
	corrupt := false
	if in != nil {
		ft := in.fault.Load()
		if ft == nil {
			return nil
		}
		select {
		case <-in.retired:
		case <-time.After(closeWait + time.Second):
			return fmt.Errorf("%w: the failed instance is still closing", ErrUnusable)
		}
		corrupt = in.fault.Load().corrupt
	} else if ft := ix.openFault.Load(); ft != nil {
		corrupt = ft.corrupt
	}
	if corrupt {
		aside, err := MoveAside(ix.dir)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUnusable, err)
		}
		ix.logger.Error("the key index is corrupt; moved it aside and rebuilding it from the receipts",
			"component", "key index", "index", ix.dir, "moved_to", aside)
	}
	next, err := ix.openInstance()
	if err != nil {
		ix.openFault.Store(&fault{err: err, corrupt: pebble.IsCorruptionError(err) || errors.Is(err, ErrCorrupt) ||
			errors.Is(err, ErrFormat)})
		ix.cur.Store(nil)
		return fmt.Errorf("%w: reopen: %w", ErrUnusable, err)
	}
	ix.openFault.Store(nil)
	ix.cur.Store(next)
	ix.gen.Add(1)
	ix.logger.Info("key index reopened", "component", "key index", "index", ix.dir)
	return nil
}

// MoveAside renames the index directory dir to <dir>.unreadable-<unix
// ms>, which it returns; nothing is deleted.
func MoveAside(dir string) (string, error) {
	aside := fmt.Sprintf("%s.unreadable-%d", dir, time.Now().UnixMilli())
	if err := os.Rename(dir, aside); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("move the key index aside: %w", err)
	}
	return aside, nil
}

// checkOpenSpace returns ErrNoSpace when the index's file system lacks
// MinFreeBytes beside the logs an open replays and flushes: Pebble's open
// waits for that flush, retried at once and forever when it fails.
func (ix *Index) checkOpenSpace() error {
	if ix.minFree == 0 || ix.o.ReadOnly {
		return nil
	}
	want := ix.minFree
	if logs, err := filepathGlob(ix.dir); err == nil {
		for _, f := range logs {
			if fi, err := os.Stat(f); err == nil {
				want += uint64(fi.Size())
			}
		}
	}
	u, err := ix.diskUsage()
	if err != nil {
		return nil // cannot tell: let the open find out
	}
	if u.AvailBytes < want {
		return fmt.Errorf("%w (%d bytes free, %d wanted to open it)", ErrNoSpace, u.AvailBytes, want)
	}
	return nil
}

// diskUsage is the usage of the index's file system (its parent
// directory's while it does not exist).
func (ix *Index) diskUsage() (vfs.DiskUsage, error) {
	u, err := vfs.Default.GetDiskUsage(ix.dir)
	if err != nil {
		u, err = vfs.Default.GetDiskUsage(filepath.Dir(ix.dir))
	}
	return u, err
}

// checkSpace returns ErrNoSpace when the index's file system has less
// than MinFreeBytes free. Pebble fails badly on a full disk (see above);
// keeping a reserve lets most full disks stop the index before Pebble
// meets one.
func (ix *Index) checkSpace() error {
	if ix.minFree == 0 {
		return nil
	}
	now := time.Now().UnixNano()
	if now < ix.spaceOKUntil.Load() {
		return nil
	}
	u, err := ix.diskUsage()
	if err != nil {
		return nil // cannot tell: let the write find out
	}
	if u.AvailBytes < ix.minFree {
		return fmt.Errorf("%w (%d bytes free, %d wanted)", ErrNoSpace, u.AvailBytes, ix.minFree)
	}
	if u.AvailBytes >= 4*ix.minFree {
		ix.spaceOKUntil.Store(now + int64(100*time.Millisecond)) // plenty: look again in a while
	}
	return nil
}

// IsDiskError reports whether err is an error of the disk under the index
// (full, over quota, read-only, I/O error), which Repair may cure once the
// disk is back, rather than of its content.
func IsDiskError(err error) bool { return isDiskError(err) }

func isDiskError(err error) bool {
	for _, e := range []error{syscall.ENOSPC, syscall.EDQUOT, syscall.EROFS, syscall.EIO} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// pebbleLogger sends Pebble's messages to slog: its routine notices at
// debug level, its errors as errors, at most one a few seconds for each
// message (a failing flush is retried at once, forever). Fatalf does not
// panic: it fails the instance.
type pebbleLogger struct {
	ix *Index
	in *instance
}

func (p pebbleLogger) Infof(format string, args ...any) {
	p.ix.logger.Debug(fmt.Sprintf(format, args...), "component", "key index")
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	if n, ok := p.ix.limit.allow(format); ok {
		p.ix.logger.Error(fmt.Sprintf(format, args...), "component", "key index", "repeats_suppressed", n)
	}
}

func (p pebbleLogger) Fatalf(format string, args ...any) {
	p.ix.fail(p.in, fmt.Errorf("pebble: %s", fmt.Sprintf(format, args...)))
}

// events are Pebble's event handlers: corruption and background errors
// fail the instance instead of calling Fatalf or being retried in a loop
// that logs each time.
func (ix *Index) events(in *instance) *pebble.EventListener {
	return &pebble.EventListener{
		DataCorruption: func(info pebble.DataCorruptionInfo) {
			ix.fail(in, fmt.Errorf("%w: %s", ErrCorrupt, info))
		},
		BackgroundError: func(err error) {
			if errors.Is(err, pebble.ErrCancelledCompaction) {
				return
			}
			if in.fault.Load() != nil {
				// Pebble retries a failed flush at once: slow it down
				// until the instance is retired.
				time.Sleep(time.Second)
				return
			}
			ix.fail(in, fmt.Errorf("background: %w", err))
		},
	}
}

// limiter lets through one message of each kind every few seconds.
type limiter struct {
	mu    sync.Mutex
	every time.Duration
	seen  map[string]*limited
}

type limited struct {
	last       time.Time
	suppressed int
}

func (l *limiter) allow(kind string) (suppressed int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]*limited{}
	}
	s := l.seen[kind]
	if s == nil {
		if len(l.seen) > 256 {
			clear(l.seen)
		}
		s = &limited{}
		l.seen[kind] = s
	}
	if !s.last.IsZero() && time.Since(s.last) < l.every {
		s.suppressed++
		return 0, false
	}
	n := s.suppressed
	s.last, s.suppressed = time.Now(), 0
	return n, true
}

// filepathGlob lists the log files of the index in dir.
func filepathGlob(dir string) ([]string, error) { return filepath.Glob(filepath.Join(dir, "*.log")) }
