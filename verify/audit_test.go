package verify_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/api"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/verify"
)

func TestVerifier_audit(t *testing.T) {
	path, now := buildLedger(t)
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	opts := verify.Opts{Now: func() time.Time { return now }}
	rep, err := verify.New(rd, opts).Check(context.Background())
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep.Violations)
	a := rep.Audit

	t.Run("runtime retries", func(t *testing.T) {
		require.Len(t, a.RuntimeRetries, 1)
		rr := a.RuntimeRetries[0]
		assert.Equal(t, "mail-key-001", rr.Key)
		assert.Equal(t, "exec-3", rr.ExecutionID)
		assert.Equal(t, []uint64{1, 2}, rr.Attempts)
		assert.Equal(t, []string{"TIMEOUT"}, rr.ErrorCodes)
		assert.Equal(t, []uint64{6}, rr.Seqs)
	})
	t.Run("re-invocations", func(t *testing.T) {
		require.Len(t, a.ReInvocations, 1)
		ri := a.ReInvocations[0]
		assert.Equal(t, "pay-key-0001", ri.Key)
		assert.Equal(t, uint64(3), ri.Seq)
		assert.Equal(t, "deduped", ri.Outcome)
		assert.Equal(t, "exec-2", ri.ExecutionID)
		assert.Equal(t, "exec-1", ri.FirstExecutionID)
	})
	t.Run("interrupted", func(t *testing.T) {
		require.Len(t, a.Interrupted, 1)
		assert.Equal(t, "open-key-001", a.Interrupted[0].Key)
		assert.False(t, a.Interrupted[0].Idempotent)
		assert.True(t, a.Interrupted[0].AwaitingPerson)
		assert.Equal(t, uint64(10), a.Interrupted[0].ReserveSeq)
	})
	t.Run("failed", func(t *testing.T) {
		require.Len(t, a.Failed, 1)
		assert.Equal(t, "charge-key-1", a.Failed[0].Key)
		assert.Equal(t, "NOT_CHARGED", a.Failed[0].ErrorCode)
	})
	t.Run("resolutions", func(t *testing.T) {
		require.Len(t, a.Resolutions, 1)
		assert.Equal(t, "charge-key-1", a.Resolutions[0].Key)
		assert.Equal(t, "checked the PSP", a.Resolutions[0].Note)
		assert.Equal(t, "failed", a.Resolutions[0].Outcome)
	})
	t.Run("no duplicates", func(t *testing.T) { assert.Empty(t, a.DuplicateEffects) })
	t.Run("online audit is the same", func(t *testing.T) {
		db := ledgertest.Open(t, ledgertest.WithPath(path))
		srv := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
		defer func() { srv.Close(); _ = db.Close() }()
		online, err := verify.NewRemote(server(t, srv.URL), opts).Check(context.Background())
		require.NoError(t, err)
		assert.Equal(t, a, online.Audit)
		assert.Equal(t, rep.Head, online.Head)
	})
	t.Run("tool filter", func(t *testing.T) {
		o := opts
		o.Filter.Tool = "email.send"
		rep, err := verify.New(rd, o).Check(context.Background())
		require.NoError(t, err)
		assert.Len(t, rep.Audit.RuntimeRetries, 1)
		assert.Empty(t, rep.Audit.ReInvocations)
		assert.Empty(t, rep.Audit.Failed)
		assert.Empty(t, rep.Audit.Interrupted)
	})
	t.Run("since filter", func(t *testing.T) {
		o := opts
		o.Filter.Since = now
		rep, err := verify.New(rd, o).Check(context.Background())
		require.NoError(t, err)
		assert.Empty(t, rep.Audit.RuntimeRetries)
		assert.Empty(t, rep.Audit.Resolutions)
	})
}

