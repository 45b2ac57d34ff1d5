package sqlite

import (
	"context"
	"database/sql"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// Pools exposes the connection pools to the black-box tests.
func (s *Store) Pools() (writer, reader *sql.DB) { return s.main.w, s.main.r }

// DecodeRow exposes the scan's record decoder to the fuzz test.
var DecodeRow = decodeRow

// SetBeforeCommit installs a hook that can fail batches before COMMIT. It
// must be called before the hook can race with the writer: the hook itself
// reads an atomic the test flips.
func (s *Store) SetBeforeCommit(f func() error) { s.main.beforeCommit = f }

// Classify exposes the driver-error classification to the tests.
var Classify = classify

// SQLRepeatedFailures exposes the repeated-failures query to its plan test.
const SQLRepeatedFailures = sqlRepeatedFailures

// SetBackfillChunk sets how many leaves one tree back-fill transaction
// adds and returns a func that restores it.
func SetBackfillChunk(n int) func() {
	old := backfillChunk
	backfillChunk = n
	return func() { backfillChunk = old }
}

// SetIndexFault installs a hook that can fail the index apply after a
// COMMIT.
func (s *Store) SetIndexFault(f func() error) { s.main.indexFault = f }

// IndexStats describes the key index's LSM.
func (s *Store) IndexStats() string { return s.index.Stats() }

// SetIndexRetry sets the bounds of the key index's replay backoff and
// returns a func that restores them.
func SetIndexRetry(lo, hi time.Duration) func() {
	oldLo, oldHi := retryMin, retryMax
	retryMin, retryMax = lo, hi
	return func() { retryMin, retryMax = oldLo, oldHi }
}

// Ready, for the drivers' tests, reports whether the ledger file can be written now: an empty
// write transaction (Ledger.Ready probes through its queue instead).
func (s *Store) Ready(ctx context.Context) error {
	if s.readOnly {
		return ledger.ErrOpenedReadOnly
	}
	return s.main.update(ctx, func(context.Context, ledger.Tx) error { return nil })
}
