package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/chain"
)

// TestVerify_retentionOfHeldCalls (SPEC §13, §14) through the real
// binaries on SQLite and PostgreSQL: ledgerd's sweep spares an ask still
// waiting for its approver, an ask approved and not consumed, and that
// approval, and an ask and approval consumed by a reserve not committed
// yet (its generation's), and erases those a committed reserve consumed;
// `ledgerctl verify --db`, full and --incremental, finds the ledger
// clean. A sweep forged to list the spared receipts is erase_invalid,
// once per key, on both runs.
func TestVerify_retentionOfHeldCalls(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testRetentionOfHeldCalls)
}

func testRetentionOfHeldCalls(t *testing.T, db string) {
	clock := newTestClock(t, t0)
	l := clock.start(t, db, "--default-payloads", "committed", "--retention-interval", "20ms")
	r := l.Do("PUT", "/v1/namespaces/default/policy", `{"retention":{"payloads_ms":60000},
		"rules":[{"tool":"payments.*","approval":"required","expires_in_ms":86400000}]}`)
	require.Equal(t, 200, r.Status, r.Raw)
	held := func(key string) uint64 {
		a := l.Do("POST", "/v1/effects/reserve", refundBody(key, "exec-1", 7, `,"approval_summary":"a refund for `+key+`"`))
		require.Equal(t, 202, a.Status, a.Raw)
		return uint64(num(t, a.Body, "approval", "seq"))
	}
	approve := func(ask uint64) uint64 {
		a := l.Do("POST", fmt.Sprintf("/v1/approvals/%d", ask), `{"decision":"approve","note":"checked"}`)
		require.Equal(t, 201, a.Status, a.Raw)
		return uint64(num(t, a.Body, "answer", "seq"))
	}
	waiting := held("held-key-0001")
	approvedAsk := held("held-key-0002")
	approval := approve(approvedAsk)
	consumedAsk := held("held-key-0003")
	consumed := approve(consumedAsk)
	tok := l.Reserve(t, refundBody("held-key-0003", "exec-1", 7, ""))
	l.Commit(t, "held-key-0003", `{"reservation":"`+tok+`","outcome":"succeeded","result":{"to":"Jane"}}`)
	inFlightAsk := held("held-key-0004")
	inFlightApproval := approve(inFlightAsk)
	l.Reserve(t, refundBody("held-key-0004", "exec-1", 7, "")) // consumes it; never committed

	state := filepath.Join(t.TempDir(), "state.json")
	rep, code := verifyJSON(t, "--db", db, "--state", state)
	require.Equal(t, 0, code, "%+v", rep.Violations)
	head := func() uint64 { return uint64(l.Do("GET", "/v1/head", "").Body["seq"].(float64)) }
	before := head()
	require.Equal(t, before, rep.Head.Seq)
	clock.advance(61 * time.Second)
	require.Eventually(t, func() bool { return head() == before+1 }, 20*time.Second, 20*time.Millisecond, "one sweep erased")
	sweep := before + 1
	e := l.Do("GET", fmt.Sprintf("/v1/erasures/%d", sweep), "")
	require.Equal(t, 200, e.Status, e.Raw)
	require.Equal(t, true, e.Body["retention"])
	var listed []uint64
	for _, rg := range e.Body["ranges"].([]any) {
		for s := uint64(rg.([]any)[0].(float64)); s <= uint64(rg.([]any)[1].(float64)); s++ {
			listed = append(listed, s)
		}
	}
	assert.Subset(t, listed, []uint64{consumedAsk, consumed}, "a consumed ask and approval are erased")
	for _, s := range []uint64{waiting, approvedAsk, approval, inFlightAsk, inFlightApproval} {
		assert.NotContains(t, listed, s, "receipt %d is spared", s)
	}
	require.NoError(t, l.Stop())
	rep, code = verifyJSON(t, "--db", db)
	require.Equal(t, 0, code, "the ledger's own sweep: %+v", rep.Violations)

	forgeRetentionSweep(t, db, sweep, listed, waiting, approvedAsk, approval, inFlightAsk, inFlightApproval)
	for _, args := range [][]string{{"--db", db}, {"--db", db, "--state", state, "--incremental"}} {
		rep, code := verifyJSON(t, args...)
		assert.Equal(t, 1, code, "%v", args)
		assert.Equal(t, map[string]int{"erase_invalid": 3}, rep.rules(), "%v: one per key: %+v", args, rep.Violations)
		consumedBy := 0
		for _, v := range rep.Violations {
			assert.Equal(t, sweep, v.Seq)
			if strings.Contains(v.Detail, `"held-key-0004"`) && strings.Contains(v.Detail, "consumed, whose generation") {
				consumedBy++
			}
		}
		assert.Equal(t, 1, consumedBy, "%v: the consumed ask and approval of the key in flight: %+v", args, rep.Violations)
		if len(args) > 2 {
			assert.Equal(t, uint64(1), rep.Checked, "the incremental run checks the sweep alone")
		}
	}
}

