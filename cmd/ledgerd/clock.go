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

// testClockEnv names a file holding the time, in unix milliseconds, that
// ledgerd uses instead of its clock: the end-to-end tests move it to
// cross lease ends and key lifetimes without waiting. It is deliberately
// not a flag, so that no deployment sets it by accident.
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
		ms, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return time.Time{}, err
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

// keyTTLMS converts a key lifetime flag to key_ttl_ms: whole milliseconds
// from 0 to ledger.MaxKeyTTL.
func keyTTLMS(d time.Duration) (uint64, error) {
	if d < 0 || d%time.Millisecond != 0 || uint64(d.Milliseconds()) > ledger.MaxKeyTTL {
		return 0, fmt.Errorf("%s is not a whole number of milliseconds from 0 up", d)
	}
	return uint64(d.Milliseconds()), nil
}
