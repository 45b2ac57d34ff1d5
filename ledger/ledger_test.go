package ledger_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
)

// TestNamespace_Reserve walks every row of the SPEC §4 reserve table.
func TestNamespace_Reserve(t *testing.T) {
	for _, tt := range []struct {
		desc string
		// setup brings key into a state; it returns the seq the new
		// receipt must reference.
		setup      reserveSetup
		req        func(r ledger.ReserveRequest) ledger.ReserveRequest
		wantErr    string
		wantStatus string
		wantKind   string // appended receipt kind, "" for none
	}{
		{
			desc:       "none effect is not recorded",
			req:        func(r ledger.ReserveRequest) ledger.ReserveRequest { r.Effect = chain.EffectNone; return r },
			wantStatus: ledger.StatusNotRecorded,
		},
		{
			desc:       "read effect is not recorded",
			req:        func(r ledger.ReserveRequest) ledger.ReserveRequest { r.Effect = chain.EffectRead; return r },
			wantStatus: ledger.StatusNotRecorded,
		},
		{
			desc:       "new key",
			wantStatus: ledger.StatusReserved, wantKind: chain.KindReserve,
		},
		{
			desc:    "key reused with another tool",
			setup:   reservedBy(false),
			req:     func(r ledger.ReserveRequest) ledger.ReserveRequest { r.Tool = "payments.charge"; return r },
			wantErr: ledger.ECodeFingerprintMismatch,
		},
		{
			desc:    "key reused with another effect",
			setup:   reservedBy(false),
			req:     func(r ledger.ReserveRequest) ledger.ReserveRequest { r.Effect = chain.EffectExternal; return r },
			wantErr: ledger.ECodeFingerprintMismatch,
		},
		{
			desc:  "key reused with another input",
			setup: reservedBy(false),
			req: func(r ledger.ReserveRequest) ledger.ReserveRequest {
				r.Input = json.RawMessage(`{"order":8}`)
				return r
			},
			wantErr: ledger.ECodeFingerprintMismatch,
		},
		{
			desc: "input given where the stored input_hash is empty",
			setup: func(t *testing.T, db *ledgertest.DB, _ *testkit.Clock) uint64 {
				r := testkit.ReserveReq(key, "exec-1")
				r.Input = nil
				ledgertest.MustReserve(t, db, r)
				return 0
			},
			wantErr: ledger.ECodeFingerprintMismatch,
		},
		{
			desc:       "succeeded key is replayed",
			setup:      committedBy(false, testkit.Succeed, true),
			req:        func(r ledger.ReserveRequest) ledger.ReserveRequest { r.ExecutionID = "exec-2"; return r },
			wantStatus: ledger.StatusReplayed, wantKind: chain.KindReplay,
		},
		{
			desc:       "replay without input still matches (empty input_hash matches any)",
			setup:      committedBy(false, testkit.Succeed, true),
			req:        func(r ledger.ReserveRequest) ledger.ReserveRequest { r.Input = nil; return r },
			wantStatus: ledger.StatusReplayed, wantKind: chain.KindReplay,
		},
		{
			desc:    "reserved key is in progress",
			setup:   reservedBy(false),
			wantErr: ledger.ECodeInProgress,
		},
		{
			desc:       "interrupted idempotent key is taken over",
			setup:      lapsedBy(true, true),
			req:        func(r ledger.ReserveRequest) ledger.ReserveRequest { r.ExecutionID = "exec-2"; return r },
			wantStatus: ledger.StatusReserved, wantKind: chain.KindReserve,
		},
		{
			desc:  "interrupted non-idempotent key needs a person",
			setup: lapsedBy(false, false),
			req: func(r ledger.ReserveRequest) ledger.ReserveRequest {
				r.ExecutionID, r.Idempotent = "exec-2", true // cannot change the stored flag
				return r
			},
			wantErr: ledger.ECodeUnsafeResume,
		},
		{
			desc:       "failed retryable idempotent key is retried",
			setup:      committedBy(true, failing(true), true),
			req:        func(r ledger.ReserveRequest) ledger.ReserveRequest { r.Attempt = i64(2); return r },
			wantStatus: ledger.StatusReserved, wantKind: chain.KindReserve,
		},
		{
			desc:    "failed non-retryable key is not retried",
			setup:   committedBy(true, failing(false), false),
			req:     func(r ledger.ReserveRequest) ledger.ReserveRequest { r.Attempt = i64(2); return r },
			wantErr: ledger.ECodeRetryNotAllowed,
		},
		{
			desc:    "failed retryable key not declared idempotent is not retried",
			setup:   committedBy(false, failing(true), false),
			req:     func(r ledger.ReserveRequest) ledger.ReserveRequest { r.Attempt, r.Idempotent = i64(2), true; return r },
			wantErr: ledger.ECodeRetryNotAllowed,
		},
		{
			desc: "retry by the same execution without a higher attempt",
			setup: func(t *testing.T, db *ledgertest.DB, _ *testkit.Clock) uint64 {
				r := testkit.ReserveReq(key, "exec-1")
				r.Idempotent, r.Attempt = true, i64(3)
				res := ledgertest.MustReserve(t, db, r)
				ledgertest.MustCommit(t, db, testkit.Fail(key, res.Reservation, true))
				return 0
			},
			req:     func(r ledger.ReserveRequest) ledger.ReserveRequest { r.Attempt = i64(3); return r },
			wantErr: ledger.ECodeAttemptConflict,
		},
		{
			desc:    "takeover by the same execution without a higher attempt",
			setup:   lapsedBy(true, false),
			wantErr: ledger.ECodeAttemptConflict,
		},
		{
			desc:       "retry by a new execution (re-invocation) at attempt 1",
			setup:      committedBy(true, failing(true), true),
			req:        func(r ledger.ReserveRequest) ledger.ReserveRequest { r.ExecutionID = "exec-2"; return r },
			wantStatus: ledger.StatusReserved, wantKind: chain.KindReserve,
		},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			db := ledgertest.Open(t)
			clock := db.Clock
			var wantRef uint64
			if tt.setup != nil {
				wantRef = tt.setup(t, db, clock)
			}
			before := db.Head()
			req := testkit.ReserveReq(key, "exec-1")
			if tt.req != nil {
				req = tt.req(req)
			}
			res, err := db.Reserve(context.Background(), req)
			after := db.Head()
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Equal(t, tt.wantErr, ledger.ErrorCode(err), "code; err=%v", err)
				assert.Equal(t, before, after, "an error appends nothing")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantStatus, res.Status)
			if tt.wantKind == "" {
				assert.Equal(t, before, after, "nothing appended")
				assert.Zero(t, res.Receipt.Seq)
				return
			}
			require.Equal(t, before.Seq+1, after.Seq, "one receipt appended")
			assert.Equal(t, after.Seq, res.Receipt.Seq)
			assert.Equal(t, after.Hash, res.Receipt.Hash)
			r, err := db.GetReceipt(context.Background(), res.Receipt.Seq)
			require.NoError(t, err)
			assert.Equal(t, tt.wantKind, r.Kind)
			assert.Equal(t, wantRef, r.RefSeq, "ref_seq")
			assert.Equal(t, req.ExecutionID, r.ExecutionID, "caller's execution")
			ledgertest.VerifyChain(t, db)
		})
	}
}