// TestVerifier_duplicateEffects: two keys, same tool and input, both
// succeeded — the refund called twice under different keys.
func TestVerifier_duplicateEffects(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path))
	ctx := context.Background()
	for _, k := range []string{"refund-a-0001", "refund-b-0002", "refund-c-0003"} {
		res, err := db.Reserve(ctx, ledger.ReserveRequest{IdempotencyKey: k, ExecutionID: "exec-" + k,
			Tool: "payments.refund", Effect: "write", Input: []byte(`{"order":1234}`)})
		require.NoError(t, err)
		outcome := "succeeded"
		var fd *ledger.FailureDetail
		if k == "refund-c-0003" {
			outcome, fd = "failed", &ledger.FailureDetail{Code: "DECLINED"}
		}
		_, err = db.Commit(ctx, ledger.CommitRequest{IdempotencyKey: k, Reservation: res.Reservation, Outcome: outcome, Error: fd})
		require.NoError(t, err)
	}
	rd, err := sqlite.OpenReader(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	rep, err := verify.New(rd, verify.Opts{}).Check(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Audit.DuplicateEffects, 1)
	d := rep.Audit.DuplicateEffects[0]
	assert.Equal(t, "payments.refund", d.Tool)
	assert.Equal(t, []string{"refund-a-0001", "refund-b-0002"}, d.Keys)
	assert.Equal(t, []uint64{2, 4}, d.Seqs)

	srv := httptest.NewServer(api.NewServer(db.Ledger, api.Config{Logger: quiet}))
	defer func() { srv.Close(); _ = db.Close() }()
	for range 5 { // the online pass finishes keys in map order: the keys must still come in seq order
		online, err := verify.NewRemote(server(t, srv.URL), verify.Opts{}).Check(ctx)
		require.NoError(t, err)
		assert.Equal(t, rep.Audit.DuplicateEffects, online.Audit.DuplicateEffects, "online")
	}
	for _, f := range []verify.AuditFilter{{SinceSeq: 4}, {SinceSeq: 5}, {Tool: "payments.charge"}} {
		offline, err := verify.New(rd, verify.Opts{Filter: f}).Check(ctx)
		require.NoError(t, err)
		online, err := verify.NewRemote(server(t, srv.URL), verify.Opts{Filter: f}).Check(ctx)
		require.NoError(t, err)
		assert.Equal(t, offline.Audit.DuplicateEffects, online.Audit.DuplicateEffects, "%+v", f)
		assert.Equal(t, f.SinceSeq == 4, len(offline.Audit.DuplicateEffects) == 1, "%+v", f)
	}
}

// The SQLite driver's reader serves the grouped query.
var _ verify.RepeatSource = (*sqlite.Reader)(nil)

// calls drives a real ledger file through its Go API, one receipt per
// step, with a clock that moves one second per step.
type calls struct {
	t      *testing.T
	path   string
	db     *ledgertest.DB
	clock  *testkit.Clock
	tokens map[string]string // key → latest reservation token
	keys   []string          // generated keys, in order
}

func newCalls(t *testing.T) *calls {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path))
	return &calls{t: t, path: path, db: db, clock: db.Clock, tokens: map[string]string{}}
}

// input is a fingerprinted input: the same n gives the same input_hash.
func input(n int) []byte { return fmt.Appendf(nil, `{"order":%d}`, n) }

type reserveOpt func(*ledger.ReserveRequest)

func attempt(n int64) reserveOpt { return func(r *ledger.ReserveRequest) { r.Attempt = &n } }
func lease(ms int64) reserveOpt  { return func(r *ledger.ReserveRequest) { r.LeaseMS = &ms } }
func idempotent() reserveOpt     { return func(r *ledger.ReserveRequest) { r.Idempotent = true } }
func noInput() reserveOpt        { return func(r *ledger.ReserveRequest) { r.Input = nil } }

// reserve reserves key (empty: a generated one) for tool on input n and
// returns the key.
func (c *calls) reserve(key, exec, tool string, n int, opts ...reserveOpt) string {
	c.t.Helper()
	c.clock.Advance(time.Second)
	req := ledger.ReserveRequest{IdempotencyKey: key, ExecutionID: exec, Tool: tool, Effect: "write", Input: input(n)}
	for _, o := range opts {
		o(&req)
	}
	res := ledgertest.MustReserve(c.t, c.db, req)
	require.Equal(c.t, ledger.StatusReserved, res.Status)
	c.tokens[res.IdempotencyKey] = res.Reservation
	if res.KeyGenerated {
		c.keys = append(c.keys, res.IdempotencyKey)
	}
	return res.IdempotencyKey
}

