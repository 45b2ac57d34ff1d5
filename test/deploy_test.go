package test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/effect-ledger/effect-ledger/testkit/testwitness"
)

// TestDeploy_metricNames checks that the Grafana dashboard and the
// Prometheus alert rules in deploy/ parse and use only metrics (and labels)
// that a real ledgerd exports: a ledgerd with periodic verification is
// driven through every kind of receipt and an error, then scraped.
// (promtool checks the rules' syntax and runs their unit tests in CI.)
func TestDeploy_metricNames(t *testing.T) {
	t.Parallel()
	// A witness that knows none of the log's keys (403), so that the
	// witness errors are exported too.
	dir := t.TempDir()
	key := newRotationKey(t, dir, "log.key", "ex.test")
	other := newRotationKey(t, dir, "other.key", "ex.test")
	w, err := testwitness.New("w.test", other.vkey, "ex.test/default")
	require.NoError(t, err)
	refusing := httptest.NewServer(w)
	t.Cleanup(refusing.Close)
	wvkey := w.VerifierKey()
	l := startPopulated(t, "--verify-every", "1h", "--signing-key", key.file, "--log-origin", "ex.test",
		"--checkpoint-interval", "50ms", "--witness", wvkey+"="+refusing.URL)
	r := l.Do("POST", "/v1/effects/charge-0003/resolve", `{"outcome":"failed","error":{"code":"NOT_CHARGED"},"note":"checked"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	require.Equal(t, 404, l.Do("GET", "/v1/effects/no-such-key-1", "").Status)
	// A reconcile (SPEC §15) no rule allows.
	r = l.Do("POST", "/v1/effects/charge-0003/reconcile", `{"outcome":"succeeded","external_ref":"ch_1","evidence":{"lookup":"q","answer":{}}}`)
	require.Equal(t, 403, r.Status, r.Raw)
	// A reserve that waits (wait_ms) for a busy key and gives up.
	r = l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"deploy-busy-0001","execution_id":"e1","tool":"t.x","effect":"write"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	r = l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"deploy-busy-0001","execution_id":"e2","tool":"t.x","effect":"write","wait_ms":20}`)
	require.Equal(t, 409, r.Status, r.Raw)
	// An approval (SPEC §13): a policy, an ask, its answer and its consumer.
	require.Equal(t, 201, l.Do("POST", "/v1/namespaces", `{"name":"gated"}`).Status)
	r = l.Do("PUT", "/v1/namespaces/gated/policy", `{"rules":[{"tool":"pay.*","approval":"required"}]}`)
	require.Equal(t, 200, r.Status, r.Raw)
	ask := `{"idempotency_key":"deploy-ask-0001","execution_id":"e1","tool":"pay.x","effect":"external","input":{}}`
	r = l.Do("POST", "/v1/ns/gated/effects/reserve", ask)
	require.Equal(t, 202, r.Status, r.Raw)
	r = l.Do("POST", fmt.Sprintf("/v1/ns/gated/approvals/%d", num(t, r.Body, "approval", "seq")), `{"decision":"approve"}`)
	require.Equal(t, 201, r.Status, r.Raw)
	r = l.Do("POST", "/v1/ns/gated/effects/reserve", ask)
	require.Equal(t, 201, r.Status, r.Raw)

	var exported map[string]map[string]bool
	require.Eventually(t, func() bool {
		exported = scrape(t, l)
		return exported["ledger_verify_runs_total"] != nil && exported["ledger_audit_repeated_failure_keys"] != nil &&
			exported["ledger_approvals_pending"] != nil &&
			exported["ledger_wal_checkpoints_total"] != nil && exported["ledger_witness_errors_total"] != nil
	}, 60*time.Second, 100*time.Millisecond, "the first verification run, its audit, a WAL checkpoint and a witness's refusal are exported")
	for _, name := range []string{"ledger_reserve_outcomes_total", "ledger_commit_outcomes_total",
		"ledger_resolve_outcomes_total", "ledger_receipts_appended_total", "ledger_http_errors_total",
		"ledger_writer_ready", "ledger_build_info", "ledger_reserve_waits_total", "ledger_approvals_total",
		"ledger_reconciliations_total"} {
		require.NotNil(t, exported[name], "%s is exported after this traffic", name)
	}

	t.Run("dashboard", func(t *testing.T) {
		raw, err := os.ReadFile("../deploy/grafana/ledgerd.json")
		require.NoError(t, err)
		var dash struct {
			Title  string            `json:"title"`
			UID    string            `json:"uid"`
			Panels []json.RawMessage `json:"panels"`
		}
		require.NoError(t, json.Unmarshal(raw, &dash), "the dashboard is JSON")
		require.NotEmpty(t, dash.UID)
		exprs := dashboardExprs(t, raw)
		require.GreaterOrEqual(t, len(exprs), 20, "every panel has a query")
		used := map[string]bool{}
		for _, e := range exprs {
			for _, name := range checkExpr(t, e.expr, e.legend, exported) {
				used[name] = true
			}
		}
		// Every ledger metric is on the dashboard.
		for name := range exported {
			if strings.HasPrefix(name, "ledger_") && !used[name] && !used[strings.TrimSuffix(name, "_bucket")] {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
				if !used[base+"_bucket"] && !used[base+"_sum"] && !used[base+"_count"] {
					t.Errorf("%s is exported but on no panel", name)
				}
			}
		}
	})

	t.Run("alerts", func(t *testing.T) {
		raw, err := os.ReadFile("../deploy/prometheus/alerts.yml")
		require.NoError(t, err)
		var rules struct {
			Groups []struct {
				Name  string `yaml:"name"`
				Rules []struct {
					Alert string `yaml:"alert"`
					Expr  string `yaml:"expr"`
				} `yaml:"rules"`
			} `yaml:"groups"`
		}
		require.NoError(t, yaml.Unmarshal(raw, &rules))
		var alerts []string
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				alerts = append(alerts, r.Alert)
				checkExpr(t, r.Expr, "", exported)
			}
		}
		for _, want := range []string{"LedgerVerificationViolations", "LedgerVerificationStale", "LedgerNotReady",
			"LedgerHTTP5xxRate", "LedgerWriterBatchSlow", "LedgerKeysAwaitingPerson"} {
			assert.Contains(t, alerts, want)
		}
	})
}

