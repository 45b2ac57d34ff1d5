package keyindex

import (
	"io"
	"io/fs"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// walFS keeps a failure to write Pebble's write-ahead log (<n>.log) from
// reaching Pebble. Pebble rotates its log with its database mutex
// released and panics when closing the old log or creating the new one
// fails; the mutex's deferred unlock then kills the process (a fatal
// error, which no recover catches). So an error writing a log file fails
// the instance, and the write is reported done: nothing reads what the
// failed instance holds afterwards, and the content it loses is what a
// crash would lose, which the watermark accounts for (the next instance
// replays the log up to its damage, or is rebuilt if Pebble finds it
// corrupt). A log file that cannot even be created is a sink. The same
// goes for a sync of the directory, which Pebble makes after creating
// each log (a failed one panics the same way).
type walFS struct {
	vfs.FS
	failed func(error)
}

func isLog(name string) bool { return strings.HasSuffix(name, ".log") }

func (f walFS) Unwrap() vfs.FS { return f.FS }

func (f walFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.Create(name, category)
	return f.wrap(name, file, err)
}

func (f walFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.ReuseForWrite(oldname, newname, category)
	return f.wrap(newname, file, err)
}

func (f walFS) OpenDir(name string) (vfs.File, error) {
	d, err := f.FS.OpenDir(name)
	if err != nil {
		return d, err
	}
	return walDir{File: d, failed: f.failed}, nil
}

// walDir is a directory whose sync errors fail the instance.
type walDir struct {
	vfs.File
	failed func(error)
}

func (d walDir) Sync() error {
	if err := d.File.Sync(); err != nil {
		d.failed(err)
	}
	return nil
}

func (f walFS) wrap(name string, file vfs.File, err error) (vfs.File, error) {
	if !isLog(name) {
		return file, err
	}
	if err != nil {
		f.failed(err)
		return &sinkFile{name: name}, nil
	}
	return walFile{File: file, failed: f.failed}, nil
}

// walFile is a log file whose write errors fail the instance.
type walFile struct {
	vfs.File
	failed func(error)
}

func (w walFile) Write(p []byte) (int, error) {
	if _, err := w.File.Write(p); err != nil {
		w.failed(err)
	}
	return len(p), nil
}

func (w walFile) WriteAt(p []byte, off int64) (int, error) {
	if _, err := w.File.WriteAt(p, off); err != nil {
		w.failed(err)
	}
	return len(p), nil
}

func (w walFile) Preallocate(off, n int64) error {
	if err := w.File.Preallocate(off, n); err != nil {
		w.failed(err)
	}
	return nil
}

func (w walFile) Sync() error {
	if err := w.File.Sync(); err != nil {
		w.failed(err)
	}
	return nil
}

func (w walFile) SyncData() error {
	if err := w.File.SyncData(); err != nil {
		w.failed(err)
	}
	return nil
}

func (w walFile) SyncTo(n int64) (bool, error) {
	full, err := w.File.SyncTo(n)
	if err != nil {
		w.failed(err)
	}
	return full, nil
}

func (w walFile) Close() error {
	if err := w.File.Close(); err != nil {
		w.failed(err)
	}
	return nil
}

// sinkFile is a log file that could not be created: it takes every write
// and holds nothing.
type sinkFile struct {
	name string
	size int64
}

func (s *sinkFile) Close() error                      { return nil }
func (s *sinkFile) Read([]byte) (int, error)          { return 0, io.EOF }
func (s *sinkFile) ReadAt([]byte, int64) (int, error) { return 0, io.EOF }
func (s *sinkFile) Write(p []byte) (int, error) {
	s.size += int64(len(p))
	return len(p), nil
}
func (s *sinkFile) WriteAt(p []byte, off int64) (int, error) {
	s.size = max(s.size, off+int64(len(p)))
	return len(p), nil
}
func (s *sinkFile) Preallocate(int64, int64) error { return nil }
func (s *sinkFile) Stat() (vfs.FileInfo, error)    { return sinkInfo{s}, nil }
func (s *sinkFile) Sync() error                    { return nil }
func (s *sinkFile) SyncTo(int64) (bool, error)     { return true, nil }
func (s *sinkFile) SyncData() error                { return nil }
func (s *sinkFile) Prefetch(int64, int64) error    { return nil }
func (s *sinkFile) Fd() uintptr                    { return vfs.InvalidFd }

type sinkInfo struct{ s *sinkFile }

func (i sinkInfo) Name() string           { return i.s.name }
func (i sinkInfo) Size() int64            { return i.s.size }
func (i sinkInfo) Mode() fs.FileMode      { return 0o644 }
func (i sinkInfo) ModTime() time.Time     { return time.Time{} }
func (i sinkInfo) IsDir() bool            { return false }
func (i sinkInfo) Sys() any               { return nil }
func (i sinkInfo) DeviceID() vfs.DeviceID { return vfs.DeviceID{} }