// end commits key's latest reservation a second later with outcome and,
// unless code is empty, an error of code.
func (c *calls) end(key, outcome, code string, retryable bool) {
	c.t.Helper()
	c.clock.Advance(time.Second)
	req := ledger.CommitRequest{IdempotencyKey: key, Reservation: c.tokens[key], Outcome: outcome}
	if code != "" {
		req.Error = &ledger.FailureDetail{Code: code, Retryable: retryable}
	}
	ledgertest.MustCommit(c.t, c.db, req)
}

func (c *calls) fail(key, code string, retryable bool) {
	c.t.Helper()
	c.end(key, "failed", code, retryable)
}
func (c *calls) succeed(key string) { c.t.Helper(); c.end(key, "succeeded", "", false) }

// resolveFailed lets key's lease run out, then records an operator's
// failed outcome.
func (c *calls) resolveFailed(key, code string) {
	c.t.Helper()
	c.clock.Advance(time.Hour)
	_, err := c.db.Resolve(context.Background(), ledger.ResolveRequest{IdempotencyKey: key, Outcome: "failed",
		Error: &ledger.FailureDetail{Code: code}, Note: "checked downstream", Actor: "ops-alice"})
	require.NoError(c.t, err)
}

// audits returns the audit of the file and of a server on it, after
// checking that the chain is intact.
func (c *calls) audits(opts verify.Opts) (offline, online *verify.Audit) {
	c.t.Helper()
	ctx := context.Background()
	if opts.Now == nil {
		opts.Now = c.clock.Now
	}
	rd, err := sqlite.OpenReader(ctx, c.path, sqlite.Options{})
	require.NoError(c.t, err)
	defer rd.Close()
	rep, err := verify.New(rd, opts).Check(ctx)
	require.NoError(c.t, err)
	require.True(c.t, rep.OK, "%+v", rep.Violations)
	srv := httptest.NewServer(api.NewServer(c.db.Ledger, api.Config{Logger: quiet}))
	defer srv.Close()
	orep, err := verify.NewRemote(server(c.t, srv.URL), opts).Check(ctx)
	require.NoError(c.t, err)
	require.True(c.t, orep.OK, "%+v", orep.Violations)
	return rep.Audit, orep.Audit
}

// hash is the input_hash c's ledger records for input n (keyed in a
// committed namespace, SPEC §14).
func (c *calls) hash(n int) string {
	c.t.Helper()
	h, err := ledger.Fingerprint(input(n))
	require.NoError(c.t, err)
	stored, err := c.db.StoredInputHash(context.Background(), h)
	require.NoError(c.t, err)
	return stored
}

