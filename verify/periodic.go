package verify

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// periodicMetrics are the metrics of periodic verification. They are
// registered when a Periodic finishes its first run, not at start-up: a
// ledgerd that does not verify exports none of them, rather than a "last
// success" of 0 that no run ever set.
//
// The audit gauges (ledger_audit_*) are what the audit found in the whole
// ledger as of the last run that completed. The ledger is append-only, so
// each only grows: alert on its increase, e.g.
// delta(ledger_audit_repeated_failure_keys[15m]) > 0. Each is a vector
// without labels so that it is exported only once a run has set it: a
// missing series means "not verified yet", never "none found" (a first run
// that fails to read the ledger registers them unset).
type periodicMetrics struct {
	lastSuccess prometheus.Gauge
	violations  prometheus.Gauge
	duration    prometheus.Gauge
	runs        *prometheus.CounterVec

	auditRuntimeRetries, auditReInvocations, auditDuplicateEffects, auditRepeatedFailures,
	auditRepeatedFailureKeys, auditResolutions *prometheus.GaugeVec
}

func newPeriodicMetrics(reg prometheus.Registerer) *periodicMetrics {
	audit := func(name, help string) *prometheus.GaugeVec {
		return register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help + " As of the last verification run."}, nil))
	}
	gauge := func(name, help string) prometheus.Gauge {
		return register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help}))
	}
	return &periodicMetrics{
		lastSuccess: gauge("ledger_verify_last_success_timestamp_seconds",
			"Unix time of the last verification run that found no violation (0: none yet)."),
		violations: gauge("ledger_verify_violations",
			"Violations found by the last verification run (0 when intact)."),
		duration: gauge("ledger_verify_duration_seconds",
			"Duration of the last verification run."),
		runs: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledger_verify_runs_total",
			Help: "Verification runs by result: ok, violations or error.",
		}, []string{"result"})),
		auditRuntimeRetries: audit("ledger_audit_runtime_retries",
			"Runtime retries in the ledger: reserves of a key by the same execution with a higher attempt."),
		auditReInvocations: audit("ledger_audit_re_invocations",
			"Re-invocations in the ledger: receipts of a key by an execution other than its first (deduplicated replays, takeovers, retries)."),
		auditDuplicateEffects: audit("ledger_audit_duplicate_effects",
			"Duplicate effects in the ledger: (tool, input_hash) pairs that succeeded under more than one key."),
		auditRepeatedFailures: audit("ledger_audit_repeated_failures",
			"Repeated failures in the ledger: (tool, input_hash) pairs whose effect failed and that were reserved again under a new key afterwards."),
		auditRepeatedFailureKeys: audit("ledger_audit_repeated_failure_keys",
			"Keys that ran a failed call again unchanged: each key reserved for a (tool, input_hash) after its effect failed under another key. A loop makes it climb."),
		auditResolutions: audit("ledger_audit_resolutions",
			"Operator resolutions in the ledger."),
	}
}

// register registers c with reg, or returns the collector already
// registered under its name (a second Periodic in the process).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	return c // registered, or (never with these fixed definitions) left unexported
}

// auditTotals counts the audit's events in the whole ledger.
type auditTotals struct {
	runtimeRetries, reInvocations, duplicateEffects, repeatedFailures, repeatedFailureKeys, resolutions int
}

// plus adds the events after from of an audit made with from as its
// pinned head: an incremental run lists only entries with an event after
// from (their earlier events were counted by the run that pinned from).
func (t auditTotals) plus(a *Audit, from uint64) auditTotals {
	after := func(seq uint64) int {
		if seq > from {
			return 1
		}
		return 0
	}
	for _, r := range a.RuntimeRetries {
		for _, s := range r.Seqs {
			t.runtimeRetries += after(s)
		}
	}
	for _, r := range a.ReInvocations {
		t.reInvocations += after(r.Seq)
	}
	for _, d := range a.DuplicateEffects {
		t.duplicateEffects += after(d.Seqs[1]) // a duplicate from its second success on
	}
	for _, r := range a.RepeatedFailures {
		t.repeatedFailures += after(r.Seqs[1]) // repeated from its first repeat on
		for _, s := range r.Seqs[1:] {
			t.repeatedFailureKeys += after(s)
		}
	}
	for _, r := range a.Resolutions {
		t.resolutions += after(r.Seq)
	}
	return t
}

func (t auditTotals) export(m *periodicMetrics) {
	m.auditRuntimeRetries.WithLabelValues().Set(float64(t.runtimeRetries))
	m.auditReInvocations.WithLabelValues().Set(float64(t.reInvocations))
	m.auditDuplicateEffects.WithLabelValues().Set(float64(t.duplicateEffects))
	m.auditRepeatedFailures.WithLabelValues().Set(float64(t.repeatedFailures))
	m.auditRepeatedFailureKeys.WithLabelValues().Set(float64(t.repeatedFailureKeys))
	m.auditResolutions.WithLabelValues().Set(float64(t.resolutions))
}