// scrape returns every metric family ledgerd exports with its label names;
// a histogram also appears as _bucket (with le), _sum and _count.
func scrape(t *testing.T, l *Ledgerd) map[string]map[string]bool {
	t.Helper()
	fams := metricFamilies(t, l)
	out := map[string]map[string]bool{}
	add := func(name string, labels map[string]bool) {
		if out[name] == nil {
			out[name] = map[string]bool{}
		}
		for k := range labels {
			out[name][k] = true
		}
	}
	for name, f := range fams {
		labels := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = true
			}
		}
		add(name, labels)
		if f.GetType() == dto.MetricType_HISTOGRAM {
			add(name+"_sum", labels)
			add(name+"_count", labels)
			add(name+"_bucket", labels)
			out[name+"_bucket"]["le"] = true
		}
	}
	return out
}

type panelExpr struct{ expr, legend string }

// dashboardExprs returns every query of the dashboard: panel targets (rows
// included) and templating queries.
func dashboardExprs(t *testing.T, raw []byte) []panelExpr {
	var dash map[string]any
	require.NoError(t, json.Unmarshal(raw, &dash))
	var out []panelExpr
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if e, ok := v["expr"].(string); ok {
				legend, _ := v["legendFormat"].(string)
				out = append(out, panelExpr{expr: e, legend: legend})
			}
			if d, ok := v["definition"].(string); ok {
				if m := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*),\s*([a-zA-Z_]+)\)$`).FindStringSubmatch(d); m != nil {
					out = append(out, panelExpr{expr: m[1], legend: "{{" + m[2] + "}}"})
				} else {
					t.Errorf("templating query %q is not label_values(metric, label)", d)
				}
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(dash)
	return out
}

// PromQL words that are not metric names: modifiers, set operators and
// aggregation operators (which may be followed by "by (…)" before their
// parenthesis).
var promqlWords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true,
	"sum": true, "avg": true, "min": true, "max": true, "count": true, "group": true, "stddev": true,
	"stdvar": true, "topk": true, "bottomk": true, "quantile": true, "count_values": true,
}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = map[string]bool{"job": true, "instance": true}

var (
	stringLit   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	rangeLit    = regexp.MustCompile(`\[[^\]]*\]`)
	selectorRe  = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}`)
	matcherRe   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	groupingRe  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	identRe     = regexp.MustCompile(`\$?[a-zA-Z_:][a-zA-Z0-9_:]*`)
	legendLabel = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
)

// checkExpr reports every metric name in a PromQL expression that ledgerd
// does not export, every label a selector, a grouping or the legend uses
// that none of the expression's metrics has, and returns the metric names.
func checkExpr(t *testing.T, expr, legend string, exported map[string]map[string]bool) []string {
	t.Helper()
	e := stringLit.ReplaceAllString(expr, `""`)
	e = rangeLit.ReplaceAllString(e, "")

	// Labels in selectors belong to the selector's metric.
	var names []string
	labelsOf := map[string]bool{}
	for _, m := range selectorRe.FindAllStringSubmatch(e, -1) {
		for _, mm := range matcherRe.FindAllStringSubmatch(m[2], -1) {
			if m[1] != "" && exported[m[1]] != nil && !exported[m[1]][mm[1]] && !targetLabels[mm[1]] {
				t.Errorf("%q: %s has no label %q", expr, m[1], mm[1])
			}
		}
	}
	grouping := groupingRe.FindAllStringSubmatch(e, -1)
	e = groupingRe.ReplaceAllString(e, "$1")
	e = regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(e, "")
	for _, loc := range identRe.FindAllStringIndex(e, -1) {
		word := e[loc[0]:loc[1]]
		rest := strings.TrimLeft(e[loc[1]:], " ")
		switch {
		case strings.HasPrefix(word, "$"), promqlWords[strings.ToLower(word)], strings.HasPrefix(rest, "("):
			continue // a dashboard variable, a keyword, a function
		case word == "up":
			names = append(names, word) // made by Prometheus for every target
			continue
		}
		if exported[word] == nil {
			t.Errorf("%q: ledgerd exports no metric %q", expr, word)
			continue
		}
		names = append(names, word)
		for l := range exported[word] {
			labelsOf[l] = true
		}
	}
	for l := range targetLabels {
		labelsOf[l] = true
	}
	for _, g := range grouping {
		for _, l := range strings.Split(g[2], ",") {
			if l = strings.TrimSpace(l); l != "" && !labelsOf[l] {
				t.Errorf("%q: groups by %q, a label none of %v has", expr, l, names)
			}
		}
	}
	for _, m := range legendLabel.FindAllStringSubmatch(legend, -1) {
		if !labelsOf[m[1]] {
			t.Errorf("%q: legend %q names label %q, which none of %v has", expr, legend, m[1], names)
		}
	}
	if len(names) == 0 {
		t.Errorf("%q names no metric", expr)
	}
	sort.Strings(names)
	return slices.Compact(names)
}
