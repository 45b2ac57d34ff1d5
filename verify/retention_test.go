package verify_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/testkit/ledgertest"
	"github.com/effect-ledger/effect-ledger/verify"
)

// heldCalls is a committed ledger with a retention of 60 s and calls held
// for approval (SPEC §13), swept by the ledger 61 s later. Its receipts,
// by seq: 1 the policy; 2 the ask of a key still waiting for its
// approver; 3 an ask approved at 4, not consumed yet; 5 an ask approved
// at 6, consumed by the reserve 7, committed at 8; 9 an ask of mail.*
// that expired unanswered (after 60 s); 10 an ask approved at 11,
// consumed by the reserve 12; 13 the first sweep, which lists 5, 6, 8
// and 9 only (10 and 11 belong to the generation 12 started, in
// flight); 14 the commit of 12; 15 the second sweep, which lists 10 and
// 11, now of a finished generation.
type heldCalls struct {
	path                                  string
	waiting, approvedAsk, approval, sweep uint64
	// consumedAsk and consumedApproval were consumed by the reserve
	// inFlight, committed at commit, between sweep and lateSweep.
	consumedAsk, consumedApproval, inFlight, commit, lateSweep uint64
}

func buildHeldCalls(t *testing.T) heldCalls {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithStore(sqlite.Options{Payloads: ledger.PayloadsCommitted}))
	ctx := context.Background()
	_, err := db.SetPolicy(ctx, json.RawMessage(`{"retention":{"payloads_ms":60000},"rules":[
		{"tool":"payments.*","approval":"required","expires_in_ms":86400000},
		{"tool":"mail.*","approval":"required","expires_in_ms":60000}]}`), "admin")
	require.NoError(t, err)
	held := func(key, tool string) uint64 {
		req := testkit.ReserveReq(key, "exec-1")
		req.Tool, req.ApprovalSummary = tool, "a refund for "+key
		r := testkit.MustReserve(t, db, req)
		require.NotNil(t, r.Ask, key)
		return r.Ask.Seq
	}
	approve := func(ask uint64) uint64 {
		v, _, err := db.Answer(ctx, ledger.AnswerRequest{Seq: ask, Decision: ledger.DecisionApprove, Note: "checked",
			Actor: "alice", Role: ledger.RoleApprover, Authenticated: true})
		require.NoError(t, err)
		return v.Answer.Seq
	}
	h := heldCalls{path: path}
	h.waiting = held("held-key-0001", "payments.refund")
	h.approvedAsk = held("held-key-0002", "payments.refund")
	h.approval = approve(h.approvedAsk)
	approve(held("held-key-0003", "payments.refund"))
	r := testkit.MustReserve(t, db, testkit.ReserveReq("held-key-0003", "exec-1"))
	require.NotNil(t, r.Approval, "the reserve consumes the approval")
	testkit.MustCommit(t, db, testkit.Succeed("held-key-0003", r.Reservation))
	held("mail-key-0001", "mail.send")
	h.consumedAsk = held("held-key-0004", "payments.refund")
	h.consumedApproval = approve(h.consumedAsk)
	r = testkit.MustReserve(t, db, testkit.ReserveReq("held-key-0004", "exec-1"))
	require.NotNil(t, r.Approval, "the reserve consumes the approval")
	h.inFlight = r.Receipt.Seq
	db.Clock.Advance(61 * time.Second)
	sweep := func(want ...uint64) uint64 {
		swept, err := db.Sweep(ctx)
		require.NoError(t, err)
		require.NotNil(t, swept)
		e, _, err := db.Erasure(ctx, swept.Receipt.Seq)
		require.NoError(t, err)
		require.Equal(t, chain.Ranges(want), e.Ranges)
		return swept.Receipt.Seq
	}
	h.sweep = sweep(5, 6, 8, 9)
	h.commit = testkit.MustCommit(t, db, testkit.Succeed("held-key-0004", r.Reservation)).Receipt.Seq
	h.lateSweep = sweep(10, 11)
	require.Equal(t, []uint64{1, 2, 3, 4, 10, 11, 12, 13, 14, 15},
		[]uint64{1, h.waiting, h.approvedAsk, h.approval, h.consumedAsk, h.consumedApproval, h.inFlight, h.sweep, h.commit, h.lateSweep})
	require.NoError(t, db.Close())
	return h
}