// reserveSetup brings key into a state for a case of
// TestNamespace_Reserve and returns the seq the case's receipt must
// reference (0: none).
type reserveSetup func(t *testing.T, db *ledgertest.DB, clock *testkit.Clock) uint64

// reserveKey reserves key for exec-1, idempotent or not.
func reserveKey(t *testing.T, db *ledgertest.DB, idempotent bool) *ledger.ReserveResult {
	t.Helper()
	r := testkit.ReserveReq(key, "exec-1")
	r.Idempotent = idempotent
	return ledgertest.MustReserve(t, db, r)
}

// reservedBy is the setup of a key left reserved by exec-1; the case
// references nothing.
func reservedBy(idempotent bool) reserveSetup {
	return func(t *testing.T, db *ledgertest.DB, _ *testkit.Clock) uint64 {
		reserveKey(t, db, idempotent)
		return 0
	}
}

// lapsedBy is the setup of a key whose reservation by exec-1 outlived its
// lease; the case references that reserve when ref.
func lapsedBy(idempotent, ref bool) reserveSetup {
	return func(t *testing.T, db *ledgertest.DB, clock *testkit.Clock) uint64 {
		res := reserveKey(t, db, idempotent)
		clock.Advance(time.Minute)
		return refSeq(ref, res.Receipt.Seq)
	}
}

// committedBy is the setup of a key reserved by exec-1 and committed with
// the request commit makes; the case references the commit when ref.
func committedBy(idempotent bool, commit func(key, token string) ledger.CommitRequest, ref bool) reserveSetup {
	return func(t *testing.T, db *ledgertest.DB, _ *testkit.Clock) uint64 {
		res := reserveKey(t, db, idempotent)
		return refSeq(ref, ledgertest.MustCommit(t, db, commit(key, res.Reservation)).Receipt.Seq)
	}
}

// failing is testkit.Fail as committedBy's commit.
func failing(retryable bool) func(key, token string) ledger.CommitRequest {
	return func(key, token string) ledger.CommitRequest { return testkit.Fail(key, token, retryable) }
}

// openLapsed opens a ledger where key's reservation by exec-1 (idempotent
// or not) outlived its lease, and returns it with that reservation.
func openLapsed(t *testing.T, idempotent bool) (*ledgertest.DB, *ledger.ReserveResult) {
	t.Helper()
	db := ledgertest.Open(t)
	res := reserveKey(t, db, idempotent)
	db.Clock.Advance(time.Minute)
	return db, res
}

// refSeq is seq when ref, else 0.
func refSeq(ref bool, seq uint64) uint64 {
	if ref {
		return seq
	}
	return 0
}

