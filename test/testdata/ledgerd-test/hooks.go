package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// fileClock returns a clock read from the file at path at every reading.
// The file holds either a time in unix milliseconds (the clock stands
// still there) or "offset N": the real time moved by N milliseconds (the
// clock runs, and the tests jump it forward by raising N). A file that
// cannot be read stops the start; later the last time read stays in
// force, and the clock never goes back.
func fileClock(path string) (func() time.Time, error) {
	read := func() (time.Time, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return time.Time{}, err
		}
		v, offset := strings.CutPrefix(strings.TrimSpace(string(b)), "offset ")
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return time.Time{}, err
		}
		if offset {
			return time.Now().Add(time.Duration(ms) * time.Millisecond), nil
		}
		return time.UnixMilli(ms), nil
	}
	last, err := read()
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	return func() time.Time {
		t, err := read()
		mu.Lock()
		defer mu.Unlock()
		if err == nil && t.After(last) {
			last = t
		}
		return last
	}, nil
}

// killAfterCommit returns an after-commit hook that kills the process
// with SIGKILL at the Nth commit, v holding N.
func killAfterCommit(v string) (func(), error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		return nil, fmt.Errorf("want a positive number, not %q", v)
	}
	var commits atomic.Int64
	return func() {
		if commits.Add(1) == n {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}, nil
}

// fullIf returns an index write fault: ENOSPC while the file at path
// exists.
func fullIf(path string) func() error {
	return func() error {
		if _, err := os.Stat(path); err == nil {
			return syscall.ENOSPC
		}
		return nil
	}
}

// period returns the duration in the environment variable env, or 0 (the
// default period) when it is unset.
func period(env string) (time.Duration, error) {
	v := os.Getenv(env)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err == nil && d <= 0 {
		err = fmt.Errorf("%s is not positive", d)
	}
	if err != nil {
		return 0, fmt.Errorf("%s: %w", env, err)
	}
	return d, nil
}

// killAt returns a prune-step hook that kills the process with SIGKILL
// right after step v: a step name, or batch-N for the Nth deletion batch.
func killAt(v string) func(string) {
	var batches atomic.Int64
	return func(step string) {
		if step == "batch" {
			step = fmt.Sprintf("batch-%d", batches.Add(1))
		}
		if step == v {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
}
