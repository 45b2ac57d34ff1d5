//go:build unix

package keyindex

import (
	"io"
	"os"
	"syscall"
)

// lockFile takes an fcntl write lock on f without waiting.
func lockFile(f *os.File) error {
	spec := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart}
	return syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &spec)
}
