package storetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/verify"
)

// ttl is the key lifetime of the namespaces of the key lifetime cases.
const ttl = time.Hour

// RunKeyLifetime runs the cases of SPEC §12 (key_ttl_ms): every row with
// the clock moved, never waited for.
func RunKeyLifetime(t *testing.T, f Factory) {
	t.Run("SucceededKeyExpires", func(t *testing.T) { testSucceededExpires(t, f) })
	t.Run("FailedKeyExpires", func(t *testing.T) { testFailedExpires(t, f) })
	t.Run("UnfinishedKeysNeverExpire", func(t *testing.T) { testUnfinishedNeverExpire(t, f) })
	t.Run("TTLZeroNeverExpires", func(t *testing.T) { testTTLZero(t, f) })
	t.Run("TwoGenerationsInTheAudit", func(t *testing.T) { testGenerationsAudit(t, f) })
}

// ttlNS creates namespace "reports" with the key lifetime ttl.
func ttlNS(t *testing.T, l *ledger.Ledger) *ledger.Namespace {
	t.Helper()
	require.NoError(t, l.CreateNamespace(context.Background(), "reports", ledger.NamespaceSettings{KeyTTL: uint64(ttl.Milliseconds())}))
	return ns(t, l, "reports")
}

// noDrift checks that the stored key record is what the receipts derive.
func noDrift(t *testing.T, n *ledger.Namespace, key string) {
	t.Helper()
	drift, err := auditDB(t, n).KeyDrift(context.Background(), key)
	require.NoError(t, err)
	require.Empty(t, drift)
}

