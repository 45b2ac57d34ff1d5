package verify_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
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

// singleAndSpilled verifies db in the single pass with opts, and again
// with a budget of one byte (every key beyond the third is spilled).
func singleAndSpilled(t *testing.T, ctx context.Context, db verify.DB, opts verify.Opts) (single, spilled *verify.Report) {
	t.Helper()
	single, err := verify.New(db, opts).Check(ctx)
	require.NoError(t, err)
	opts.StateBudget = 1
	spilled, err = verify.New(db, opts).Check(ctx)
	require.NoError(t, err)
	return single, spilled
}

// threeWays verifies path in the key-ordered passes, in the single pass
// and in the single pass with a budget of one byte (four slots: every
// key beyond the third is spilled, level after level), and requires the
// three reports to be equal. It returns the report.
func threeWays(t *testing.T, path string, opts verify.Opts) *verify.Report {
	t.Helper()
	ctx := context.Background()
	rd, err := sqlite.OpenReader(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	// The spill files go to TMPDIR and must be gone after each run.
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)

	want, err := verify.NewKeyOrdered(rd, opts).Check(ctx)
	require.NoError(t, err)
	single, spilled := singleAndSpilled(t, ctx, rd, opts)
	assert.Equal(t, want, single, "single pass")
	assert.Equal(t, want, spilled, "single pass, spilled")
	left, err := os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, left, "spill files left behind")
	return want
}

// TestVerifier_singlePassTamper checks that the single seq-ordered pass,
// in memory and spilled to files, reports exactly what the key-ordered
// passes report, on every tampered ledger of testdata/tamper.json.
func TestVerifier_singlePassTamper(t *testing.T) {
	forEachTamper(t, func(t *testing.T, tc tamperCase, path string, opts verify.Opts) {
		rep := threeWays(t, path, opts)
		for _, want := range tc.Want {
			assert.Contains(t, rules(rep), want)
		}
	})
}

// replay reserves a key that succeeded: the ledger records a replay.
func replay(c *calls, key, exec, tool string, n int) {
	c.t.Helper()
	c.clock.Advance(time.Second)
	res, err := c.db.Reserve(context.Background(), ledger.ReserveRequest{IdempotencyKey: key, ExecutionID: exec,
		Tool: tool, Effect: "write", Input: input(n), Idempotent: true})
	require.NoError(c.t, err)
	require.Equal(c.t, ledger.StatusReplayed, res.Status)
}

