package sqlite

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrLocked means another process has the ledger open for writing. Two
// writers could fork the chain, so OpenStore refuses.
var ErrLocked = errors.New("the ledger is already open for writing by another process")

// lockFile holds an exclusive flock on "<db>.lock" for the life of a writing Store.
// The kernel drops it when the process dies, even on kill -9, so a crash
// never leaves a stale lock behind.
type lockFile struct{ f *os.File }

func acquireLock(dbPath string) (*lockFile, error) {
	path := dbPath + ".lock"
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if ok, err := tryLock(f); !ok {
		holder := ""
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid := strings.TrimSpace(string(b)); pid != "" {
				holder = " (pid " + pid + ")"
			}
		}
		_ = f.Close()
		if err == nil {
			return nil, fmt.Errorf("%w%s: %s", ErrLocked, holder, dbPath)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &lockFile{f: f}, nil
}

func (l *lockFile) release() error {
	// The file stays: removing it could let a third process lock a new
	// inode while a second one still waits on the old.
	return l.f.Close()
}