func TestNamespace_Reserve_details(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		db := ledgertest.Open(t)
		res := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		assert.Equal(t, key, res.IdempotencyKey)
		assert.False(t, res.KeyGenerated)
		assert.True(t, strings.HasPrefix(res.Reservation, "rsv_"))
		assert.GreaterOrEqual(t, len(res.Reservation), 4+32, "token carries at least 128 bits")
		assert.Equal(t, uint64(1), res.Attempt)
		assert.Equal(t, uint64(testkit.T0)+ledger.DefaultLeaseMS, res.LeaseExpiresAt)
		r, err := db.GetReceipt(context.Background(), res.Receipt.Seq)
		require.NoError(t, err)
		fp, err := ledger.Fingerprint([]byte(`{ "order" : 7.0 }`))
		require.NoError(t, err)
		stored, err := db.StoredInputHash(context.Background(), fp)
		require.NoError(t, err)
		assert.Equal(t, stored, r.InputHash, "fingerprint is of the canonical form (keyed in a committed namespace)")
		assert.Equal(t, uint64(testkit.T0), r.RecordedAt)
		assert.Equal(t, res.LeaseExpiresAt, r.LeaseExpiresAt)
	})
	t.Run("generated keys", func(t *testing.T) {
		db := ledgertest.Open(t)
		for _, k := range []string{"", "short", "1234567"} {
			res := ledgertest.MustReserve(t, db, testkit.ReserveReq(k, "exec-1"))
			assert.True(t, res.KeyGenerated)
			assert.True(t, strings.HasPrefix(res.IdempotencyKey, ledger.GeneratedKeyPrefix), res.IdempotencyKey)
			assert.GreaterOrEqual(t, len(res.IdempotencyKey), 4+26)
			assert.Equal(t, ledger.StatusReserved, res.Status, "a generated key never dedupes")
		}
	})
	t.Run("ErrInProgress carries Retry-After", func(t *testing.T) {
		db := ledgertest.Open(t)
		clock := db.Clock
		r := testkit.ReserveReq(key, "exec-1")
		r.LeaseMS = i64(10_500)
		ledgertest.MustReserve(t, db, r)
		clock.Advance(2 * time.Second)
		_, err := db.Reserve(context.Background(), r)
		var de *ledger.Error
		require.ErrorAs(t, err, &de)
		assert.Equal(t, 9*time.Second, de.RetryAfter, "8.5 s rounded up")
		assert.Equal(t, uint64(testkit.T0)+10_500, de.Details["lease_expires_at"])
	})
	t.Run("ErrFingerprintMismatch names the stored fingerprint", func(t *testing.T) {
		db := ledgertest.Open(t)
		ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		r := testkit.ReserveReq(key, "exec-1")
		r.Tool = "other.tool"
		_, err := db.Reserve(context.Background(), r)
		var de *ledger.Error
		require.ErrorAs(t, err, &de)
		assert.Equal(t, "payments.refund", de.Details["tool"])
		assert.Equal(t, "write", de.Details["effect"])
		assert.NotEmpty(t, de.Details["input_hash"])
	})
	t.Run("replay returns the recorded outcome", func(t *testing.T) {
		db := ledgertest.Open(t)
		res := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		c := ledgertest.MustCommit(t, db, testkit.Succeed(key, res.Reservation))
		rep := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-2"))
		assert.Equal(t, ledger.StatusReplayed, rep.Status)
		assert.Equal(t, chain.OutcomeSucceeded, rep.Outcome)
		assert.Equal(t, "re_1", rep.ExternalRef)
		assert.Equal(t, `{"amount":1200}`, rep.Result, "compact JSON as stored")
		assert.Equal(t, c.Receipt, rep.Original)
		assert.Equal(t, c.Receipt.Seq+1, rep.Receipt.Seq)
	})
	t.Run("idempotent is fixed by the first reserve", func(t *testing.T) {
		db, _ := openLapsed(t, true)
		r := testkit.ReserveReq(key, "exec-2")  // not idempotent
		res := ledgertest.MustReserve(t, db, r) // takeover uses the stored flag
		assert.True(t, res.Takeover)
		rc, err := db.GetReceipt(context.Background(), res.Receipt.Seq)
		require.NoError(t, err)
		assert.True(t, rc.Idempotent)
	})
}