// TestVerifier_repeatedFailures: SPEC §5 repeated_failures, offline (the
// SQL grouping) and online (the seq-ordered pass) alike.
func TestVerifier_repeatedFailures(t *testing.T) {
	const refund = "payments.refund"
	for _, tc := range []struct {
		desc  string
		steps func(c *calls)
		// want builds the expected entries; c.keys holds generated keys.
		want func(t *testing.T, c *calls) []verify.RepeatedFailure
	}{{
		desc: "failure then the same call under a new key",
		steps: func(c *calls) {
			c.reserve("refund-a-0001", "exec-1", refund, 7)
			c.fail("refund-a-0001", "DECLINED", false)
			c.reserve("refund-b-0002", "exec-2", refund, 7)
		},
		want: func(t *testing.T, c *calls) []verify.RepeatedFailure {
			return []verify.RepeatedFailure{{Tool: refund, InputHash: c.hash(7), ErrorCode: "DECLINED",
				Keys: []string{"refund-a-0001", "refund-b-0002"}, Executions: []string{"exec-1", "exec-2"}, Seqs: []uint64{2, 3}}}
		},
	}, {
		desc: "the same call reserved before the failure",
		steps: func(c *calls) {
			c.reserve("refund-a-0001", "exec-1", refund, 7)
			c.reserve("refund-b-0002", "exec-2", refund, 7)
			c.fail("refund-a-0001", "DECLINED", false)
			c.succeed("refund-b-0002")
		},
	}, {
		desc: "same tool, another input",
		steps: func(c *calls) {
			c.reserve("refund-a-0001", "exec-1", refund, 7)
			c.fail("refund-a-0001", "DECLINED", false)
			c.reserve("refund-b-0002", "exec-2", refund, 8)
		},
	}, {
		desc: "another tool, same input",
		steps: func(c *calls) {
			c.reserve("refund-a-0001", "exec-1", refund, 7)
			c.fail("refund-a-0001", "DECLINED", false)
			c.reserve("charge-b-0002", "exec-2", "payments.charge", 7)
		},
	}, {
		desc: "empty input_hash",
		steps: func(c *calls) {
			c.reserve("refund-a-0001", "exec-1", refund, 0, noInput())
			c.fail("refund-a-0001", "DECLINED", false)
			c.reserve("refund-b-0002", "exec-2", refund, 0, noInput())
		},
	}, {
		desc: "failure then success under a new key",
		steps: func(c *calls) {
			c.reserve("refund-a-0001", "exec-1", refund, 7)
			c.fail("refund-a-0001", "TIMEOUT", true)
			c.reserve("refund-b-0002", "exec-1", refund, 7)
			c.succeed("refund-b-0002")
		},
		want: func(t *testing.T, c *calls) []verify.RepeatedFailure {
			return []verify.RepeatedFailure{{Tool: refund, InputHash: c.hash(7), ErrorCode: "TIMEOUT",
				Keys: []string{"refund-a-0001", "refund-b-0002"}, Executions: []string{"exec-1", "exec-1"}, Seqs: []uint64{2, 3}}}
		},
	}, {
		desc: "three repeats: one entry, every key in seq order",
		steps: func(c *calls) {
			c.reserve("refund-a-0001", "exec-1", refund, 7)
			c.fail("refund-a-0001", "DECLINED", false)
			c.reserve("refund-z-0002", "exec-2", refund, 7)
			c.fail("refund-z-0002", "DECLINED", false)
			c.reserve("refund-m-0003", "exec-3", refund, 7)
			c.succeed("refund-m-0003")
			c.reserve("refund-b-0004", "exec-4", refund, 7)
		},
		want: func(t *testing.T, c *calls) []verify.RepeatedFailure {
			return []verify.RepeatedFailure{{Tool: refund, InputHash: c.hash(7), ErrorCode: "DECLINED",
				Keys:       []string{"refund-a-0001", "refund-z-0002", "refund-m-0003", "refund-b-0004"},
				Executions: []string{"exec-1", "exec-2", "exec-3", "exec-4"}, Seqs: []uint64{2, 3, 5, 7}}}
		},
	}, {
		desc: "a runtime retry of the same key is not a repeat",
		steps: func(c *calls) {
			c.reserve("refund-a-0001", "exec-1", refund, 7, idempotent())
			c.fail("refund-a-0001", "TIMEOUT", true)
			c.reserve("refund-a-0001", "exec-1", refund, 7, idempotent(), attempt(2))
			c.succeed("refund-a-0001")
		},
	}, {
		desc: "failure by an operator's resolve, then a new key",
		steps: func(c *calls) {
			c.reserve("charge-a-0001", "exec-1", "payments.charge", 9, lease(10))
			c.resolveFailed("charge-a-0001", "NOT_CHARGED")
			c.reserve("charge-b-0002", "exec-2", "payments.charge", 9)
		},
		want: func(t *testing.T, c *calls) []verify.RepeatedFailure {
			return []verify.RepeatedFailure{{Tool: "payments.charge", InputHash: c.hash(9), ErrorCode: "NOT_CHARGED",
				Keys: []string{"charge-a-0001", "charge-b-0002"}, Executions: []string{"exec-1", "exec-2"}, Seqs: []uint64{2, 3}}}
		},
	}, {
		desc: "two failed keys, same call: one entry, the first failure's code",
		steps: func(c *calls) {
			c.reserve("refund-a-0001", "exec-1", refund, 7)
			c.fail("refund-a-0001", "DECLINED", false)
			c.reserve("refund-b-0002", "exec-2", refund, 7)
			c.fail("refund-b-0002", "CARD_EXPIRED", false)
			c.reserve("refund-c-0003", "exec-3", refund, 7)
		},
		want: func(t *testing.T, c *calls) []verify.RepeatedFailure {
			return []verify.RepeatedFailure{{Tool: refund, InputHash: c.hash(7), ErrorCode: "DECLINED",
				Keys: []string{"refund-a-0001", "refund-b-0002", "refund-c-0003"}, Executions: []string{"exec-1", "exec-2", "exec-3"},
				Seqs: []uint64{2, 3, 5}}}
		},
	}, {
		desc: "a key reserved before the failure, taken over after it, is not a repeat",
		steps: func(c *calls) {
			c.reserve("refund-a-0001", "exec-1", refund, 7)
			c.reserve("refund-b-0002", "exec-2", refund, 7, idempotent(), lease(10))
			c.fail("refund-a-0001", "DECLINED", false)
			c.clock.Advance(time.Minute)
			c.reserve("refund-b-0002", "exec-3", refund, 7, idempotent()) // takeover: ref_seq 2
		},
	}, {
		desc: "generated keys are fresh keys",
		steps: func(c *calls) {
			k := c.reserve("", "exec-1", refund, 7)
			c.fail(k, "DECLINED", false)
			c.reserve("", "exec-2", refund, 7)
		},
		want: func(t *testing.T, c *calls) []verify.RepeatedFailure {
			return []verify.RepeatedFailure{{Tool: refund, InputHash: c.hash(7), ErrorCode: "DECLINED",
				Keys: c.keys, Executions: []string{"exec-1", "exec-2"}, Seqs: []uint64{2, 3}}}
		},
	}, {
		desc: "two calls repeated: two entries, by tool and input_hash",
		steps: func(c *calls) {
			c.reserve("refund-a-0001", "exec-1", refund, 7)
			c.reserve("charge-a-0001", "exec-1", "payments.charge", 7)
			c.fail("refund-a-0001", "DECLINED", false)
			c.fail("charge-a-0001", "DECLINED", false)
			c.reserve("refund-b-0002", "exec-2", refund, 7)
			c.reserve("charge-b-0002", "exec-2", "payments.charge", 7)
		},
		want: func(t *testing.T, c *calls) []verify.RepeatedFailure {
			return []verify.RepeatedFailure{
				{Tool: "payments.charge", InputHash: c.hash(7), ErrorCode: "DECLINED",
					Keys: []string{"charge-a-0001", "charge-b-0002"}, Executions: []string{"exec-1", "exec-2"}, Seqs: []uint64{4, 6}},
				{Tool: refund, InputHash: c.hash(7), ErrorCode: "DECLINED",
					Keys: []string{"refund-a-0001", "refund-b-0002"}, Executions: []string{"exec-1", "exec-2"}, Seqs: []uint64{3, 5}},
			}
		},
	}, {
		desc: "a deduplicated replay after a failure is not a repeat",
		steps: func(c *calls) {
			c.reserve("refund-a-0001", "exec-1", refund, 7)
			c.succeed("refund-a-0001")
			c.reserve("refund-b-0002", "exec-2", refund, 7)
			c.fail("refund-b-0002", "DECLINED", false)
			c.clock.Advance(time.Second)
			res, err := c.db.Reserve(context.Background(), ledger.ReserveRequest{IdempotencyKey: "refund-a-0001",
				ExecutionID: "exec-3", Tool: refund, Effect: "write", Input: input(7)})
			require.NoError(c.t, err)
			require.Equal(c.t, ledger.StatusReplayed, res.Status)
		},
	}} {
		t.Run(tc.desc, func(t *testing.T) {
			c := newCalls(t)
			tc.steps(c)
			want := []verify.RepeatedFailure{}
			if tc.want != nil {
				want = tc.want(t, c)
			}
			offline, online := c.audits(verify.Opts{})
			assert.Equal(t, want, offline.RepeatedFailures, "offline")
			assert.Equal(t, want, online.RepeatedFailures, "online")
		})
	}
}

