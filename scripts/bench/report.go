package main

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Result is one mode's measurement.
type Result struct {
	Mode         string         `json:"mode"`
	Clients      int            `json:"clients"`
	Seconds      float64        `json:"seconds"`
	Requests     int64          `json:"requests"`
	RequestsPerS float64        `json:"requests_per_s"`
	PairsPerS    float64        `json:"pairs_per_s,omitempty"`
	P50Ms        float64        `json:"p50_ms"`
	P99Ms        float64        `json:"p99_ms"`
	MaxMs        float64        `json:"max_ms"`
	Errors       map[string]int `json:"errors"`
	RSSMiB       float64        `json:"ledgerd_rss_mib,omitempty"`
	PeakRSSMiB   float64        `json:"ledgerd_peak_rss_mib,omitempty"`
	Receipts     uint64         `json:"receipts,omitempty"`
	CeilingRatio float64        `json:"ratio_to_http_ceiling,omitempty"`
	// CPUPerCallMs is the CPU time (user and system) of the whole process
	// per call in mode mcp, where the gateway, its ledger, the upstream
	// and the clients all run: steadier than calls/s on a shared machine.
	CPUPerCallMs float64 `json:"cpu_ms_per_call,omitempty"`
	// StartupS is how long ledgerd took to be ready when it was started
	// again on the ledger just before the run (--registered).
	StartupS float64 `json:"startup_s,omitempty"`
}

// Report is the whole run.
type Report struct {
	Machine        string   `json:"machine"`
	CPUs           int      `json:"cpus"`
	HTTPCeilingRPS float64  `json:"http_ceiling_requests_per_s"`
	Results        []Result `json:"results"`
	// Rounds sums up --rounds: requests/s medians and the rounds' ratios.
	Rounds *Rounds `json:"rounds,omitempty"`
}

// Rounds compares, round by round, two variants: one namespace and N, or
// inline and committed payloads.
type Rounds struct {
	A           string    `json:"a"`
	B           string    `json:"b"`
	MedianA     float64   `json:"median_requests_per_s_a"`
	MedianB     float64   `json:"median_requests_per_s_b"`
	Ratios      []float64 `json:"ratios"` // each round's B:A
	MedianRatio float64   `json:"median_ratio"`
}

// summarizeRounds pairs the results of --rounds (a, then b, for each
// round, whatever order they ran in).
func summarizeRounds(results []Result, a, b string) *Rounds {
	sum := &Rounds{A: a, B: b}
	var as, bs []float64
	for i := 0; i+1 < len(results); i += 2 {
		x, y := results[i].RequestsPerS, results[i+1].RequestsPerS
		as, bs = append(as, x), append(bs, y)
		if x > 0 {
			sum.Ratios = append(sum.Ratios, y/x)
		}
	}
	sum.MedianA, sum.MedianB, sum.MedianRatio = median(as), median(bs), median(sum.Ratios)
	return sum
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				model = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d CPUs, %s/%s, %s", model, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
}

// summarize folds the clients' stats into one Result: throughput and latency percentiles.
func summarize(mode string, clients int, elapsed float64, all []*stats) Result {
	res := Result{Mode: mode, Clients: clients, Seconds: elapsed, Errors: map[string]int{}}
	var lat []time.Duration
	var pairs int64
	for _, s := range all {
		lat = append(lat, s.lat...)
		pairs += s.pairs
		for k, v := range s.errors {
			res.Errors[k] += v
		}
	}
	slices.Sort(lat)
	res.Requests = int64(len(lat))
	res.RequestsPerS = float64(len(lat)) / elapsed
	if mode == "pairs" || mode == "mixed" {
		res.PairsPerS = float64(pairs) / elapsed
	}
	if len(lat) > 0 {
		pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1e6 }
		res.P50Ms, res.P99Ms, res.MaxMs = pct(0.50), pct(0.99), float64(lat[len(lat)-1])/1e6
	}
	return res
}

func printTable(rep Report) {
	fmt.Printf("machine: %s\nHTTP ceiling (trivial JSON handler, same client): %.0f requests/s\n\n", rep.Machine, rep.HTTPCeilingRPS)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tclients\trequests/s\tpairs/s\tp50 ms\tp99 ms\tmax ms\tratio\tRSS MiB\tpeak MiB\treceipts\terrors\t")
	for _, r := range rep.Results {
		errs := "-"
		if len(r.Errors) > 0 {
			var parts []string
			for k, v := range r.Errors {
				parts = append(parts, fmt.Sprintf("%s:%d", k, v))
			}
			slices.Sort(parts)
			errs = strings.Join(parts, " ")
		}
		pairs := "-"
		if r.PairsPerS > 0 {
			pairs = fmt.Sprintf("%.0f", r.PairsPerS)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%.2f\t%.2f\t%.1f\t%.2f\t%.0f\t%.0f\t%d\t%s\t\n", r.Mode, r.Clients, r.RequestsPerS, pairs,
			r.P50Ms, r.P99Ms, r.MaxMs, r.CeilingRatio, r.RSSMiB, r.PeakRSSMiB, r.Receipts, errs)
	}
	_ = tw.Flush()
	for _, r := range rep.Results {
		if r.CPUPerCallMs > 0 {
			fmt.Printf("%s: %.3f ms of CPU per call (gateway, ledger, upstream and clients, one process)\n", r.Mode, r.CPUPerCallMs)
		}
		if r.StartupS > 0 {
			fmt.Printf("%s: ledgerd restarted on the ledger was ready in %.2f s\n", r.Mode, r.StartupS)
		}
	}
	if s := rep.Rounds; s != nil {
		ratios := make([]string, len(s.Ratios))
		for i, r := range s.Ratios {
			ratios[i] = fmt.Sprintf("%.2f", r)
		}
		fmt.Printf("\n%d rounds: median requests/s %s %.0f, %s %.0f; ratio %s:%s per round %s, median %.2f\n",
			len(s.Ratios), s.A, s.MedianA, s.B, s.MedianB, s.B, s.A, strings.Join(ratios, " "), s.MedianRatio)
	}
}