func TestNamespace_Reserve_validation(t *testing.T) {
	db := ledgertest.Open(t)
	long := strings.Repeat("k", 256)
	for _, tt := range []struct {
		desc      string
		req       func(r *ledger.ReserveRequest)
		wantErr   string
		wantField string
	}{
		{"key too long", func(r *ledger.ReserveRequest) { r.IdempotencyKey = long }, ledger.ECodeInvalidKey, "idempotency_key"},
		{"key with a space", func(r *ledger.ReserveRequest) { r.IdempotencyKey = "has space!" }, ledger.ECodeInvalidKey, "idempotency_key"},
		{"key with NUL", func(r *ledger.ReserveRequest) { r.IdempotencyKey = "nul\x00inside" }, ledger.ECodeInvalidKey, "idempotency_key"},
		{"key with non-ASCII", func(r *ledger.ReserveRequest) { r.IdempotencyKey = "clé-unicode" }, ledger.ECodeInvalidKey, "idempotency_key"},
		{"key with the reserved gen_ prefix", func(r *ledger.ReserveRequest) { r.IdempotencyKey = "gen_ABCDEFGHIJKLMNOPQRSTUVWXYZ" }, ledger.ECodeInvalidKey, "idempotency_key"},
		{"short key with the reserved gen_ prefix", func(r *ledger.ReserveRequest) { r.IdempotencyKey = "gen_x" }, ledger.ECodeInvalidKey, "idempotency_key"},
		{"missing execution_id", func(r *ledger.ReserveRequest) { r.ExecutionID = "" }, ledger.ECodeInvalidRequest, "execution_id"},
		{"long execution_id", func(r *ledger.ReserveRequest) { r.ExecutionID = strings.Repeat("e", 129) }, ledger.ECodeInvalidRequest, "execution_id"},
		{"missing tool", func(r *ledger.ReserveRequest) { r.Tool = "" }, ledger.ECodeInvalidRequest, "tool"},
		{"tool with a tab", func(r *ledger.ReserveRequest) { r.Tool = "a\tb" }, ledger.ECodeInvalidRequest, "tool"},
		{"unknown effect", func(r *ledger.ReserveRequest) { r.Effect = "delete" }, ledger.ECodeInvalidRequest, "effect"},
		{"attempt 0", func(r *ledger.ReserveRequest) { r.Attempt = i64(0) }, ledger.ECodeInvalidRequest, "attempt"},
		{"attempt -1", func(r *ledger.ReserveRequest) { r.Attempt = i64(-1) }, ledger.ECodeInvalidRequest, "attempt"},
		{"attempt 2^62", func(r *ledger.ReserveRequest) { r.Attempt = i64(1 << 62) }, ledger.ECodeInvalidRequest, "attempt"},
		{"lease too short", func(r *ledger.ReserveRequest) { r.LeaseMS = i64(9) }, ledger.ECodeInvalidRequest, "lease_ms"},
		{"lease too long", func(r *ledger.ReserveRequest) { r.LeaseMS = i64(86_400_001) }, ledger.ECodeInvalidRequest, "lease_ms"},
		{"wait_ms -1", func(r *ledger.ReserveRequest) { r.WaitMS = i64(-1) }, ledger.ECodeInvalidRequest, "wait_ms"},
		{"wait_ms 60001", func(r *ledger.ReserveRequest) { r.WaitMS = i64(60_001) }, ledger.ECodeInvalidRequest, "wait_ms"},
		{"input and input_hash", func(r *ledger.ReserveRequest) { r.InputHash = "sha256:00" }, ledger.ECodeInvalidRequest, "input"},
		{"long input_hash", func(r *ledger.ReserveRequest) { r.Input, r.InputHash = nil, strings.Repeat("h", 129) }, ledger.ECodeInvalidRequest, "input_hash"},
		{"input_hash in upper case", func(r *ledger.ReserveRequest) { r.Input, r.InputHash = nil, "SHA256:"+strings.Repeat("AB", 32) }, ledger.ECodeInvalidRequest, "input_hash"},
		{"input_hash without its prefix", func(r *ledger.ReserveRequest) { r.Input, r.InputHash = nil, strings.Repeat("ab", 32) }, ledger.ECodeInvalidRequest, "input_hash"},
		{"input_hash too short", func(r *ledger.ReserveRequest) { r.Input, r.InputHash = nil, "sha256:ab" }, ledger.ECodeInvalidRequest, "input_hash"},
		{"input with duplicate names", func(r *ledger.ReserveRequest) { r.Input = json.RawMessage(`{"a":1,"a":2}`) }, ledger.ECodeInvalidRequest, "input"},
		{"input with a huge number", func(r *ledger.ReserveRequest) { r.Input = json.RawMessage(`1e309`) }, ledger.ECodeInvalidRequest, "input"},
		{"input with a lone surrogate", func(r *ledger.ReserveRequest) { r.Input = json.RawMessage(`"\ud800"`) }, ledger.ECodeInvalidRequest, "input"},
	} {
		t.Run(tt.desc, func(t *testing.T) {
			req := testkit.ReserveReq(key, "exec-1")
			tt.req(&req)
			_, err := db.Reserve(context.Background(), req)
			var de *ledger.Error
			require.ErrorAs(t, err, &de)
			assert.Equal(t, tt.wantErr, de.Code)
			assert.Equal(t, tt.wantField, de.Details["field"])
		})
	}
	assert.Zero(t, db.Head().Seq, "invalid requests append nothing")
	t.Run("boundaries OK", func(t *testing.T) {
		req := testkit.ReserveReq(strings.Repeat("k", 255), strings.Repeat("e", 128))
		req.Tool, req.LeaseMS, req.Attempt, req.WaitMS = strings.Repeat("t", 128), i64(10), i64(1<<53-1), i64(60_000)
		_, err := db.Reserve(context.Background(), req)
		require.NoError(t, err)
		req = testkit.ReserveReq("12345678", "e")
		req.LeaseMS, req.WaitMS = i64(86_400_000), i64(0)
		_, err = db.Reserve(context.Background(), req)
		require.NoError(t, err)
	})
}

