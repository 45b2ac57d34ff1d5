package test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// TestLedgerd_keysWaiting follows ledger_keys_waiting through the real
// ledgerd on SQLite and on PostgreSQL: a reserve counts as reserved, its
// lease end as interrupted (with nothing appended), and a resolve, a
// takeover and a commit take the key out again; the counts survive a
// restart. ledgerd's clock is moved through a file, past each lease end
// and past the count's cache (ledger.OpenKeysMaxAge).
func TestLedgerd_keysWaiting(t *testing.T) {
	t.Parallel()
	onSQLiteAndPostgres(t, testKeysWaiting)
}

func testKeysWaiting(t *testing.T, db string) {
	clock := newTestClock(t, t0)
	l := clock.start(t, db)
	next := func() { clock.advance(ledger.OpenKeysMaxAge) } // a new count at the next scrape
	require.Equal(t, map[string]float64{}, keysWaiting(t, l), "every series is there, at 0")

	reserveWith := func(key, exec string, idempotent bool) string {
		t.Helper()
		body := `{"idempotency_key":"` + key + `","execution_id":"` + exec + `","tool":"payments.refund","effect":"write","lease_ms":10000`
		if idempotent {
			body += `,"idempotent":true`
		}
		return l.Reserve(t, body+`}`)
	}
	reserveWith("refund-0001", "exec-1", false)
	first := reserveWith("mail-0001-abc", "exec-1", true)
	next()
	require.Equal(t, map[string]float64{"default/reserved/false": 1, "default/reserved/true": 1}, keysWaiting(t, l))
	clock.advance(6 * time.Second) // past both leases
	require.Equal(t, map[string]float64{"default/interrupted/false": 1, "default/interrupted/true": 1}, keysWaiting(t, l),
		"the lease ends are counted without a receipt")

	require.NoError(t, l.Stop())
	l = clock.start(t, db)
	require.Equal(t, map[string]float64{"default/interrupted/false": 1, "default/interrupted/true": 1}, keysWaiting(t, l),
		"after a restart")

	r := l.Do("POST", "/v1/effects/refund-0001/resolve", `{"outcome":"failed","error":{"code":"NOT_SENT"},"note":"the bank has no refund"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	second := reserveWith("mail-0001-abc", "exec-2", true)
	require.NotEqual(t, first, second)
	next()
	require.Equal(t, map[string]float64{"default/reserved/true": 1}, keysWaiting(t, l), "resolved, and taken over")
	l.Commit(t, "mail-0001-abc", `{"reservation":"`+second+`","outcome":"succeeded"}`)
	next()
	require.Equal(t, map[string]float64{}, keysWaiting(t, l))
}

// keysWaiting scrapes ledger_keys_waiting as "namespace/state/idempotent"
// → value, leaving out zeros after checking that the default namespace
// has all four series.
func keysWaiting(t *testing.T, l *Ledgerd) map[string]float64 {
	t.Helper()
	fams := metricFamilies(t, l)
	f := fams["ledger_keys_waiting"]
	require.NotNil(t, f, "ledger_keys_waiting is exported")
	out := map[string]float64{}
	series := 0
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		k := labels["namespace"] + "/" + labels["state"] + "/" + labels["idempotent"]
		if labels["namespace"] == "default" {
			series++
		}
		if v := m.GetGauge().GetValue(); v != 0 {
			out[k] = v
		}
	}
	require.Equal(t, 4, series, "reserved and interrupted, idempotent or not")
	return out
}
