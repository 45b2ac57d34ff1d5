package ledger

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Keys waiting for something: the gauge ledger_keys_waiting counts, per
// namespace, the keys whose latest reservation has no outcome. While its
// lease runs a key is reserved (an effect in flight); once the lease has
// ended it is interrupted: the effect may or may not have happened. An
// interrupted idempotent key waits for a retry to take it over; an
// interrupted key that is not idempotent waits for a person (SPEC §4
// unsafe_resume), who reads it in ledgerctl audit and decides it with
// ledgerctl resolve. The series state="interrupted", idempotent="false"
// is the one to alert on.
//
// The counts are asked of the store (Store.OpenKeys) when /metrics is
// scraped, at most once per OpenKeysMaxAge of the ledger's clock, so a
// process whose metrics nobody reads never counts; each driver answers
// without reading every key (storage/sqlite follows the receipts it has
// not read yet, storage/postgres reads a partial index of open keys).

// OpenKeyCount is one row of Store.OpenKeys: how many keys of Namespace
// whose latest reservation has no outcome are in State (StateReserved or
// StateInterrupted), declared idempotent or not.
type OpenKeyCount struct {
	Namespace  string
	State      State
	Idempotent bool
	Keys       int
}

// OpenKeysMaxAge is how long a count of open keys serves scrapes of
// ledger_keys_waiting before the store is asked again.
const OpenKeysMaxAge = 5 * time.Second

// openKeysTimeout bounds one count, which runs inside a scrape.
const openKeysTimeout = 10 * time.Second

var keysWaitingDesc = prometheus.NewDesc("ledger_keys_waiting",
	"Keys whose latest reservation has no outcome, by namespace, state (reserved: its lease runs; interrupted: it ended "+
		"without a commit) and whether the key was declared idempotent. Interrupted keys with idempotent=\"false\" wait "+
		"for a person (ledgerctl audit, ledgerctl resolve); idempotent ones for a retry. Counted at most every 5s.",
	[]string{"namespace", "state", "idempotent"}, nil)

// openKeysGauge is the collector of ledger_keys_waiting. It counts the
// keys of the process's one Ledger (the last made by New and not yet
// closed: ledgerd and ledger-mcp make one).
type openKeysGauge struct {
	mu    sync.Mutex // guards the fields; held during a count, so scrapes share it
	l     *Ledger
	at    time.Time // when rows were counted, on l's clock
	names []string  // the namespaces at that time
	rows  []OpenKeyCount
}

var keysWaiting = &openKeysGauge{}

func init() { prometheus.MustRegister(keysWaiting) }

// Describe implements prometheus.Collector.
func (g *openKeysGauge) Describe(ch chan<- *prometheus.Desc) { ch <- keysWaitingDesc }

// Collect implements prometheus.Collector: four series per namespace,
// zeros included, from a count at most OpenKeysMaxAge old. A count that
// fails is logged and the previous one is served.
func (g *openKeysGauge) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.l == nil {
		return
	}
	if now := g.l.cfg.Now(); g.names == nil || now.Sub(g.at) >= OpenKeysMaxAge || now.Before(g.at) {
		g.count(now)
	}
	type series struct {
		ns         string
		state      State
		idempotent bool
	}
	counts := make(map[series]int, len(g.rows))
	for _, r := range g.rows {
		counts[series{r.Namespace, r.State, r.Idempotent}] += r.Keys
	}
	for _, ns := range g.names {
		for _, st := range []State{StateReserved, StateInterrupted} {
			for _, idem := range []bool{false, true} {
				k := series{ns, st, idem}
				ch <- prometheus.MustNewConstMetric(keysWaitingDesc, prometheus.GaugeValue, float64(counts[k]),
					ns, string(st), strconv.FormatBool(idem))
			}
		}
	}
}

// count asks the store for the namespaces and their open keys.
func (g *openKeysGauge) count(now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), openKeysTimeout)
	defer cancel()
	names, err := g.l.store.Namespaces(ctx)
	if err != nil {
		g.l.logger.Warn("ledger_keys_waiting: listing namespaces", "err", err)
		return
	}
	rows, err := g.l.store.OpenKeys(ctx)
	if err != nil {
		g.l.logger.Warn("ledger_keys_waiting: counting open keys", "err", err)
		return
	}
	seen := make(map[string]bool, len(names))
	for _, ns := range names {
		seen[ns] = true
	}
	for _, r := range rows { // a namespace created between the two reads
		if !seen[r.Namespace] {
			seen[r.Namespace] = true
			names = append(names, r.Namespace)
		}
	}
	g.names, g.rows, g.at = names, rows, now
}

// serve makes l the ledger the gauge counts.
func (g *openKeysGauge) serve(l *Ledger) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.l, g.names, g.rows = l, nil, nil
}

// stop stops counting l's keys, if the gauge counts them.
func (g *openKeysGauge) stop(l *Ledger) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.l == l {
		g.l, g.names, g.rows = nil, nil, nil
	}
}