// TestNamespace_Commit walks every row of the SPEC §4 commit table.
func TestNamespace_Commit(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		db := ledgertest.Open(t)
		res := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		c := ledgertest.MustCommit(t, db, testkit.Succeed(key, res.Reservation))
		assert.False(t, c.Late)
		assert.False(t, c.Replayed)
		assert.Equal(t, res.Receipt.Seq+1, c.Receipt.Seq)
		r, err := db.GetReceipt(context.Background(), c.Receipt.Seq)
		require.NoError(t, err)
		assert.Equal(t, chain.KindCommit, r.Kind)
		assert.Equal(t, res.Receipt.Seq, r.RefSeq)
		assert.Equal(t, "exec-1", r.ExecutionID)
		assert.Equal(t, `{"amount":1200}`, r.Value(chain.FieldResult))
		assert.Equal(t, "re_1", r.Value(chain.FieldExternalRef))
	})
	t.Run("ErrUnknownKey", func(t *testing.T) {
		db := ledgertest.Open(t)
		_, err := db.Commit(context.Background(), testkit.Succeed(key, "rsv_nope"))
		assert.Equal(t, ledger.ECodeUnknownKey, ledger.ErrorCode(err))
	})
	t.Run("ErrStaleReservation for a wrong token", func(t *testing.T) {
		db := ledgertest.Open(t)
		ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		_, err := db.Commit(context.Background(), testkit.Succeed(key, "rsv_"+strings.Repeat("0f", 32)))
		assert.Equal(t, ledger.ECodeStaleReservation, ledger.ErrorCode(err))
		assert.Contains(t, ledger.ErrorMessage(err), "not the key's latest reservation")
	})
	t.Run("ErrInvalidRequest for a malformed token", func(t *testing.T) {
		db := ledgertest.Open(t)
		res := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		for _, tok := range []string{"rsv_forged", "rsv_…", "null", res.Reservation[:len(res.Reservation)-1],
			res.Reservation + "0", strings.ToUpper(res.Reservation), " " + res.Reservation, "rsv_" + strings.Repeat("g", 64)} {
			_, err := db.Commit(context.Background(), testkit.Succeed(key, tok))
			var e *ledger.Error
			require.ErrorAs(t, err, &e, "%q", tok)
			assert.Equal(t, ledger.ECodeInvalidRequest, e.Code, "%q", tok)
			assert.Equal(t, "reservation", e.Details["field"], "%q", tok)
			assert.Contains(t, e.Message, "malformed", "%q", tok)
		}
		_, err := db.Commit(context.Background(), testkit.Succeed(key, res.Reservation))
		assert.NoError(t, err, "the malformed attempts changed nothing")
	})
	t.Run("ErrStaleReservation for another key's token", func(t *testing.T) {
		db := ledgertest.Open(t)
		ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		other := ledgertest.MustReserve(t, db, testkit.ReserveReq("other-key-5678", "exec-1"))
		_, err := db.Commit(context.Background(), testkit.Succeed(key, other.Reservation))
		assert.Equal(t, ledger.ECodeStaleReservation, ledger.ErrorCode(err))
	})
	t.Run("ErrStaleReservation after a takeover", func(t *testing.T) {
		db, first := openLapsed(t, true)
		r := testkit.ReserveReq(key, "exec-2")
		r.Idempotent = true
		ledgertest.MustReserve(t, db, r)
		_, err := db.Commit(context.Background(), testkit.Succeed(key, first.Reservation))
		assert.Equal(t, ledger.ECodeStaleReservation, ledger.ErrorCode(err))
	})
	t.Run("same commit again is an idempotent repeat", func(t *testing.T) {
		db := ledgertest.Open(t)
		res := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		c := ledgertest.MustCommit(t, db, testkit.Succeed(key, res.Reservation))
		head := db.Head()
		again := testkit.Succeed(key, res.Reservation)
		again.Result = json.RawMessage(`{ "amount" : 1200.0 }`) // equal as JSON
		rep := ledgertest.MustCommit(t, db, again)
		assert.True(t, rep.Replayed)
		assert.Equal(t, c.Receipt, rep.Receipt)
		assert.Equal(t, c.Late, rep.Late)
		assert.Equal(t, head, db.Head(), "nothing appended")
	})
	t.Run("results are compared by exact value", func(t *testing.T) {
		for _, tt := range []struct {
			desc, first, again string
			wantSame           bool
		}{
			{"big integers differ in the last digit", `{"n":12345678901234567890}`, `{"n":12345678901234567891}`, false},
			{"same big integer", `{"n":12345678901234567890}`, `{"n":12345678901234567890}`, true},
			{"decimal forms of one value", `{"n":1.50,"m":[10,0]}`, `{"m":[1e1,-0.0],"n":15e-1}`, true},
			{"tiny difference in a long fraction", `0.10000000000000000001`, `0.1`, false},
			{"large exponents differ", `1e300`, `1e299`, false}, // 1e400 is not I-JSON: refused before any comparison
			{"member order does not matter", `{"a":"x","b":true}`, `{"b":true,"a":"x"}`, true},
			{"array order matters", `[1,2]`, `[2,1]`, false},
			{"null vs false", `[null]`, `[false]`, false},
		} {
			t.Run(tt.desc, func(t *testing.T) {
				db := ledgertest.Open(t)
				res := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
				c := testkit.Succeed(key, res.Reservation)
				c.Result = json.RawMessage(tt.first)
				ledgertest.MustCommit(t, db, c)
				c.Result = json.RawMessage(tt.again)
				rep, err := db.Commit(context.Background(), c)
				if tt.wantSame {
					require.NoError(t, err)
					assert.True(t, rep.Replayed)
				} else {
					assert.Equal(t, ledger.ECodeAlreadyFinalized, ledger.ErrorCode(err))
				}
			})
		}
	})
	t.Run("same failed commit again is an idempotent repeat", func(t *testing.T) {
		db := ledgertest.Open(t)
		res := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		c := ledgertest.MustCommit(t, db, testkit.Fail(key, res.Reservation, false))
		rep := ledgertest.MustCommit(t, db, testkit.Fail(key, res.Reservation, false))
		assert.True(t, rep.Replayed)
		assert.Equal(t, c.Receipt, rep.Receipt)
	})
	t.Run("ErrAlreadyFinalized for other values", func(t *testing.T) {
		for _, change := range []func(c *ledger.CommitRequest){
			func(c *ledger.CommitRequest) { c.ExternalRef = "re_2" },
			func(c *ledger.CommitRequest) { c.Result = json.RawMessage(`{"amount":1201}`) },
			func(c *ledger.CommitRequest) { c.Result = nil },
			func(c *ledger.CommitRequest) {
				c.Outcome, c.Error, c.Result, c.ExternalRef = chain.OutcomeFailed, &ledger.FailureDetail{Code: "X"}, nil, ""
			},
		} {
			db := ledgertest.Open(t)
			res := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
			ledgertest.MustCommit(t, db, testkit.Succeed(key, res.Reservation))
			req := testkit.Succeed(key, res.Reservation)
			change(&req)
			_, err := db.Commit(context.Background(), req)
			assert.Equal(t, ledger.ECodeAlreadyFinalized, ledger.ErrorCode(err))
		}
	})
	t.Run("ErrAlreadyFinalized after a resolve", func(t *testing.T) {
		db, res := openLapsed(t, false)
		_, err := db.Resolve(context.Background(), ledger.ResolveRequest{IdempotencyKey: key,
			Outcome: chain.OutcomeSucceeded, ExternalRef: "re_1", Result: json.RawMessage(`{"amount":1200}`), Note: "checked the PSP"})
		require.NoError(t, err)
		_, err = db.Commit(context.Background(), testkit.Succeed(key, res.Reservation))
		assert.Equal(t, ledger.ECodeAlreadyFinalized, ledger.ErrorCode(err))
	})
	t.Run("late commit after the lease ended", func(t *testing.T) {
		db, res := openLapsed(t, false)
		c := ledgertest.MustCommit(t, db, testkit.Succeed(key, res.Reservation))
		assert.True(t, c.Late)
		rep := ledgertest.MustCommit(t, db, testkit.Succeed(key, res.Reservation))
		assert.True(t, rep.Late, "the repeat reports the original body")
	})
	t.Run("validation", func(t *testing.T) {
		db := ledgertest.Open(t)
		res := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		head := db.Head()
		for _, tt := range []struct {
			desc, wantField string
			change          func(c *ledger.CommitRequest)
		}{
			{"no reservation", "reservation", func(c *ledger.CommitRequest) { c.Reservation = "" }},
			{"bad outcome", "outcome", func(c *ledger.CommitRequest) { c.Outcome = "maybe" }},
			{"error on success", "error", func(c *ledger.CommitRequest) { c.Error = &ledger.FailureDetail{Code: "X"} }},
			{"failed without error", "error", func(c *ledger.CommitRequest) { c.Outcome = chain.OutcomeFailed }},
			{"lowercase code", "error.code", func(c *ledger.CommitRequest) {
				c.Outcome, c.Error = chain.OutcomeFailed, &ledger.FailureDetail{Code: "timeout"}
			}},
			{"long code", "error.code", func(c *ledger.CommitRequest) {
				c.Outcome, c.Error = chain.OutcomeFailed, &ledger.FailureDetail{Code: strings.Repeat("E", 65)}
			}},
			{"long message", "error.message", func(c *ledger.CommitRequest) {
				c.Outcome, c.Error = chain.OutcomeFailed, &ledger.FailureDetail{Code: "E", Message: strings.Repeat("m", 1025)}
			}},
			{"long external_ref", "external_ref", func(c *ledger.CommitRequest) { c.ExternalRef = strings.Repeat("r", 513) }},
			{"huge result", "result", func(c *ledger.CommitRequest) {
				c.Result = json.RawMessage(`"` + strings.Repeat("x", 64<<10) + `"`)
			}},
			{"invalid result", "result", func(c *ledger.CommitRequest) { c.Result = json.RawMessage(`{`) }},
		} {
			t.Run(tt.desc, func(t *testing.T) {
				req := testkit.Succeed(key, res.Reservation)
				tt.change(&req)
				_, err := db.Commit(context.Background(), req)
				var de *ledger.Error
				require.ErrorAs(t, err, &de)
				assert.Equal(t, ledger.ECodeInvalidRequest, de.Code)
				assert.Equal(t, tt.wantField, de.Details["field"])
			})
		}
		assert.Equal(t, head, db.Head())
	})
}