// TestVerifier_repeatedFailuresRuntimeRetry: a runtime retry of the failed
// key is listed under runtime_retries, and only there.
func TestVerifier_repeatedFailuresRuntimeRetry(t *testing.T) {
	c := newCalls(t)
	c.reserve("refund-a-0001", "exec-1", "payments.refund", 7, idempotent())
	c.fail("refund-a-0001", "TIMEOUT", true)
	c.reserve("refund-a-0001", "exec-1", "payments.refund", 7, idempotent(), attempt(2))
	offline, online := c.audits(verify.Opts{})
	for _, a := range []*verify.Audit{offline, online} {
		assert.Empty(t, a.RepeatedFailures)
		require.Len(t, a.RuntimeRetries, 1)
		assert.Equal(t, []uint64{1, 2}, a.RuntimeRetries[0].Attempts)
	}
}

// TestVerifier_repeatedFailuresFilters: --tool keeps one call, --since
// (a time or a seq) keeps the entries whose latest repeat is in the
// window, with all their keys; an incremental run keeps those with a
// repeat after the pinned head.
func TestVerifier_repeatedFailuresFilters(t *testing.T) {
	c := newCalls(t)
	c.reserve("refund-a-0001", "exec-1", "payments.refund", 7) // 1
	c.fail("refund-a-0001", "DECLINED", false)                 // 2
	c.reserve("refund-b-0002", "exec-2", "payments.refund", 7) // 3
	c.reserve("charge-a-0001", "exec-3", "payments.charge", 7) // 4
	c.fail("charge-a-0001", "DECLINED", false)                 // 5
	mid := c.clock.Now()
	c.reserve("charge-b-0002", "exec-4", "payments.charge", 7) // 6
	c.reserve("refund-c-0003", "exec-5", "payments.refund", 7) // 7
	c.reserve("mail-a-00001", "exec-6", "email.send", 1)       // 8

	tools := func(a *verify.Audit) []string {
		var out []string
		for _, r := range a.RepeatedFailures {
			out = append(out, r.Tool)
		}
		return out
	}
	for _, tc := range []struct {
		desc      string
		filter    verify.AuditFilter
		wantTools []string
	}{
		{desc: "no filter", wantTools: []string{"payments.charge", "payments.refund"}},
		{desc: "tool", filter: verify.AuditFilter{Tool: "payments.refund"}, wantTools: []string{"payments.refund"}},
		{desc: "tool without repeats", filter: verify.AuditFilter{Tool: "email.send"}},
		{desc: "since seq of the last repeat", filter: verify.AuditFilter{SinceSeq: 7}, wantTools: []string{"payments.refund"}},
		{desc: "since seq of a failure", filter: verify.AuditFilter{SinceSeq: 5}, wantTools: []string{"payments.charge", "payments.refund"}},
		{desc: "since seq after every repeat", filter: verify.AuditFilter{SinceSeq: 8}},
		{desc: "since time", filter: verify.AuditFilter{Since: mid.Add(time.Millisecond)}, wantTools: []string{"payments.charge", "payments.refund"}},
		{desc: "since time after every repeat", filter: verify.AuditFilter{Since: c.clock.Now()}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			offline, online := c.audits(verify.Opts{Filter: tc.filter})
			assert.Equal(t, tc.wantTools, tools(offline), "offline")
			assert.Equal(t, tc.wantTools, tools(online), "online")
		})
	}
	t.Run("since keeps all keys of an entry", func(t *testing.T) {
		offline, online := c.audits(verify.Opts{Filter: verify.AuditFilter{SinceSeq: 7}})
		for _, a := range []*verify.Audit{offline, online} {
			require.Len(t, a.RepeatedFailures, 1)
			assert.Equal(t, []string{"refund-a-0001", "refund-b-0002", "refund-c-0003"}, a.RepeatedFailures[0].Keys)
		}
	})
	t.Run("incremental", func(t *testing.T) {
		rd, err := sqlite.OpenReader(context.Background(), c.path, sqlite.Options{})
		require.NoError(t, err)
		defer rd.Close()
		for _, tc := range []struct {
			pinned    uint64
			wantTools []string
		}{{6, []string{"payments.refund"}}, {5, []string{"payments.charge", "payments.refund"}}, {7, nil}} {
			pin := &verify.Pin{Seq: tc.pinned, Hash: mustHash(t, rd, tc.pinned)}
			rep, err := verify.New(rd, verify.Opts{Pinned: pin, Incremental: true, Now: c.clock.Now}).Check(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tc.wantTools, tools(rep.Audit), "pinned at %d", tc.pinned)
		}
	})
}

