package keyindex

import (
	"io"
	"os"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// fence keeps a retired instance off the directory for good. Pebble names
// files by path, and a new instance may use the same directory (or, after
// a corrupt one was moved aside, a new directory of the same name): an
// operation by path of an abandoned instance (deleting an "obsolete"
// MANIFEST-000001, say) would then hit the new instance's files. gate's
// check alone leaves a window, an operation that passed it before the
// instance was abandoned and runs after, so each operation by path holds
// the fence's read lock while it runs, and close takes the write lock:
// once close returns, no such operation is running, and every later one
// blocks for ever.
type fence struct {
	mu   sync.RWMutex
	shut bool
}

// enter waits out close and blocks for ever after it; it returns the
// release of the operation's hold.
func (f *fence) enter() func() {
	f.mu.RLock()
	if f.shut {
		f.mu.RUnlock()
		<-never
	}
	return f.mu.RUnlock
}

// close waits for the operations running and shuts the fence.
func (f *fence) close() {
	f.mu.Lock()
	f.shut = true
	f.mu.Unlock()
}

// fencedFS runs the operations by path of an instance's file system
// inside its fence. Operations on open files need none: their files stay
// the retired instance's, wherever the directory went.
type fencedFS struct {
	vfs.FS
	f *fence
}

func (fs fencedFS) Unwrap() vfs.FS { return fs.FS }

func (fs fencedFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	defer fs.f.enter()()
	return fs.FS.Create(name, category)
}

func (fs fencedFS) Link(oldname, newname string) error {
	defer fs.f.enter()()
	return fs.FS.Link(oldname, newname)
}

func (fs fencedFS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	defer fs.f.enter()()
	return fs.FS.OpenReadWrite(name, category, opts...)
}

func (fs fencedFS) Remove(name string) error {
	defer fs.f.enter()()
	return fs.FS.Remove(name)
}

func (fs fencedFS) RemoveAll(name string) error {
	defer fs.f.enter()()
	return fs.FS.RemoveAll(name)
}

func (fs fencedFS) Rename(oldname, newname string) error {
	defer fs.f.enter()()
	return fs.FS.Rename(oldname, newname)
}

func (fs fencedFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	defer fs.f.enter()()
	return fs.FS.ReuseForWrite(oldname, newname, category)
}

func (fs fencedFS) MkdirAll(dir string, perm os.FileMode) error {
	defer fs.f.enter()()
	return fs.FS.MkdirAll(dir, perm)
}

func (fs fencedFS) Lock(name string) (io.Closer, error) {
	defer fs.f.enter()()
	return fs.FS.Lock(name)
}
