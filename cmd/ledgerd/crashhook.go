package main

import (
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
)

// testCrashEnv names a number N: ledgerd kills itself (SIGKILL, as kill -9
// would) right after its Nth durable COMMIT, before that batch reaches the
// key index. The end-to-end tests use it to prove that a committed key is
// replayed after such a crash, never reserved again. Like the test clock,
// it is deliberately not a flag.
const testCrashEnv = "LEDGERD_TEST_KILL_AFTER_COMMIT"

// testCrashHook returns the hook of LEDGERD_TEST_KILL_AFTER_COMMIT, or nil
// when it is unset.
func testCrashHook() (func(), error) {
	v := os.Getenv(testCrashEnv)
	if v == "" {
		return nil, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		return nil, fmt.Errorf("%s: want a positive number, not %q", testCrashEnv, v)
	}
	var commits atomic.Int64
	return func() {
		if commits.Add(1) == n {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}, nil
}

// testIndexFullEnv names a file: while it exists, every write to the key
// index's files fails with ENOSPC, as on a full disk, so that the
// end-to-end tests can fill the index's disk without mounting one. Like
// the crash hook, it is deliberately not a flag.
const testIndexFullEnv = "LEDGERD_TEST_INDEX_FULL_IF"

// testIndexFault returns the write fault of LEDGERD_TEST_INDEX_FULL_IF,
// or nil when it is unset.
func testIndexFault() func() error {
	path := os.Getenv(testIndexFullEnv)
	if path == "" {
		return nil
	}
	return func() error {
		if _, err := os.Stat(path); err == nil {
			return syscall.ENOSPC
		}
		return nil
	}
}