// TestVerifier_sinceSeq: the seq window applies to every member.
func TestVerifier_sinceSeq(t *testing.T) {
	path, now := buildLedger(t)
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	rep, err := verify.New(rd, verify.Opts{Now: func() time.Time { return now }, Filter: verify.AuditFilter{SinceSeq: 7}}).Check(context.Background())
	require.NoError(t, err)
	a := rep.Audit
	assert.Empty(t, a.RuntimeRetries, "the retry's reserve is seq 6")
	assert.Empty(t, a.ReInvocations, "the replay is seq 3")
	require.Len(t, a.Resolutions, 1, "the resolve is seq 9")
	require.Len(t, a.Failed, 1, "failed by seq 9")
	require.Len(t, a.Interrupted, 1, "reserved at seq 10")
	rep, err = verify.New(rd, verify.Opts{Now: func() time.Time { return now }, Filter: verify.AuditFilter{SinceSeq: 10}}).Check(context.Background())
	require.NoError(t, err)
	assert.Empty(t, rep.Audit.Resolutions)
	assert.Empty(t, rep.Audit.Failed)
	assert.Len(t, rep.Audit.Interrupted, 1)
}

func (c *calls) notApplied(key, code string) { c.t.Helper(); c.end(key, "not_applied", code, false) }