// forgeSweep rewrites the sweep at seq of the ledger at path to list the
// receipts extra besides its own, as a forger would: the stored ranges,
// the payload marks of the receipts added, the receipt's set and count,
// and the chain from the sweep on.
func forgeSweep(t *testing.T, path string, seq uint64, extra ...uint64) {
	t.Helper()
	var rangesText string
	var saltBytes []byte
	testkit.EditLedger(t, path, func(sdb *sql.DB) {
		require.NoError(t, sdb.QueryRow(`SELECT ranges, salt FROM ns_erasures WHERE ns = 0 AND seq = ?`, seq).Scan(&rangesText, &saltBytes))
	})
	salt, err := chain.SaltFromBytes(saltBytes)
	require.NoError(t, err)
	ranges, err := chain.ParseRanges(rangesText)
	require.NoError(t, err)
	var seqs []uint64
	for _, rg := range ranges {
		for s := rg[0]; s <= rg[1]; s++ {
			seqs = append(seqs, s)
		}
	}
	seqs = append(seqs, extra...)
	slices.Sort(seqs)
	ranges = chain.Ranges(seqs)
	res := chain.EraseResult{Set: chain.SetDigest(salt, ranges), Count: chain.RangesCount(ranges), Fields: chain.AllFields.Names(), Retention: true}
	by := strconv.FormatUint(seq, 10)
	sqls := []string{`DROP TRIGGER ns_payloads_erase_only`, `DROP TRIGGER ns_erasures_fixed`,
		`UPDATE ns_erasures SET ranges = '` + chain.RangesText(ranges) + `' WHERE ns = 0 AND seq = ` + by}
	for _, s := range extra {
		var set []string
		for _, f := range chain.PayloadFields {
			n := f.Name()
			set = append(set, fmt.Sprintf(`%s = NULL, %s_salt = NULL, %s_erased = CASE WHEN %s IS NULL THEN %s_erased ELSE %s END`, n, n, n, n, n, by))
		}
		sqls = append(sqls, `UPDATE ns_payloads SET `+strings.Join(set, ", ")+` WHERE rid = `+rid(strconv.FormatUint(s, 10)))
	}
	sqls = append(sqls, `UPDATE ns_receipts SET result = '`+res.Text()+`' WHERE ns = 0 AND seq = `+by)
	steps := stepsOf(sqls)
	steps[len(steps)-1].RehashFrom = seq
	tamper(t, path, tamperCase{Steps: steps})
}

// strategies are the ways a database is verified: a full run in one
// seq-ordered pass, a full run with the key states in key order, and an
// incremental run pinned at the receipt before seq.
func strategies(t *testing.T, path string, seq uint64) map[string]func(verify.DB) *verify.Verifier {
	t.Helper()
	rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	pinned, err := rd.GetReceipt(context.Background(), seq-1)
	require.NoError(t, err)
	pin := &verify.Pin{Seq: pinned.Seq, Hash: pinned.Hash.String()}
	return map[string]func(verify.DB) *verify.Verifier{
		"full":       func(db verify.DB) *verify.Verifier { return verify.New(db, verify.Opts{}) },
		"keyOrdered": func(db verify.DB) *verify.Verifier { return verify.NewKeyOrdered(db, verify.Opts{}) },
		"incremental": func(db verify.DB) *verify.Verifier {
			return verify.New(db, verify.Opts{Pinned: pin, Incremental: true})
		},
	}
}

