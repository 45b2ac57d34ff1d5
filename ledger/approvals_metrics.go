package ledger

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Pending approvals (SPEC §13): ledger_approvals_pending counts, per
// namespace, the asks that wait for a person, and
// ledger_approvals_oldest_pending_ratio is how much of its expiry the
// longest-waiting one has used (0 … 1): the alert fires past 0.5, while a
// person still has time to answer. Counted when /metrics is scraped, at
// most once per OpenKeysMaxAge, over the namespaces this process has open;
// each count reads only the asks after the namespace's settled prefix
// (asks answered or expired never wait again).

var (
	approvalsPendingDesc = prometheus.NewDesc("ledger_approvals_pending",
		"Asks waiting for a person's answer (SPEC §13), by namespace. Counted at most every 5s over the open namespaces.",
		[]string{"namespace"}, nil)
	approvalsOldestDesc = prometheus.NewDesc("ledger_approvals_oldest_pending_ratio",
		"Share of its expiry that the longest-waiting pending ask has used (0 to 1), by namespace; alert past 0.5.",
		[]string{"namespace"}, nil)
)

// pendingGauge is the collector of both series for the process's Ledger.
type pendingGauge struct {
	mu      sync.Mutex
	l       *Ledger
	at      time.Time
	settled map[string]uint64 // namespace → every ask at or before it is answered or expired
	rows    map[string]pendingRow
}

type pendingRow struct {
	n      int
	oldest float64
}

var approvalsPending = &pendingGauge{}

func init() { prometheus.MustRegister(approvalsPending) }

// Describe implements prometheus.Collector.
func (g *pendingGauge) Describe(ch chan<- *prometheus.Desc) {
	ch <- approvalsPendingDesc
	ch <- approvalsOldestDesc
}

// Collect implements prometheus.Collector.
func (g *pendingGauge) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.l == nil {
		return
	}
	if now := g.l.cfg.Now(); g.rows == nil || now.Sub(g.at) >= OpenKeysMaxAge || now.Before(g.at) {
		g.count(now)
	}
	for ns, r := range g.rows {
		ch <- prometheus.MustNewConstMetric(approvalsPendingDesc, prometheus.GaugeValue, float64(r.n), ns)
		ch <- prometheus.MustNewConstMetric(approvalsOldestDesc, prometheus.GaugeValue, r.oldest, ns)
	}
}

// count reads the pending asks of every open namespace.
func (g *pendingGauge) count(now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), openKeysTimeout)
	defer cancel()
	g.l.mu.Lock()
	spaces := make([]*Namespace, 0, len(g.l.spaces))
	for _, n := range g.l.spaces {
		spaces = append(spaces, n)
	}
	g.l.mu.Unlock()
	rows := make(map[string]pendingRow, len(spaces))
	ms := uint64(now.UnixMilli())
	for _, n := range spaces {
		r, err := g.countNS(ctx, n, ms)
		if err != nil {
			g.l.logger.Warn("ledger_approvals_pending: listing asks", "namespace", n.name, "err", err)
			continue
		}
		rows[n.name] = r
	}
	g.rows, g.at = rows, now
}

// countNS counts n's pending asks after its settled prefix and moves the
// prefix over the asks that can no longer wait.
func (g *pendingGauge) countNS(ctx context.Context, n *Namespace, now uint64) (pendingRow, error) {
	var r pendingRow
	after := g.settled[n.name]
	settling := true
	for {
		views, next, err := n.Approvals(ctx, "", after, MaxPageLimit)
		if err != nil {
			return r, err
		}
		for i := range views {
			v := &views[i]
			if v.State != ApprovalPending {
				if settling && (v.Answer != nil || now >= v.Ask.LeaseExpiresAt) {
					g.settled[n.name] = v.Ask.Seq
				}
				continue
			}
			settling = false
			r.n++
			if span := v.Ask.LeaseExpiresAt - v.Ask.RecordedAt; span > 0 {
				r.oldest = max(r.oldest, min(1, float64(now-min(now, v.Ask.RecordedAt))/float64(span)))
			}
		}
		if next == nil {
			return r, nil
		}
		after = *next
	}
}

// serve makes l the ledger the gauge counts.
func (g *pendingGauge) serve(l *Ledger) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.l, g.rows, g.settled = l, nil, map[string]uint64{}
}

// stop stops counting l's asks, if the gauge counts them.
func (g *pendingGauge) stop(l *Ledger) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.l == l {
		g.l, g.rows, g.settled = nil, nil, nil
	}
}