// TestNamespace_Resolve walks the resolve rules of SPEC §4.
func TestNamespace_Resolve(t *testing.T) {
	resolve := func(outcome string) ledger.ResolveRequest {
		r := ledger.ResolveRequest{IdempotencyKey: key, Outcome: outcome, Note: "checked the PSP dashboard", Actor: ""}
		if outcome == chain.OutcomeFailed {
			r.Error = &ledger.FailureDetail{Code: "NOT_CHARGED", Retryable: true}
		} else {
			r.ExternalRef = "re_9"
		}
		return r
	}
	t.Run("OK succeeded", func(t *testing.T) {
		db, res := openLapsed(t, false)
		out, err := db.Resolve(context.Background(), resolve(chain.OutcomeSucceeded))
		require.NoError(t, err)
		assert.Equal(t, ledger.StateSucceeded, out.State)
		r, err := db.GetReceipt(context.Background(), out.Receipt.Seq)
		require.NoError(t, err)
		assert.Equal(t, chain.KindResolve, r.Kind)
		assert.Equal(t, res.Receipt.Seq, r.RefSeq)
		assert.Equal(t, "checked the PSP dashboard", r.Value(chain.FieldNote))
		assert.Equal(t, "exec-1", r.ExecutionID, "repeats the interrupted reserve")
		rep := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-2"))
		assert.Equal(t, ledger.StatusReplayed, rep.Status)
		assert.Equal(t, "re_9", rep.ExternalRef)
		assert.Equal(t, out.Receipt, rep.Original)
	})
	t.Run("OK failed then retry needs idempotent", func(t *testing.T) {
		db, _ := openLapsed(t, false)
		out, err := db.Resolve(context.Background(), resolve(chain.OutcomeFailed))
		require.NoError(t, err)
		assert.Equal(t, ledger.StateFailed, out.State)
		v, err := db.GetKey(context.Background(), key)
		require.NoError(t, err)
		assert.Equal(t, ledger.StateFailed, v.State)
		_, err = db.Reserve(context.Background(), testkit.ReserveReq(key, "exec-2"))
		assert.Equal(t, ledger.ECodeRetryNotAllowed, ledger.ErrorCode(err))
	})
	t.Run("ErrUnknownKey", func(t *testing.T) {
		db := ledgertest.Open(t)
		_, err := db.Resolve(context.Background(), resolve(chain.OutcomeSucceeded))
		assert.Equal(t, ledger.ECodeUnknownKey, ledger.ErrorCode(err))
	})
	t.Run("ErrNotInterrupted", func(t *testing.T) {
		db := ledgertest.Open(t)
		clock := db.Clock
		res := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		_, err := db.Resolve(context.Background(), resolve(chain.OutcomeSucceeded))
		assert.Equal(t, ledger.ECodeNotInterrupted, ledger.ErrorCode(err), "reserved")
		ledgertest.MustCommit(t, db, testkit.Succeed(key, res.Reservation))
		clock.Advance(time.Minute)
		_, err = db.Resolve(context.Background(), resolve(chain.OutcomeSucceeded))
		assert.Equal(t, ledger.ECodeNotInterrupted, ledger.ErrorCode(err), "succeeded")
	})
	t.Run("ErrInvalidRequest without a note", func(t *testing.T) {
		db := ledgertest.Open(t)
		req := resolve(chain.OutcomeSucceeded)
		req.Note = ""
		_, err := db.Resolve(context.Background(), req)
		assert.Equal(t, ledger.ECodeInvalidRequest, ledger.ErrorCode(err))
	})
}