// TestVerifier_repeatedFailuresNotApplied: SPEC §4.1 — repeated_failures
// count a not_applied outcome like a failure, and a rerun of the same key
// by another execution as a repeat; not a reserve by the execution that
// recorded it (the rounds of one call), nor a not_applied whose code says
// nothing was attempted. not_applied_reruns lists every rerun.
func TestVerifier_repeatedFailuresNotApplied(t *testing.T) {
	const mail = "email.send"
	c := newCalls(t)
	c.reserve("mail-key-0001", "exec-1", mail, 1) // seq 1
	c.notApplied("mail-key-0001", "REFUSED")      // 2
	c.reserve("mail-key-0001", "exec-1", mail, 1, attempt(2))
	c.notApplied("mail-key-0001", "REFUSED")      // 4
	c.reserve("mail-key-0001", "exec-2", mail, 1) // 5: a repeat under the same key
	c.succeed("mail-key-0001")
	c.reserve("mail-key-0002", "exec-3", mail, 1)           // 7: a repeat under another key
	c.reserve("mail-key-0003", "exec-4", mail, 2)           // 8
	c.notApplied("mail-key-0003", ledger.CodeInputRequired) // 9: nothing attempted
	c.reserve("mail-key-0003", "exec-5", mail, 2)           // 10
	c.reserve("mail-key-0004", "exec-6", mail, 2)           // 11
	// A call that failed twice, then succeeded once fixed: one key, run
	// three times by three executions.
	c.reserve("mail-key-0005", "exec-7", mail, 3) // 12
	c.notApplied("mail-key-0005", "NOT_FOUND")    // 13
	c.reserve("mail-key-0005", "exec-8", mail, 3) // 14
	c.notApplied("mail-key-0005", "NOT_FOUND")    // 15
	c.reserve("mail-key-0005", "exec-9", mail, 3) // 16
	c.succeed("mail-key-0005")                    // 17
	offline, online := c.audits(verify.Opts{})
	want := []verify.RepeatedFailure{{Tool: mail, InputHash: c.hash(1), ErrorCode: "REFUSED",
		Keys:       []string{"mail-key-0001", "mail-key-0002"}, // each key once
		Executions: []string{"exec-1", "exec-2", "exec-3"}, Seqs: []uint64{2, 5, 7}},
		{Tool: mail, InputHash: c.hash(3), ErrorCode: "NOT_FOUND", Keys: []string{"mail-key-0005"},
			Executions: []string{"exec-7", "exec-8", "exec-9"}, Seqs: []uint64{13, 14, 16}}}
	slices.SortFunc(want, func(x, y verify.RepeatedFailure) int { return strings.Compare(x.InputHash, y.InputHash) })
	for src, a := range map[string]*verify.Audit{"offline": offline, "online": online} {
		assert.Equal(t, want, a.RepeatedFailures, src)
		require.Len(t, a.NotAppliedReruns, 5, src)
		assert.Equal(t, verify.NotAppliedRerun{Key: "mail-key-0001", Tool: mail, NotAppliedSeq: 2, ErrorCode: "REFUSED",
			Seq: 3, ExecutionID: "exec-1", RecordedAt: 1764475203000}, a.NotAppliedReruns[0], src)
		assert.Equal(t, []uint64{3, 5, 10, 14, 16}, []uint64{a.NotAppliedReruns[0].Seq, a.NotAppliedReruns[1].Seq,
			a.NotAppliedReruns[2].Seq, a.NotAppliedReruns[3].Seq, a.NotAppliedReruns[4].Seq}, src)
		assert.Empty(t, a.ReInvocations, "%s: a rerun after not_applied is listed there, not as a re-invocation", src)
	}
}