// TestVerifier_retentionEraseOfHeldCall: a retention sweep spares what
// SPEC §13 still uses (SPEC §14: only receipts of keys final at the
// sweep): an ask waiting for its approver (awaiting_approval), an ask
// whose approval no reserve consumed yet, and that approval; and an ask
// and approval a reserve consumed while that reserve's generation is in
// flight (they belong to it). A sweep forged to list one of them is
// erase_invalid, on every strategy and whatever the claim budget; the
// ledger's own sweeps (an ask and approval consumed by a committed
// reserve, an ask expired unanswered; later, the consumed ask and
// approval of the generation committed since) are clean.
func TestVerifier_retentionEraseOfHeldCall(t *testing.T) {
	base := buildHeldCalls(t)
	for _, tc := range []struct {
		desc  string
		extra []uint64
		want  []string
	}{
		{"the ledger's sweeps", nil, nil},
		{"an ask waiting for its approver", []uint64{base.waiting}, []string{verify.RuleEraseInvalid}},
		{"an approved ask not consumed", []uint64{base.approvedAsk}, []string{verify.RuleEraseInvalid}},
		{"an approval not consumed", []uint64{base.approval}, []string{verify.RuleEraseInvalid}},
		{"an ask consumed by a reserve not committed", []uint64{base.consumedAsk}, []string{verify.RuleEraseInvalid}},
		{"an approval consumed by a reserve not committed", []uint64{base.consumedApproval}, []string{verify.RuleEraseInvalid}},
		{"both, one key", []uint64{base.consumedAsk, base.consumedApproval}, []string{verify.RuleEraseInvalid}},
	} {
		consumed := slices.Contains(tc.extra, base.consumedAsk) || slices.Contains(tc.extra, base.consumedApproval)
		t.Run(tc.desc, func(t *testing.T) {
			path := tamperedCopy(t, base.path, nil, nil, 0)
			if tc.extra != nil {
				forgeSweep(t, path, base.sweep, tc.extra...)
			}
			rd, err := sqlite.OpenReader(context.Background(), path, sqlite.Options{})
			require.NoError(t, err)
			defer rd.Close()
			for name, newV := range strategies(t, path, base.sweep) {
				for _, budget := range []int{0, 1} { // 0: the default; 1: each sweep checked at once
					t.Run(fmt.Sprintf("%s/budget%d", name, budget), func(t *testing.T) {
						if budget > 0 {
							verify.SetRetentionClaimBudget(t, budget)
						}
						rep, err := newV(rd).Check(context.Background())
						require.NoError(t, err)
						assert.ElementsMatch(t, tc.want, rules(rep), "%+v", rep.Violations)
						for _, v := range rep.Violations {
							assert.Equal(t, base.sweep, v.Seq, "reported at the sweep")
							if consumed {
								assert.Contains(t, v.Detail, fmt.Sprintf("the reserve at seq %d consumed", base.inFlight))
							}
						}
					})
				}
			}
		})
	}
}

// lookupCounter counts the reads of the reader it wraps that look up
// one key's receipts (a scan of the chain where receipts have no index by
// key) or one receipt, and the key-ordered reads.
type lookupCounter struct {
	*sqlite.Reader
	byKey, bySeq, keyScans atomic.Int64
}

func (c *lookupCounter) ListReceipts(ctx context.Context, f ledger.ReceiptFilter) ([]chain.Receipt, *uint64, error) {
	if f.Key != "" {
		c.byKey.Add(1)
	}
	return c.Reader.ListReceipts(ctx, f)
}

func (c *lookupCounter) GetReceipt(ctx context.Context, seq uint64) (*chain.Receipt, error) {
	c.bySeq.Add(1)
	return c.Reader.GetReceipt(ctx, seq)
}

func (c *lookupCounter) KeyReceipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	c.keyScans.Add(1)
	return c.Reader.KeyReceipts(ctx, after, fn)
}

// TestVerifier_retentionSweepReadsOnce: checking a retention sweep reads
// the chain a bounded number of times, whatever the receipts it lists: no
// read per key or per receipt listed (each read of a key's receipts is a
// scan of the chain where receipts have no index by key), so that the work
// grows with the receipts and the receipts listed, never with their
// product. Counted, not timed.
func TestVerifier_retentionSweepReadsOnce(t *testing.T) {
	const pairs = 300
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := ledgertest.Open(t, ledgertest.WithPath(path), ledgertest.WithStore(sqlite.Options{Payloads: ledger.PayloadsCommitted}))
	ctx := context.Background()
	_, err := db.SetPolicy(ctx, json.RawMessage(`{"retention":{"payloads_ms":60000}}`), "admin")
	require.NoError(t, err)
	for i := range pairs {
		key := fmt.Sprintf("pay-key-%04d", i)
		r := testkit.MustReserve(t, db, testkit.ReserveReq(key, "exec-1"))
		testkit.MustCommit(t, db, testkit.Succeed(key, r.Reservation))
	}
	db.Clock.Advance(61 * time.Second)
	swept, err := db.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(pairs), swept.Count, "every commit listed")
	require.NoError(t, db.Close())

	rd, err := sqlite.OpenReader(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	c := &lookupCounter{Reader: rd}
	rep, err := verify.New(c, verify.Opts{}).Check(ctx)
	require.NoError(t, err)
	assert.True(t, rep.OK, "%+v", rep.Violations)
	assert.Zero(t, c.byKey.Load(), "reads of one key's receipts")
	assert.LessOrEqual(t, c.bySeq.Load(), int64(2), "reads of one receipt")
	assert.Equal(t, int64(1), c.keyScans.Load(), "key-ordered reads")

	verify.SetRetentionClaimBudget(t, 100)
	c = &lookupCounter{Reader: rd}
	rep, err = verify.New(c, verify.Opts{}).Check(ctx)
	require.NoError(t, err)
	assert.True(t, rep.OK, "%+v", rep.Violations)
	assert.Equal(t, int64(1), c.keyScans.Load(), "a list beyond the budget is checked at once, in one read")
}
