package sqlite_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
)

// Clock is a settable test clock.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// T0 is the test clock's start, the SPEC test vector's recorded_at.
var T0 = time.UnixMilli(1764475200000)

// MustOpenDB opens a ledger on a new file in a temp dir with a test clock.
func MustOpenDB(tb testing.TB) (*sqlite.DB, *Clock) {
	tb.Helper()
	clock := &Clock{t: T0}
	path := filepath.Join(tb.TempDir(), "ledger.db")
	db, err := sqlite.Open(context.Background(), path, sqlite.Options{
		Now: clock.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = db.Close() })
	return db, clock
}

func i64(v int64) *int64 { return &v }

// reserveReq is a write request for key by execution exec.
func reserveReq(key, exec string) ledger.ReserveRequest {
	return ledger.ReserveRequest{IdempotencyKey: key, ExecutionID: exec, Tool: "payments.refund",
		Effect: chain.EffectWrite, Input: json.RawMessage(`{"order":7}`)}
}

// mustReserve reserves and fails the test on error.
func mustReserve(tb testing.TB, db *sqlite.DB, req ledger.ReserveRequest) *ledger.ReserveResult {
	tb.Helper()
	res, err := db.Reserve(context.Background(), req)
	require.NoError(tb, err)
	return res
}

// mustCommit commits and fails the test on error.
func mustCommit(tb testing.TB, db *sqlite.DB, req ledger.CommitRequest) *ledger.CommitResult {
	tb.Helper()
	res, err := db.Commit(context.Background(), req)
	require.NoError(tb, err)
	return res
}

func succeed(key, token string) ledger.CommitRequest {
	return ledger.CommitRequest{IdempotencyKey: key, Reservation: token, Outcome: chain.OutcomeSucceeded,
		ExternalRef: "re_1", Result: json.RawMessage(`{"amount": 1200}`)}
}

func fail(key, token string, retryable bool) ledger.CommitRequest {
	return ledger.CommitRequest{IdempotencyKey: key, Reservation: token, Outcome: chain.OutcomeFailed,
		Error: &ledger.FailureDetail{Code: "TIMEOUT", Message: "gateway timed out", Retryable: retryable}}
}

// verifyChain recomputes the whole chain from the file and checks seq
// contiguity, links and hashes.
func verifyChain(tb testing.TB, db *sqlite.DB) []chain.Receipt {
	tb.Helper()
	var all []chain.Receipt
	after := uint64(0)
	for {
		rs, next, err := db.ListReceipts(context.Background(), ledger.ReceiptFilter{After: after, Limit: ledger.MaxPageLimit})
		require.NoError(tb, err)
		all = append(all, rs...)
		if next == nil {
			break
		}
		after = *next
	}
	prev := chain.ZeroHash
	for i, r := range all {
		require.Equal(tb, uint64(i+1), r.Seq, "seq contiguous")
		require.Equal(tb, prev, r.PrevHash, "prev_hash of %d", r.Seq)
		require.NoError(tb, r.Check())
		prev = r.Hash
	}
	h := db.Head()
	require.Equal(tb, uint64(len(all)), h.Seq)
	require.Equal(tb, prev, h.Hash)
	return all
}
