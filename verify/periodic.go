package verify

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics of periodic verification.
var (
	verifyLastSuccess = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "ledger_verify_last_success_timestamp_seconds",
		Help: "Unix time of the last verification run that found no violation.",
	})
	verifyViolations = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "ledger_verify_violations",
		Help: "Violations found by the last verification run (0 when intact).",
	})
	verifyDuration = promauto.NewGauge(prometheus.GaugeOpts{
		Name: "ledger_verify_duration_seconds",
		Help: "Duration of the last verification run.",
	})
	verifyRuns = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "ledger_verify_runs_total",
		Help: "Verification runs by result: ok, violations or error.",
	}, []string{"result"})
)

// Periodic verifies a source every Every: a full run first, then
// incremental runs from the last head verified clean. A run with
// violations does not move the pinned head, so they are reported again
// on every run until someone acts.
type Periodic struct {
	Src    Source
	Every  time.Duration
	Logger *slog.Logger
	// MaxLogged bounds the violations logged per run (default 20).
	MaxLogged int

	pin *Pin
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
	start := time.Now()
	rep, err := New(p.Src, Opts{Pinned: p.pin, Incremental: p.pin != nil, MaxViolations: p.MaxLogged}).Check(ctx)
	elapsed := time.Since(start)
	verifyDuration.Set(elapsed.Seconds())
	switch {
	case err != nil:
		if ctx.Err() == nil {
			verifyRuns.WithLabelValues("error").Inc()
			p.Logger.ErrorContext(ctx, "ledger verification could not run", "err", err)
		}
		return nil
	case !rep.OK:
		verifyRuns.WithLabelValues("violations").Inc()
		verifyViolations.Set(float64(rep.ViolationsTotal))
		p.Logger.ErrorContext(ctx, "LEDGER INTEGRITY VIOLATIONS", "violations", rep.ViolationsTotal,
			"receipts", rep.Receipts, "head_seq", rep.Head.Seq, "duration", elapsed)
		for _, v := range rep.Violations {
			p.Logger.ErrorContext(ctx, "ledger violation", "seq", v.Seq, "rule", v.Rule, "detail", v.Detail)
		}
	default:
		verifyRuns.WithLabelValues("ok").Inc()
		verifyViolations.Set(0)
		verifyLastSuccess.Set(float64(time.Now().Unix()))
		head := rep.Head
		p.pin = &head
		p.Logger.InfoContext(ctx, "ledger verified", "receipts", rep.Receipts, "checked", rep.Checked,
			"head_seq", head.Seq, "duration", elapsed)
	}
	return rep
}