func TestNamespace_GetKey(t *testing.T) {
	db := ledgertest.Open(t)
	clock := db.Clock
	_, err := db.GetKey(context.Background(), key)
	assert.Equal(t, ledger.ECodeUnknownKey, ledger.ErrorCode(err))

	res := ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
	v, err := db.GetKey(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, ledger.StateReserved, v.State)
	clock.Advance(31 * time.Second)
	v, err = db.GetKey(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, ledger.StateInterrupted, v.State)
	ledgertest.MustCommit(t, db, testkit.Succeed(key, res.Reservation))
	ledgertest.MustReserve(t, db, testkit.ReserveReq(key, "exec-2"))
	v, err = db.GetKey(context.Background(), key)
	require.NoError(t, err)
	assert.Equal(t, ledger.StateSucceeded, v.State)
	assert.Equal(t, "payments.refund", v.Tool)
	assert.Equal(t, chain.EffectWrite, v.Effect)
	require.Len(t, v.Receipts, 3)
	assert.Equal(t, []string{"reserve", "commit", "replay"}, []string{v.Receipts[0].Kind, v.Receipts[1].Kind, v.Receipts[2].Kind})
}

func TestNamespace_ListReceipts(t *testing.T) {
	db := ledgertest.Open(t)
	for i := range 5 {
		k := "list-key-" + string(rune('a'+i)) + "xx"
		res := ledgertest.MustReserve(t, db, testkit.ReserveReq(k, "exec-"+string(rune('a'+i%2))))
		ledgertest.MustCommit(t, db, testkit.Succeed(k, res.Reservation))
	}
	all, next, err := db.ListReceipts(context.Background(), ledger.ReceiptFilter{})
	require.NoError(t, err)
	assert.Len(t, all, 10)
	assert.Nil(t, next)

	page, next, err := db.ListReceipts(context.Background(), ledger.ReceiptFilter{Limit: 4})
	require.NoError(t, err)
	require.Len(t, page, 4)
	require.NotNil(t, next)
	assert.Equal(t, uint64(4), *next)
	page, next, err = db.ListReceipts(context.Background(), ledger.ReceiptFilter{After: 8, Limit: 2})
	require.NoError(t, err)
	assert.Len(t, page, 2)
	assert.Nil(t, next, "no receipt follows the page")

	commits, _, err := db.ListReceipts(context.Background(), ledger.ReceiptFilter{Kind: chain.KindCommit, Limit: 2})
	require.NoError(t, err)
	for _, r := range commits {
		assert.Equal(t, chain.KindCommit, r.Kind)
	}
	byExec, next, err := db.ListReceipts(context.Background(), ledger.ReceiptFilter{ExecutionID: "exec-b", Limit: 4})
	require.NoError(t, err)
	assert.Len(t, byExec, 4)
	assert.Nil(t, next)
	byKey, _, err := db.ListReceipts(context.Background(), ledger.ReceiptFilter{Key: "list-key-cxx"})
	require.NoError(t, err)
	assert.Len(t, byKey, 2)
	byTool, _, err := db.ListReceipts(context.Background(), ledger.ReceiptFilter{Tool: "nope"})
	require.NoError(t, err)
	assert.Empty(t, byTool)

	_, _, err = db.ListReceipts(context.Background(), ledger.ReceiptFilter{Limit: 1001})
	assert.Equal(t, ledger.ECodeInvalidRequest, ledger.ErrorCode(err))
	_, _, err = db.ListReceipts(context.Background(), ledger.ReceiptFilter{Kind: "bogus"})
	assert.Equal(t, ledger.ECodeInvalidRequest, ledger.ErrorCode(err))
	_, err = db.GetReceipt(context.Background(), 11)
	assert.Equal(t, ledger.ECodeUnknownReceipt, ledger.ErrorCode(err))
}