// Periodic verifies a ledger database every Every: a full run first, then
// incremental runs from the last head verified clean. A run with
// violations does not move the pinned head, so they are reported again
// on every run until someone acts. Each completed run exports the audit's
// totals (ledger_audit_*), carried across incremental runs.
type Periodic struct {
	Src    DB
	Every  time.Duration
	Logger *slog.Logger
	// MaxLogged bounds the violations logged per run (default 20).
	MaxLogged int
	// Registerer receives the metrics after the first run (default
	// prometheus.DefaultRegisterer).
	Registerer prometheus.Registerer
	// Now is the clock runs are timed by (default time.Now).
	Now func() time.Time

	pin     *Pin
	totals  auditTotals // the audit's totals up to pin
	metrics *periodicMetrics

	mu          sync.Mutex
	last        *Run
	lastSuccess time.Time
}

// Run is the outcome of one periodic verification run.
type Run struct {
	Started     time.Time
	Duration    time.Duration
	Incremental bool
	// Report is the run's report; nil when the ledger could not be read.
	Report *Report
	// Err is why the ledger could not be read; nil when Report is set.
	Err error
}

// Status is what the periodic verifier has done so far.
type Status struct {
	Every time.Duration
	// Last is the latest finished run; nil before the first one ends.
	Last *Run
	// LastSuccess is when the latest run without violations ended; zero
	// if none has.
	LastSuccess time.Time
}

// periodicStateBudget bounds the key states of a full run inside the
// daemon, which shares its memory with the writer's page cache.
const periodicStateBudget = 16 << 20

// Status returns the latest finished run. It is safe to call while Run
// runs.
func (p *Periodic) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Status{Every: p.Every, LastSuccess: p.lastSuccess}
	if p.last != nil {
		last := *p.last
		st.Last = &last
	}
	return st
}

func (p *Periodic) record(r Run) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = &r
	if r.Report != nil && r.Report.OK {
		p.lastSuccess = r.Started.Add(r.Duration)
	}
}

// Run verifies until ctx is done.
func (p *Periodic) Run(ctx context.Context) {
	if p.MaxLogged <= 0 {
		p.MaxLogged = 20
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.Once(ctx)
		t.Reset(p.Every)
	}
}

// Once runs one verification and records its outcome.
func (p *Periodic) Once(ctx context.Context) *Report {
	now := p.Now
	if now == nil {
		now = time.Now
	}
	start := now()
	incremental := p.pin != nil
	rep, err := New(p.Src, Opts{Pinned: p.pin, Incremental: incremental, MaxViolations: p.MaxLogged,
		StateBudget: periodicStateBudget}).Check(ctx)
	end := now()
	elapsed := end.Sub(start)
	if ctx.Err() != nil {
		return nil // stopped: not a run
	}
	if p.metrics == nil {
		reg := p.Registerer
		if reg == nil {
			reg = prometheus.DefaultRegisterer
		}
		p.metrics = newPeriodicMetrics(reg)
	}
	m := p.metrics
	m.duration.Set(elapsed.Seconds())
	if err != nil {
		m.runs.WithLabelValues("error").Inc()
		p.Logger.ErrorContext(ctx, "ledger verification could not run", "err", err)
		p.record(Run{Started: start, Duration: elapsed, Incremental: incremental, Err: err})
		return nil
	}
	var from uint64
	if p.pin != nil {
		from = p.pin.Seq
	}
	totals := p.totals.plus(rep.Audit, from)
	totals.export(m)
	if n := totals.repeatedFailureKeys - p.totals.repeatedFailureKeys; n > 0 && from > 0 {
		// Only for what was appended since the last clean run: the first
		// run's history is in the gauges, not worth a warning at each start.
		p.Logger.WarnContext(ctx, "failed calls run again unchanged under new keys (ledgerctl audit lists them)",
			"new_repeat_keys", n, "repeated_failures", totals.repeatedFailures)
	}
	switch {
	case !rep.OK:
		m.runs.WithLabelValues("violations").Inc()
		m.violations.Set(float64(rep.ViolationsTotal))
		p.Logger.ErrorContext(ctx, "LEDGER INTEGRITY VIOLATIONS", "violations", rep.ViolationsTotal,
			"receipts", rep.Receipts, "head_seq", rep.Head.Seq, "duration", elapsed)
		for _, v := range rep.Violations {
			p.Logger.ErrorContext(ctx, "ledger violation", "seq", v.Seq, "rule", v.Rule, "detail", v.Detail)
		}
	default:
		m.runs.WithLabelValues("ok").Inc()
		m.violations.Set(0)
		m.lastSuccess.Set(float64(end.Unix()))
		head := rep.Head
		p.pin, p.totals = &head, totals
		p.Logger.InfoContext(ctx, "ledger verified", "receipts", rep.Receipts, "checked", rep.Checked,
			"head_seq", head.Seq, "duration", elapsed)
	}
	p.record(Run{Started: start, Duration: elapsed, Incremental: incremental, Report: rep})
	return rep
}
