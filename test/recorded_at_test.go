package test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recordedAts returns the seq and recorded_at of every receipt ledgerd
// serves, in seq order.
func recordedAts(t *testing.T, l *Ledgerd) (seqs, ats []int64) {
	t.Helper()
	r := l.Do("GET", "/v1/receipts?limit=1000", "")
	require.Equal(t, 200, r.Status, r.Raw)
	for _, x := range r.Body["receipts"].([]any) {
		m := x.(map[string]any)
		seqs = append(seqs, int64(m["seq"].(float64)))
		ats = append(ats, int64(m["recorded_at"].(float64)))
	}
	return seqs, ats
}

// TestLedgerd_clockStepsBackAcrossRestart: ledgerd restarted with its
// clock an hour behind the time it last recorded holds its time at the
// chain's last recorded_at, so recorded times never decrease and the
// chain verifies; the lease of a reservation made then runs from the held
// time. A chain edited so that a receipt precedes its predecessor is
// named recorded_at_decreased.
func TestLedgerd_clockStepsBackAcrossRestart(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "ledger.db")
	clock := newTestClock(t, t0)
	l := clock.start(t, db)
	tok := l.Reserve(t, reserve("back-0001-abc", "exec-1", 1, true))
	clock.advance(time.Minute)
	l.Commit(t, "back-0001-abc", `{"reservation":"`+tok+`","outcome":"succeeded","external_ref":"msg_1"}`)
	require.NoError(t, l.Stop())
	held := t0 + time.Minute.Milliseconds()

	clock.set(t0 - time.Hour.Milliseconds()) // the machine's clock stepped back while ledgerd was down
	l = clock.start(t, db)
	r := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"back-0002-abc","execution_id":"exec-2","tool":"payments.charge","effect":"write","lease_ms":1000}`)
	require.Equal(t, 201, r.Status, r.Raw)
	assert.Equal(t, float64(held+1000), r.Body["lease_expires_at"], "the lease runs from the held time")
	r = l.Do("GET", "/v1/effects/back-0002-abc", "")
	require.Equal(t, 200, r.Status, r.Raw)
	assert.Equal(t, "reserved", r.Body["state"], "not interrupted at the held time")

	seqs, ats := recordedAts(t, l)
	require.Equal(t, []int64{1, 2, 3}, seqs)
	assert.Equal(t, []int64{t0, held, held}, ats, "recorded_at holds at the last recorded time")

	rep, code := verifyJSON(t, "--server", l.URL)
	assert.Equal(t, 0, code, "%+v", rep.Violations)
	assert.True(t, rep.OK, "%+v", rep.Violations)
	require.NoError(t, l.Stop())
	rep, code = verifyJSON(t, "--db", db)
	assert.Equal(t, 0, code, "%+v", rep.Violations)
	assert.True(t, rep.OK, "%+v", rep.Violations)

	// A forger (or a ledger without the hold) records seq 3 before seq 2.
	edited := copyLedger(t, db, `UPDATE receipts SET recorded_at = recorded_at - 3600000 WHERE seq = 3`)
	rep, code = verifyJSON(t, "--db", edited)
	assert.Equal(t, 1, code)
	require.Equal(t, 1, rep.rules()["recorded_at_decreased"], "%+v", rep.Violations)
	for _, v := range rep.Violations {
		if v.Rule == "recorded_at_decreased" {
			assert.Equal(t, uint64(3), v.Seq)
			assert.Contains(t, v.Detail, "1764471660000 (2025-11-30T03:01:00.000Z)", "names the receipt's time")
			assert.Contains(t, v.Detail, "1764475260000 (2025-11-30T04:01:00.000Z) of seq 2", "and the predecessor's")
		}
	}
	out, _, code := ledgerctl(t, "verify", "--db", edited)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "recorded_at_decreased")
}