// forgeRetentionSweep rewrites the retention sweep at seq (the head) of
// the ledger db to list the receipts extra besides listed, as a forger
// would: its stored ranges and a new salt, the marks of the values it
// now erases, its receipt's set and count, its hash and the head's.
func forgeRetentionSweep(t *testing.T, db string, seq uint64, listed []uint64, extra ...uint64) {
	t.Helper()
	out, stderr, code := ledgerctl(t, "export", "--db", db)
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var rc chain.Receipt
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &rc))
	require.Equal(t, seq, rc.Seq)
	all := slices.Sorted(slices.Values(append(slices.Clone(listed), extra...)))
	ranges := chain.Ranges(all)
	salt := chain.NewSalt()
	res := chain.EraseResult{Set: chain.SetDigest(salt, ranges), Count: chain.RangesCount(ranges), Fields: chain.AllFields.Names(), Retention: true}
	rc.Result = res.Text()
	hash := rc.ComputeHash(rc.PrevHash)
	var set []string
	for _, f := range chain.PayloadFields {
		n := f.Name()
		set = append(set, fmt.Sprintf(`%[1]s = NULL, %[1]s_salt = NULL, %[1]s_erased = CASE WHEN %[1]s IS NULL THEN %[1]s_erased ELSE %[2]d END`, n, seq))
	}
	marks := strings.Join(set, ", ")
	var in []string
	for _, s := range extra {
		in = append(in, fmt.Sprint(s))
	}
	seqs := strings.Join(in, ", ")
	if strings.HasPrefix(db, "postgres") {
		conn, err := pgx.Connect(context.Background(), db)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{`ALTER TABLE erasures DISABLE TRIGGER USER`, nil},
			{`UPDATE erasures SET salt = $1, ranges = $2 WHERE namespace = 'default' AND seq = $3`, []any{salt[:], chain.RangesText(ranges), int64(seq)}},
			{`ALTER TABLE erasures ENABLE TRIGGER USER`, nil},
			{`ALTER TABLE payloads DISABLE TRIGGER USER`, nil},
			{`UPDATE payloads SET ` + marks + ` WHERE namespace = 'default' AND seq IN (` + seqs + `)`, nil},
			{`ALTER TABLE payloads ENABLE TRIGGER USER`, nil},
			{`ALTER TABLE receipts DISABLE TRIGGER USER`, nil},
			{`UPDATE receipts SET result = $1, hash = $2 WHERE namespace = 'default' AND seq = $3`, []any{rc.Result, hash[:], int64(seq)}},
			{`ALTER TABLE receipts ENABLE TRIGGER USER`, nil},
			{`UPDATE head SET hash = $1 WHERE namespace = 'default'`, []any{hash[:]}},
		} {
			_, err := conn.Exec(context.Background(), q.sql, q.args...)
			require.NoError(t, err, q.sql)
		}
		return
	}
	sdb, err := sql.Open("sqlite3", "file:"+db)
	require.NoError(t, err)
	defer sdb.Close()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`DROP TRIGGER ns_erasures_fixed`, nil},
		{`UPDATE ns_erasures SET salt = ?, ranges = ? WHERE ns = 0 AND seq = ?`, []any{salt[:], chain.RangesText(ranges), seq}},
		{`DROP TRIGGER ns_payloads_erase_only`, nil},
		{`UPDATE ns_payloads SET ` + marks + ` WHERE rid IN (SELECT rowid FROM ns_receipts WHERE ns = 0 AND seq IN (` + seqs + `))`, nil},
		{`DROP TRIGGER ns_receipts_no_update`, nil},
		{`UPDATE ns_receipts SET result = ?, hash = ? WHERE ns = 0 AND seq = ?`, []any{rc.Result, hash[:], seq}},
		{`UPDATE ns_head SET hash = ? WHERE ns = 0`, []any{hash[:]}},
	} {
		_, err := sdb.Exec(q.sql, q.args...)
		require.NoError(t, err, q.sql)
	}
}
