package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// testClockEnv names a file holding the time that ledgerd uses instead of
// its clock: the end-to-end tests move it to cross lease ends, key
// lifetimes and the token-existence re-read without waiting. The file
// holds either a time in unix milliseconds (the clock stands still there)
// or "offset N": the real time moved by N milliseconds (the clock runs,
// and the tests jump it forward by raising N). It is deliberately not a
// flag, so that no deployment sets it by accident.
const testClockEnv = "LEDGERD_TEST_CLOCK_FILE"

// testClock returns the clock of LEDGERD_TEST_CLOCK_FILE, or nil (the
// real clock) when it is unset. The file is read at every reading of the
// clock; a file that cannot be read stops the start, and later the last
// time read stays in force.
func testClock() (func() time.Time, error) {
	path := os.Getenv(testClockEnv)
	if path == "" {
		return nil, nil
	}
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
		return nil, fmt.Errorf("%s: %w", testClockEnv, err)
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

// Test hooks that shorten ledgerd's background periods, so that the
// end-to-end tests see a new replica counted or a new namespace served
// without waiting the period out. Each holds a duration (e.g. 10ms).
// Like the clock they are not flags, so that no deployment sets them by
// accident.
const (
	testReplicaCountEnv  = "LEDGERD_TEST_REPLICA_COUNT_EVERY"  // replicaCountEvery
	testNamespaceScanEnv = "LEDGERD_TEST_NAMESPACE_SCAN_EVERY" // namespaceScan
)

// replicaCountEvery is how often ledgerd re-counts the live replicas that
// share the rate limit.
const replicaCountEvery = 2 * time.Second

// testPeriod returns the duration in the environment variable env, or def
// when it is unset.
func testPeriod(env string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(env)
	if v == "" {
		return def, nil
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

// keyTTLMS converts a key lifetime flag to key_ttl_ms: whole milliseconds
// from 0 to ledger.MaxKeyTTL.
func keyTTLMS(d time.Duration) (uint64, error) {
	if d < 0 || d%time.Millisecond != 0 || uint64(d.Milliseconds()) > ledger.MaxKeyTTL {
		return 0, fmt.Errorf("%s is not a whole number of milliseconds from 0 up", d)
	}
	return uint64(d.Milliseconds()), nil
}
