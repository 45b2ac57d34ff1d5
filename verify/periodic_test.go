package verify_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/storage/sqlite"
	"github.com/effect-ledger/effect-ledger/testkit"
	"github.com/effect-ledger/effect-ledger/verify"
)

// gauge returns the value of an unlabelled gauge in the default registry,
// and whether it is exported at all.
func gauge(t *testing.T, reg prometheus.Gatherer, name string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestPeriodic_auditMetrics: the audit gauges appear with the first run
// and count the whole ledger across incremental runs. A registry of its
// own makes them start absent however often the test runs.
func TestPeriodic_auditMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	names := []string{"ledger_audit_runtime_retries", "ledger_audit_re_invocations", "ledger_audit_duplicate_effects",
		"ledger_audit_repeated_failures", "ledger_audit_repeated_failure_keys", "ledger_audit_resolutions"}
	for _, n := range names {
		_, ok := gauge(t, reg, n)
		assert.False(t, ok, "%s before any verification", n)
	}

	c := newCalls(t)
	c.reserve("refund-a-0001", "exec-1", "payments.refund", 7, idempotent())
	c.fail("refund-a-0001", "TIMEOUT", true)
	c.reserve("refund-a-0001", "exec-1", "payments.refund", 7, idempotent(), attempt(2)) // runtime retry
	c.reserve("refund-b-0002", "exec-2", "payments.refund", 7)                           // repeat 1
	c.succeed("refund-b-0002")
	c.reserve("charge-a-0001", "exec-3", "payments.charge", 1, lease(10))
	c.resolveFailed("charge-a-0001", "NOT_CHARGED") // resolution

	rd, err := sqlite.OpenReader(context.Background(), c.path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	p := &verify.Periodic{Src: rd, Logger: quiet, Registerer: reg}
	want := func(desc string, vals ...float64) {
		t.Helper()
		for i, n := range names {
			got, ok := gauge(t, reg, n)
			assert.True(t, ok, "%s: %s exported", desc, n)
			assert.Equal(t, vals[i], got, "%s: %s", desc, n)
		}
	}
	rep := p.Once(context.Background())
	require.NotNil(t, rep)
	require.True(t, rep.OK)
	want("full run", 1, 0, 0, 1, 1, 1)

	rep = p.Once(context.Background())
	require.NotNil(t, rep)
	assert.Less(t, rep.Checked, rep.Receipts, "the second run is incremental")
	want("incremental run, nothing new", 1, 0, 0, 1, 1, 1)

	c.reserve("refund-c-0003", "exec-4", "payments.refund", 7) // repeat 2 of the same call
	c.succeed("refund-c-0003")                                 // refund-b and refund-c both succeeded
	c.reserve("charge-b-0002", "exec-5", "payments.charge", 1) // repeat of the resolved failure
	require.NotNil(t, p.Once(context.Background()))
	want("incremental run, new repeats", 1, 0, 1, 2, 3, 1)

	res, err := c.db.Reserve(context.Background(), ledger.ReserveRequest{IdempotencyKey: "refund-b-0002",
		ExecutionID: "exec-6", Tool: "payments.refund", Effect: "write", Input: input(7)})
	require.NoError(t, err)
	require.Equal(t, ledger.StatusReplayed, res.Status, "a deduplicated replay: a re-invocation")
	require.NotNil(t, p.Once(context.Background()))
	want("incremental run, a replay", 1, 1, 1, 2, 3, 1)
}

// TestPeriodic_Status runs after TestPeriodic_auditMetrics, which needs the
// audit gauges unset.
func TestPeriodic_Status(t *testing.T) {
	ctx := context.Background()
	path, _ := buildLedger(t)
	rd, err := sqlite.OpenReader(ctx, path, sqlite.Options{Logger: quiet})
	require.NoError(t, err)
	defer rd.Close()
	p := &verify.Periodic{Src: rd, Every: time.Minute, Logger: quiet}

	t.Run("BeforeFirstRun", func(t *testing.T) {
		st := p.Status()
		assert.Equal(t, time.Minute, st.Every)
		assert.Nil(t, st.Last)
		assert.True(t, st.LastSuccess.IsZero())
	})

	t.Run("OK", func(t *testing.T) {
		before := time.Now()
		require.NotNil(t, p.Once(ctx))
		st := p.Status()
		require.NotNil(t, st.Last)
		require.NotNil(t, st.Last.Report)
		assert.NoError(t, st.Last.Err)
		assert.True(t, st.Last.Report.OK)
		assert.Equal(t, uint64(10), st.Last.Report.Receipts)
		assert.False(t, st.Last.Incremental, "the first run is full")
		assert.False(t, st.Last.Started.Before(before))
		assert.False(t, st.LastSuccess.Before(st.Last.Started))

		require.NotNil(t, p.Once(ctx))
		assert.True(t, p.Status().Last.Incremental, "later runs start from the clean head")
	})

	t.Run("ErrViolations", func(t *testing.T) {
		ok := p.Status().LastSuccess
		tamper(t, path, tamperCase{Steps: []struct {
			SQL        string `json:"sql"`
			RehashFrom uint64 `json:"rehash_from"`
		}{{SQL: `UPDATE receipts SET external_ref = 'forged' WHERE seq = 7`}}})
		q := &verify.Periodic{Src: rd, Every: time.Minute, Logger: quiet}
		require.NotNil(t, q.Once(ctx))
		st := q.Status()
		require.NotNil(t, st.Last.Report)
		assert.False(t, st.Last.Report.OK)
		assert.Positive(t, st.Last.Report.ViolationsTotal)
		assert.True(t, st.LastSuccess.IsZero(), "a run with violations is no success")
		assert.Equal(t, ok, p.Status().LastSuccess, "another verifier's status is its own")
	})

	t.Run("ErrUnreadable", func(t *testing.T) {
		q := &verify.Periodic{Src: rd, Every: time.Minute, Logger: quiet}
		require.NoError(t, rd.Close())
		assert.Nil(t, q.Once(ctx))
		st := q.Status()
		require.NotNil(t, st.Last)
		assert.Nil(t, st.Last.Report)
		assert.Error(t, st.Last.Err)
	})
}

// TestPeriodic_Once checks the metrics of periodic verification: none
// before the first run, then the outcome of each run.
func TestPeriodic_Once(t *testing.T) {
	base, _ := buildLedger(t)
	path := filepath.Join(t.TempDir(), "t.db")
	testkit.CopyFile(t, base, path)
	ctx := context.Background()
	rd, err := sqlite.OpenReader(ctx, path, sqlite.Options{})
	require.NoError(t, err)
	defer rd.Close()
	reg := prometheus.NewPedanticRegistry()
	// Each reading of the clock is one second later: every run ends in a
	// second of its own, whatever the machine's load.
	clock := time.Unix(1_800_000_000, 0)
	tick := func() time.Time { clock = clock.Add(time.Second); return clock }
	p := &verify.Periodic{Src: rd, Every: time.Hour, Logger: quiet, Registerer: reg, Now: tick}

	mfs, err := reg.Gather()
	require.NoError(t, err)
	assert.Empty(t, mfs, "no metric before the first run")

	rep := p.Once(ctx)
	require.NotNil(t, rep)
	require.True(t, rep.OK)
	assert.Equal(t, uint64(10), rep.Checked, "the first run is a full one")
	mfs, err = reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	assert.ElementsMatch(t, []string{"ledger_verify_last_success_timestamp_seconds", "ledger_verify_violations",
		"ledger_verify_duration_seconds", "ledger_verify_runs_total",
		"ledger_audit_runtime_retries", "ledger_audit_re_invocations", "ledger_audit_duplicate_effects",
		"ledger_audit_repeated_failures", "ledger_audit_repeated_failure_keys", "ledger_audit_resolutions"}, names)
	assert.Equal(t, float64(clock.Unix()), gaugeValue(t, reg, "ledger_verify_last_success_timestamp_seconds"),
		"the end of the run")

	rep = p.Once(ctx)
	require.True(t, rep.OK)
	assert.Zero(t, rep.Checked, "later runs are incremental from the verified head")

	// A second Periodic in the process shares the registered metrics.
	p2 := &verify.Periodic{Src: rd, Every: time.Hour, Logger: quiet, Registerer: reg, Now: tick}
	require.NotNil(t, p2.Once(ctx))
	last := gaugeValue(t, reg, "ledger_verify_last_success_timestamp_seconds")
	assert.Equal(t, float64(clock.Unix()), last)

	tamper(t, path, tamperCase{Steps: []struct {
		SQL        string `json:"sql"`
		RehashFrom uint64 `json:"rehash_from"`
	}{{SQL: "UPDATE receipts SET external_ref = 're_forged' WHERE seq = 10"}}})
	rep = p.Once(ctx)
	require.NotNil(t, rep)
	assert.False(t, rep.OK)
	assert.Equal(t, float64(rep.ViolationsTotal), gaugeValue(t, reg, "ledger_verify_violations"))
	assert.Equal(t, last, gaugeValue(t, reg, "ledger_verify_last_success_timestamp_seconds"), "a failed run is no success")
	assert.Equal(t, 1.0, counterValue(t, reg, "ledger_verify_runs_total", "violations"))
	assert.Equal(t, 3.0, counterValue(t, reg, "ledger_verify_runs_total", "ok"))
}

func gaugeValue(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func counterValue(t *testing.T, reg prometheus.Gatherer, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