// TestVerifier_singlePassMixed runs the three ways over a ledger of a few
// hundred keys with every kind of history: successes, replays by the same
// and by other executions, runtime retries, retries after failures,
// takeovers of interrupted reserves, resolutions, keys left reserved or
// interrupted, duplicate effects and repeated failures; then over the
// same ledger with its keys table and receipts edited.
func TestVerifier_singlePassMixed(t *testing.T) {
	c := newCalls(t)
	for i := range 300 {
		key := fmt.Sprintf("key-%04d", i)
		exec := fmt.Sprintf("exec-%04d", i)
		tool := []string{"payments.refund", "email.send", "crm.update"}[i%3]
		switch i % 10 {
		case 0, 1, 2: // success, sometimes on an input another key used
			c.reserve(key, exec, tool, i%40, idempotent())
			c.succeed(key)
		case 3: // success, then replays by the same and another execution
			c.reserve(key, exec, tool, 1000+i, idempotent())
			c.succeed(key)
			replay(c, key, exec, tool, 1000+i)
			replay(c, key, "other-"+exec, tool, 1000+i)
		case 4: // retryable failure, runtime retry, success
			c.reserve(key, exec, tool, 2000+i, idempotent())
			c.fail(key, "TIMEOUT", true)
			c.reserve(key, exec, tool, 2000+i, idempotent(), attempt(2))
			c.succeed(key)
		case 5: // final failure, then the same call under another key
			c.reserve(key, exec, tool, 3000+i, idempotent())
			c.fail(key, "DECLINED", false)
			c.reserve(key+"-again", exec+"-again", tool, 3000+i, idempotent())
		case 6: // interrupted, taken over by a new execution
			c.reserve(key, exec, tool, 4000+i, idempotent(), lease(10))
			c.reserve(key, "new-"+exec, tool, 4000+i, idempotent())
			c.succeed(key)
		case 7: // interrupted, resolved by a person
			c.reserve(key, exec, tool, 5000+i, lease(10))
			c.resolveFailed(key, "NOT_DONE")
		case 8: // left interrupted
			c.reserve(key, exec, tool, 6000+i, lease(10))
		case 9: // left reserved
			c.reserve(key, exec, tool, 7000+i, lease(int64(time.Hour/time.Millisecond)))
		}
	}
	require.NoError(t, c.db.Close())
	now := c.clock.Now()
	opts := verify.Opts{Now: func() time.Time { return now }}
	rep := threeWays(t, c.path, opts)
	require.True(t, rep.OK, "%+v", rep.Violations)
	a := rep.Audit
	for name, n := range map[string]int{"runtime retries": len(a.RuntimeRetries), "re-invocations": len(a.ReInvocations),
		"duplicate effects": len(a.DuplicateEffects), "repeated failures": len(a.RepeatedFailures),
		"interrupted": len(a.Interrupted), "failed": len(a.Failed), "resolutions": len(a.Resolutions)} {
		assert.NotZero(t, n, name)
	}
	threeWays(t, c.path, verify.Opts{Now: func() time.Time { return now }, Filter: verify.AuditFilter{Tool: "email.send", SinceSeq: 200}})

	// Edits: receipts whose rules break (rehashed, so the chain holds).
	// (The file keeps no key state to disagree with them: that is in
	// the key index, which the online checks compare.)
	steps := []struct {
		SQL        string `json:"sql"`
		RehashFrom uint64 `json:"rehash_from"`
	}{
		{SQL: `UPDATE receipts SET tool = 'forged.tool' WHERE seq = 40`},
		{SQL: `UPDATE receipts SET ref_seq = 3 WHERE kind = 'commit' AND seq BETWEEN 100 AND 160`},
		{SQL: `UPDATE receipts SET attempt = 9 WHERE kind = 'reserve' AND seq BETWEEN 300 AND 330`},
		{SQL: `UPDATE receipts SET kind = 'replay' WHERE kind = 'reserve' AND seq BETWEEN 500 AND 520`},
		// attempts past 32 bits, which a slot does not hold
		{SQL: `UPDATE receipts SET attempt = attempt + 8589934592 WHERE seq BETWEEN 600 AND 640`},
		{RehashFrom: 40},
		// seqs 2³³ past the first receipt of their key, which a slot does
		// not hold as an offset (every other receipt from seq 700 on)
		{SQL: `UPDATE receipts SET seq = seq + 8589934592 WHERE seq > 700 AND seq % 2 = 0`},
	}
	tamper(t, c.path, tamperCase{Steps: steps})
	// Every violation listed: the key-ordered pass keeps the first it
	// finds in key order, the single pass the first in seq order.
	all := verify.Opts{Now: func() time.Time { return now }, MaxViolations: 1 << 20}
	rep = threeWays(t, c.path, all)
	require.False(t, rep.OK)
	for _, rule := range []string{verify.RuleFingerprintChanged, verify.RuleCommitWithoutReserve} {
		assert.Contains(t, rules(rep), rule)
	}
	// With fewer slots in the report than violations, the single pass
	// lists the same ones in memory and spilled: the lowest seqs.
	ctx := context.Background()
	rd, err := sqlite.OpenReader(ctx, c.path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	few := verify.Opts{Now: func() time.Time { return now }, MaxViolations: 3}
	single, spilled := singleAndSpilled(t, ctx, rd, few)
	assert.Equal(t, single, spilled)
	require.Len(t, single.Violations, 3)
	assert.Equal(t, rep.Violations[:3], single.Violations)
	assert.Equal(t, rep.ViolationsTotal, single.ViolationsTotal)
}