// TestNamespace_hostileStrings stores strings that must come back byte for byte.
func TestNamespace_hostileStrings(t *testing.T) {
	db := ledgertest.Open(t)
	clock := db.Clock
	k := `';DROP/**/TABLE/**/receipts;--`
	res := ledgertest.MustReserve(t, db, testkit.ReserveReq(k, `exec-"quoted"`))
	c := ledger.CommitRequest{IdempotencyKey: k, Reservation: res.Reservation, Outcome: chain.OutcomeFailed,
		ExternalRef: "'; DROP TABLE receipts;--\x00with\x01controls\u2028é",
		Result:      json.RawMessage(`{"html":"<b>&amp;</b>","nul":"\u0000"}`),
		Error:       &ledger.FailureDetail{Code: "E_1", Message: "line1\nline2\x00\t'; DELETE FROM keys;--"}}
	out := ledgertest.MustCommit(t, db, c)
	_ = clock
	r, err := db.GetReceipt(context.Background(), out.Receipt.Seq)
	require.NoError(t, err)
	assert.Equal(t, k, r.IdempotencyKey)
	assert.Equal(t, c.ExternalRef, r.Value(chain.FieldExternalRef))
	assert.Equal(t, string(c.Result), r.Value(chain.FieldResult))
	assert.Equal(t, c.Error.Message, r.Value(chain.FieldErrorMessage))
	ledgertest.VerifyChain(t, db)
}
