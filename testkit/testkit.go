// Package testkit is the driver-free base of the test kits kept under
// testkit/: the fixed epoch T0, a settable clock starting there, and the
// requests tests send. Every package's tests use these, the drivers'
// conformance suite (testkit/storetest) among them; beside it
// testkit/ledgertest opens a ledger over SQLite, testkit/pgtest gives a
// PostgreSQL database, testkit/testwitness a witness, testkit/openapicheck
// checks exchanges against the OpenAPI document, and testkit/gen writes
// large ledgers for benchmarks. No product package imports a test kit.
package testkit

import (
	"bytes"
	"encoding/json"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// T0 is the fixed epoch of the tests, in unix milliseconds
// (2025-11-30T04:00:00Z): the SPEC test vector's recorded_at, and where
// every Clock starts. It is untyped, so it serves as an int64, a uint64
// or, through time.UnixMilli, a time.
const T0 = 1764475200000

// Clock is a settable test clock, safe for concurrent use. Tests hand its
// Now to the code under test and move it with Advance or Set.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock stopped at T0.
func NewClock() *Clock { return &Clock{t: time.UnixMilli(T0)} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock by d (back when d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// ReserveReq is a write request for key by execution exec.
func ReserveReq(key, exec string) ledger.ReserveRequest {
	return ledger.ReserveRequest{IdempotencyKey: key, ExecutionID: exec, Tool: "payments.refund",
		Effect: chain.EffectWrite, Input: json.RawMessage(`{"order":7}`)}
}

// Succeed is a successful outcome of key's reservation token.
func Succeed(key, token string) ledger.CommitRequest {
	return ledger.CommitRequest{IdempotencyKey: key, Reservation: token, Outcome: chain.OutcomeSucceeded,
		ExternalRef: "re_1", Result: json.RawMessage(`{"amount": 1200}`)}
}

// Fail is a failed outcome of key's reservation token.
func Fail(key, token string, retryable bool) ledger.CommitRequest {
	return ledger.CommitRequest{IdempotencyKey: key, Reservation: token, Outcome: chain.OutcomeFailed,
		Error: &ledger.FailureDetail{Code: "TIMEOUT", Message: "gateway timed out", Retryable: retryable}}
}

// Buffer is a bytes.Buffer that goroutines may share: the log
// destination of a server or an index under test.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// CopyFile copies the file src, such as a closed ledger's (no WAL left
// behind), to dst.
func CopyFile(tb testing.TB, src, dst string) {
	tb.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		tb.Fatal(err)
	}
}
