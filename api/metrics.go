package api

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// namespaceLabel is the label by which metrics name a namespace.
const namespaceLabel = "namespace"

// metricsHandler serves /metrics. A token limited to namespaces sees only
// the series of its own namespaces and those about no namespace: the
// others' names and heads are not its to learn.
func metricsHandler() http.HandlerFunc {
	all := promhttp.Handler()
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok := PrincipalFromContext(r.Context())
		if !ok || len(p.Namespaces) == 0 {
			all.ServeHTTP(w, r)
			return
		}
		g := scopedGatherer{g: prometheus.DefaultGatherer, p: p}
		promhttp.HandlerFor(g, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	}
}

// scopedGatherer drops the series of namespaces outside p's scope.
type scopedGatherer struct {
	g prometheus.Gatherer
	p ledger.Principal
}

// Gather implements prometheus.Gatherer.
func (s scopedGatherer) Gather() ([]*dto.MetricFamily, error) {
	fams, err := s.g.Gather()
	out := fams[:0]
	for _, f := range fams {
		kept := f.Metric[:0]
		for _, m := range f.Metric {
			if s.visible(m) {
				kept = append(kept, m)
			}
		}
		if f.Metric = kept; len(kept) > 0 {
			out = append(out, f)
		}
	}
	return out, err
}

func (s scopedGatherer) visible(m *dto.Metric) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == namespaceLabel && !s.p.AllowsNamespace(l.GetValue()) {
			return false
		}
	}
	return true
}