func testSucceededExpires(t *testing.T, f Factory) {
	ctx := context.Background()
	l, clock := open(t, f)
	n := ttlNS(t, l)
	require.Equal(t, uint64(ttl.Milliseconds()), n.KeyTTL())
	list, err := l.Namespaces(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	assert.Equal(t, uint64(0), list[0].KeyTTL, "default keeps keys forever")
	assert.Equal(t, uint64(ttl.Milliseconds()), list[1].KeyTTL)

	r := testkit.MustReserve(t, n, testkit.ReserveReq("daily-report", "exec-1"))
	c := testkit.MustCommit(t, n, testkit.Succeed("daily-report", r.Reservation))
	v := keyView(t, n, "daily-report")
	final := uint64(clock.Now().UnixMilli())
	assert.Equal(t, final+uint64(ttl.Milliseconds()), v.ExpiresAt, "expires_at is the outcome's time plus the TTL")

	clock.Advance(ttl - time.Millisecond)
	rp := testkit.MustReserve(t, n, testkit.ReserveReq("daily-report", "exec-2"))
	require.Equal(t, ledger.StatusReplayed, rp.Status, "one millisecond short of the TTL the key is remembered")
	require.Equal(t, c.Receipt.Seq, rp.Original.Seq)

	clock.Advance(time.Millisecond)
	other := testkit.ReserveReq("daily-report", "exec-3")
	other.Input = json.RawMessage(`{"order":8}`) // the earlier generation's fingerprint does not apply
	nr := testkit.MustReserve(t, n, other)
	require.Equal(t, ledger.StatusReserved, nr.Status, "at the TTL the key is decided as new")
	require.NotNil(t, nr.Renewed)
	assert.Equal(t, rp.Receipt.Seq, nr.Renewed.Seq, "the new generation links to the key's latest receipt (the replay)")
	assert.Equal(t, final+uint64(ttl.Milliseconds())-1, nr.Renewed.RecordedAt)
	assert.False(t, nr.Takeover || nr.Retry)
	got := receipt(t, n, nr.Receipt.Seq)
	assert.Equal(t, rp.Receipt.Seq, got.RefSeq)
	fp, err := ledger.Fingerprint(other.Input)
	require.NoError(t, err)
	stored, err := n.StoredInputHash(context.Background(), fp)
	require.NoError(t, err)
	assert.Equal(t, stored, got.InputHash, "the new generation's own fingerprint (keyed in a committed namespace)")

	v = keyView(t, n, "daily-report")
	assert.Equal(t, ledger.StateReserved, v.State)
	assert.Zero(t, v.ExpiresAt, "a reserved key has no expiry")
	require.Len(t, v.Receipts, 1, "only the current generation")
	assert.Equal(t, nr.Receipt.Seq, v.Receipts[0].Seq)
	all, err := n.Key(ctx, "daily-report", true)
	require.NoError(t, err)
	assert.Len(t, all.Receipts, 4, "history: both generations")

	c2 := testkit.MustCommit(t, n, testkit.Succeed("daily-report", nr.Reservation))
	rp2 := testkit.MustReserve(t, n, other)
	require.Equal(t, ledger.StatusReplayed, rp2.Status, "the new generation dedupes as before")
	assert.Equal(t, c2.Receipt.Seq, rp2.Original.Seq)
	require.Equal(t, ledger.ECodeFingerprintMismatch, reserveCode(n, testkit.ReserveReq("daily-report", "exec-4")),
		"the new generation has the new fingerprint")
	noDrift(t, n, "daily-report")
	verifyClean(t, n, 6)
}

func testFailedExpires(t *testing.T, f Factory) {
	l, clock := open(t, f)
	n := ttlNS(t, l)

	// A non-retryable failure is refused until the TTL, then renewed.
	r := testkit.MustReserve(t, n, testkit.ReserveReq("final-fail", "exec-1"))
	testkit.MustCommit(t, n, testkit.Fail("final-fail", r.Reservation, false))
	clock.Advance(ttl - time.Millisecond)
	require.Equal(t, ledger.ECodeRetryNotAllowed, reserveCode(n, testkit.ReserveReq("final-fail", "exec-2")))
	clock.Advance(time.Millisecond)
	nr := testkit.MustReserve(t, n, testkit.ReserveReq("final-fail", "exec-1")) // the same execution and attempt: a new generation
	require.NotNil(t, nr.Renewed)
	assert.Equal(t, uint64(2), nr.Renewed.Seq)

	// A retryable failure of an idempotent key is retried before the TTL,
	// and renewed (not retried) at it.
	a := testkit.ReserveReq("soft-fail", "exec-1")
	a.Idempotent = true
	r = testkit.MustReserve(t, n, a)
	testkit.MustCommit(t, n, testkit.Fail("soft-fail", r.Reservation, true))
	a.Attempt = i64(2)
	rt := testkit.MustReserve(t, n, a)
	require.True(t, rt.Retry)
	testkit.MustCommit(t, n, testkit.Fail("soft-fail", rt.Reservation, true))
	clock.Advance(ttl)
	a.Attempt = i64(1) // attempts are compared within one generation only
	nr = testkit.MustReserve(t, n, a)
	require.NotNil(t, nr.Renewed)
	assert.False(t, nr.Retry)
	noDrift(t, n, "final-fail")
	noDrift(t, n, "soft-fail")
	verifyClean(t, n, 8)
}

func testUnfinishedNeverExpire(t *testing.T, f Factory) {
	ctx := context.Background()
	l, clock := open(t, f)
	n := ttlNS(t, l)
	testkit.MustReserve(t, n, leased("lost-call", "exec-1", 1000))
	testkit.MustReserve(t, n, leased("long-call", "exec-1", ledger.MaxLeaseMS))
	clock.Advance(2 * ttl)
	require.Equal(t, ledger.ECodeUnsafeResume, reserveCode(n, testkit.ReserveReq("lost-call", "exec-2")),
		"an interrupted key past the TTL still waits for a person")
	v := keyView(t, n, "lost-call")
	assert.Equal(t, ledger.StateInterrupted, v.State)
	assert.Zero(t, v.ExpiresAt)
	require.Equal(t, ledger.ECodeInProgress, reserveCode(n, testkit.ReserveReq("long-call", "exec-2")),
		"a reserved key past the TTL is still in progress")

	// Resolved, the key's TTL runs from the resolve.
	res, err := n.Resolve(ctx, ledger.ResolveRequest{IdempotencyKey: "lost-call", Outcome: chain.OutcomeSucceeded,
		Note: "checked by hand"})
	require.NoError(t, err)
	rp := testkit.MustReserve(t, n, testkit.ReserveReq("lost-call", "exec-3"))
	require.Equal(t, ledger.StatusReplayed, rp.Status)
	assert.Equal(t, res.Receipt.Seq, rp.Original.Seq)
	clock.Advance(ttl)
	nr := testkit.MustReserve(t, n, testkit.ReserveReq("lost-call", "exec-3"))
	require.NotNil(t, nr.Renewed)
	noDrift(t, n, "lost-call")
	verifyClean(t, n, 5)
}

func testTTLZero(t *testing.T, f Factory) {
	_, clock, n := openDefault(t, f)
	require.Zero(t, n.KeyTTL())
	r := testkit.MustReserve(t, n, testkit.ReserveReq("forever-key", "exec-1"))
	testkit.MustCommit(t, n, testkit.Succeed("forever-key", r.Reservation))
	clock.Advance(10 * 365 * ttl)
	rp := testkit.MustReserve(t, n, testkit.ReserveReq("forever-key", "exec-2"))
	require.Equal(t, ledger.StatusReplayed, rp.Status, "with no TTL a key is remembered forever")
	v := keyView(t, n, "forever-key")
	assert.Zero(t, v.ExpiresAt, "no expires_at without a TTL")
	assert.Len(t, v.Receipts, 3)
	verifyClean(t, n, 3)
}

func testGenerationsAudit(t *testing.T, f Factory) {
	ctx := context.Background()
	l, clock := open(t, f)
	n := ttlNS(t, l)
	var finals, renewals []uint64
	for day := range 3 {
		r := testkit.MustReserve(t, n, testkit.ReserveReq("daily-report", "exec-day"))
		if day > 0 {
			require.NotNil(t, r.Renewed)
			renewals = append(renewals, r.Receipt.Seq)
		}
		c := testkit.MustCommit(t, n, testkit.Succeed("daily-report", r.Reservation))
		finals = append(finals, c.Receipt.Seq)
		clock.Advance(ttl)
	}
	verifyClean(t, n, 6)
	rep := audit(t, n, clock.Now)
	require.Len(t, rep.Audit.RenewedKeys, 2)
	for i, rk := range rep.Audit.RenewedKeys {
		assert.Equal(t, "daily-report", rk.Key)
		assert.Equal(t, finals[i], rk.PreviousFinalSeq)
		assert.Equal(t, "succeeded", rk.PreviousOutcome)
		assert.Equal(t, renewals[i], rk.Seq)
	}
	assert.Empty(t, rep.Audit.ReInvocations, "a new generation is not a re-invocation")
	assert.Empty(t, rep.Audit.RuntimeRetries)
	noDrift(t, n, "daily-report")

	// Read with a TTL of 0, the same chain breaks the rule of §4.
	rep, err := verify.New(noTTL{auditDB(t, n)}, verify.Opts{Now: clock.Now}).Check(ctx)
	require.NoError(t, err)
	require.False(t, rep.OK)
	assert.Equal(t, verify.RuleReserveAfterSuccess, rep.Violations[0].Rule)
}

// noTTL is a reader whose key TTL reads 0, as a ledger made before key
// lifetimes would.
type noTTL struct{ verify.DB }

func (noTTL) KeyTTL(context.Context) (uint64, error) { return 0, nil }
