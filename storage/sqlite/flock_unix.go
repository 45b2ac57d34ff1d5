//go:build unix

package sqlite

import (
	"errors"
	"os"
	"syscall"
)

// tryLock takes an exclusive lock on f without waiting: false and no
// error when another open file holds it. The kernel drops it when the
// file is closed or the process dies.
func tryLock(f *os.File) (bool, error) {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return false, nil
	}
	return err == nil, err
}
