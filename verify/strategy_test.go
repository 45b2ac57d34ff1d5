package verify_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/verify"
)

// countingDB counts the chain reads of the reader it wraps. A wrapper
// must offer every method of verify.DB to be one, so wrapping keeps the
// strategy: only the constructor and the run choose it.
type countingDB struct {
	*sqlite.Reader
	bySeq, byKey atomic.Int64
}

func (c *countingDB) Receipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	c.bySeq.Add(1)
	return c.Reader.Receipts(ctx, after, fn)
}

func (c *countingDB) KeyReceipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	c.byKey.Add(1)
	return c.Reader.KeyReceipts(ctx, after, fn)
}

// TestVerifier_Check_strategy checks which reads each run of a database
// makes: a full run reads the chain once, in seq order, and nothing in
// key order; an incremental run reads the keys it touches in key order
// beside the chain; NewKeyOrdered takes the key order on a full run too.
// The three reports agree.
func TestVerifier_Check_strategy(t *testing.T) {
	base, now := buildLedger(t)
	ctx := context.Background()
	rd, err := sqlite.OpenReader(ctx, base, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	opts := verify.Opts{Now: func() time.Time { return now }}
	full, err := verify.New(rd, opts).Check(ctx)
	require.NoError(t, err)
	require.True(t, full.OK, "%+v", full.Violations)

	tests := []struct {
		desc                 string
		verifier             func(db verify.DB) *verify.Verifier
		wantBySeq, wantByKey int64
	}{
		{"OK_fullRun", func(db verify.DB) *verify.Verifier { return verify.New(db, opts) }, 1, 0},
		{"OK_incremental", func(db verify.DB) *verify.Verifier {
			o := opts
			o.Pinned, o.Incremental = &verify.Pin{Seq: 6, Hash: mustHash(t, rd, 6)}, true
			return verify.New(db, o)
		}, 2, 1}, // the pinned receipt is read again first
		{"OK_keyOrdered", func(db verify.DB) *verify.Verifier { return verify.NewKeyOrdered(db, opts) }, 1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			db := &countingDB{Reader: rd}
			rep, err := tc.verifier(db).Check(ctx)
			require.NoError(t, err)
			assert.Equal(t, tc.wantBySeq, db.bySeq.Load(), "reads in seq order")
			assert.Equal(t, tc.wantByKey, db.byKey.Load(), "reads in key order")
			assert.Equal(t, full.Head, rep.Head)
			assert.Equal(t, full.Receipts, rep.Receipts)
			assert.True(t, rep.OK, "%+v", rep.Violations)
		})
	}
}
