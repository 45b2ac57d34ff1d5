// Command bench load-tests a real ledgerd over HTTP.
//
//	go run ./scripts/bench [--mode pairs|reserve|replay|mixed|all] [--clients 32] [--duration 10s] [--namespaces 1] [--json]
//
// It builds ./cmd/ledgerd, starts it on a temporary database, drives it
// with N concurrent keep-alive clients for D seconds, and prints requests/s,
// pairs/s, p50/p99/max latency, errors by status and ledgerd's RSS. In the
// same run it measures the machine's HTTP ceiling (a trivial JSON handler
// driven by the same client code) and prints the ledger's ratio to it, so
// figures compare across noisy machines. All traffic stays on loopback and
// every loop is bounded by --duration.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/effect-ledger/effect-ledger/testkit/gen"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

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

// Rounds compares, round by round, one namespace with Namespaces.
type Rounds struct {
	Namespaces  int       `json:"namespaces"`
	MedianOne   float64   `json:"median_requests_per_s_1_ns"`
	MedianMany  float64   `json:"median_requests_per_s_n_ns"`
	Ratios      []float64 `json:"ratios"` // each round's N:1
	MedianRatio float64   `json:"median_ratio"`
}

// summarizeRounds pairs the results of --rounds (1 namespace, then N, for
// each round, whatever order they ran in).
func summarizeRounds(results []Result, n int) *Rounds {
	sum := &Rounds{Namespaces: n}
	var one, many []float64
	for i := 0; i+1 < len(results); i += 2 {
		a, b := results[i].RequestsPerS, results[i+1].RequestsPerS
		one, many = append(one, a), append(many, b)
		if a > 0 {
			sum.Ratios = append(sum.Ratios, b/a)
		}
	}
	sum.MedianOne, sum.MedianMany, sum.MedianRatio = median(one), median(many), median(sum.Ratios)
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

func run(ctx context.Context, args []string) error {
	o, err := parseOptions(args)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "ledger-bench-")
	if err != nil {
		return err
	}
	if !o.keep {
		defer os.RemoveAll(dir)
	}
	if o.bin == "" {
		o.bin = filepath.Join(dir, "ledgerd")
		build := exec.Command("go", "build", "-o", o.bin, "./cmd/ledgerd")
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build ledgerd: %w", err)
		}
	}
	rep := Report{Machine: machine(), CPUs: runtime.NumCPU()}
	ceiling, err := httpCeiling(ctx, o.clients, min(o.duration, 5*time.Second))
	if err != nil {
		return err
	}
	rep.HTTPCeilingRPS = ceiling
	results, err := o.measure(ctx, dir)
	if err != nil {
		return err
	}
	for _, r := range results {
		r.CeilingRatio = r.RequestsPerS / ceiling
		rep.Results = append(rep.Results, r)
	}
	if o.rounds > 0 {
		rep.Rounds = summarizeRounds(rep.Results, o.namespaces)
	}
	if o.asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printTable(rep)
	return nil
}

// options are the bench command's flags.
type options struct {
	modes                   []string
	clients                 int
	duration                time.Duration
	asJSON, keep            bool
	bin                     string
	extra                   []string
	prefill                 int
	namespaces, registered  int
	backends, withBaselines bool
	postgres                bool
	rounds                  int
}

func parseOptions(args []string) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	mode := fs.String("mode", "all", "pairs, reserve, replay, mixed or all")
	var o options
	fs.IntVar(&o.clients, "clients", 32, "concurrent HTTP clients")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long each mode runs")
	fs.BoolVar(&o.asJSON, "json", false, "print JSON")
	fs.StringVar(&o.bin, "ledgerd", "", "ledgerd binary (default: build ./cmd/ledgerd)")
	fs.BoolVar(&o.keep, "keep", false, "keep the temporary directory")
	extra := fs.String("ledgerd-args", "", "extra ledgerd flags, space-separated")
	fs.IntVar(&o.namespaces, "namespaces", 1, "spread the clients' requests evenly over this many namespaces of the one ledgerd (default, ns-2, ns-3, …; created through the API)")
	fs.IntVar(&o.registered, "registered", 0, "create this many namespaces in all (at least --namespaces; the load goes to the first --namespaces of them), then restart ledgerd and report its start-up time")
	fs.IntVar(&o.prefill, "prefill", 0, "run each mode on a copy of a ledger that already holds this many receipts (UUID-like keys and execution ids, generated once and cached in the temp directory, shared with the Go benchmarks)")
	fs.IntVar(&o.rounds, "rounds", 0, "with --namespaces N: run this many rounds, each one namespace and N (a fresh ledger each; one namespace first in odd rounds, last in even ones), and print the median of each and of the rounds' ratios N:1 (a noisy machine's speed drifts between runs: compare within rounds)")
	fs.BoolVar(&o.postgres, "postgres", false, "run the modes on PostgreSQL (a throwaway cluster, fsync on, a fresh database per mode) instead of a SQLite file")
	fs.BoolVar(&o.backends, "backends", false, "only the storage matrix: ledgerd on SQLite and on PostgreSQL (1 and 2 replicas) with 1 and 16 namespaces, pairs mode, and the hand-built PostgreSQL idempotency tables with pgbench, on one throwaway cluster (fsync on)")
	fs.BoolVar(&o.withBaselines, "baselines", false, "also measure, in the same run with the same client, an HTTP idempotency service on Redis and raw Redis pairs (appendfsync always; installs redis-server from Debian's packages when run as root), and the hand-built PostgreSQL idempotency tables, unchained and chained, with pgbench on a throwaway cluster (fsync on)")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if o.prefill < 0 {
		return options{}, fmt.Errorf("--prefill must not be negative, not %d", o.prefill)
	}
	if o.postgres && o.prefill > 0 {
		return options{}, errors.New("--prefill works on SQLite only, not with --postgres")
	}
	if o.namespaces < 1 {
		return options{}, fmt.Errorf("--namespaces must be at least 1, not %d", o.namespaces)
	}
	if o.rounds < 0 {
		return options{}, fmt.Errorf("--rounds must not be negative, not %d", o.rounds)
	}
	if o.rounds > 0 && (o.namespaces < 2 || o.registered != 0 || o.backends || o.withBaselines || *mode == "all") {
		return options{}, errors.New("--rounds compares one namespace with --namespaces N (at least 2) in one --mode, without --registered, --backends or --baselines")
	}
	if o.registered != 0 && o.registered < o.namespaces {
		return options{}, fmt.Errorf("--registered (%d) must be at least --namespaces (%d)", o.registered, o.namespaces)
	}
	o.extra = strings.Fields(*extra)
	o.modes = []string{*mode}
	if *mode == "all" {
		o.modes = []string{"pairs", "reserve", "replay", "mixed"}
	}
	if o.backends {
		o.modes = nil
	}
	return o, nil
}

// measure runs what the options ask for in dir: the storage matrix, each mode on a fresh
// ledger, and the baselines.
func (o options) measure(ctx context.Context, dir string) ([]Result, error) {
	var out []Result
	if o.backends {
		res, err := backends(ctx, dir, o.bin, o.clients, o.duration, o.extra)
		if err != nil {
			return nil, fmt.Errorf("backends: %w", err)
		}
		out = append(out, res...)
	}
	var pg *pgCluster
	if o.postgres && len(o.modes) > 0 {
		var err error
		if pg, err = startPG(dir); err != nil {
			return nil, err
		}
		defer pg.stop()
	}
	for _, m := range o.modes {
		if o.rounds > 0 {
			for r := 1; r <= o.rounds; r++ {
				// One namespace first in odd rounds, last in even ones: an
				// effect of the order cancels out. pair is (1, N) either way.
				counts, order := [2]int{1, o.namespaces}, [2]int{0, 1}
				if r%2 == 0 {
					order = [2]int{1, 0}
				}
				var pair [2]Result
				for _, i := range order {
					n := counts[i]
					res, err := o.runMode(ctx, dir, pg, m, n, fmt.Sprintf("r%d_%d", r, n))
					if err != nil {
						return nil, err
					}
					res.Mode = fmt.Sprintf("%s, %d ns, round %d", m, n, r)
					pair[i] = res
				}
				out = append(out, pair[:]...)
			}
			continue
		}
		res, err := o.runMode(ctx, dir, pg, m, o.namespaces, "")
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	if o.withBaselines {
		res, err := baselines(ctx, dir, o.clients, o.duration)
		if err != nil {
			return nil, fmt.Errorf("baselines: %w", err)
		}
		out = append(out, res...)
	}
	return out, nil
}

// runMode runs mode m on a fresh ledger (named for m and tag) with the
// load spread over namespaces namespaces.
func (o options) runMode(ctx context.Context, dir string, pg *pgCluster, m string, namespaces int, tag string) (Result, error) {
	name := m
	if tag != "" {
		name += "_" + tag
	}
	db := filepath.Join(dir, name+".db")
	if pg != nil {
		if err := pg.psql("postgres", "CREATE DATABASE mode_"+name); err != nil {
			return Result{}, err
		}
		db = pg.url("mode_" + name)
	}
	if o.prefill > 0 {
		if err := prefilled(ctx, db, o.prefill); err != nil {
			return Result{}, err
		}
	}
	l, err := startLedgerd(o.bin, db, o.extra)
	if err != nil {
		return Result{}, err
	}
	prefixes, err := createNamespaces(l.url, max(namespaces, o.registered))
	if err != nil {
		l.stop()
		return Result{}, err
	}
	prefixes = prefixes[:namespaces]
	var startup time.Duration
	if o.registered > 0 {
		l.stop()
		start := time.Now()
		if l, err = startLedgerd(o.bin, db, o.extra); err != nil {
			return Result{}, fmt.Errorf("restart with %d namespaces: %w", o.registered, err)
		}
		startup = time.Since(start)
	}
	res, err := drive(ctx, []*ledgerd{l}, prefixes, m, o.clients, o.duration)
	l.stop()
	if err != nil {
		return Result{}, err
	}
	res.StartupS = startup.Seconds()
	switch {
	case o.registered > 0:
		res.Mode = fmt.Sprintf("%s, %d of %d ns", res.Mode, namespaces, o.registered)
	case namespaces > 1:
		res.Mode = fmt.Sprintf("%s, %d ns", res.Mode, namespaces)
	}
	return res, nil
}

// createNamespaces creates namespaces ns-2 … ns-n beside the default one
// (8 requests at a time) and returns the API prefixes of all n.
func createNamespaces(url string, n int) ([]string, error) {
	prefixes := []string{"/v1"}
	for k := 2; k <= n; k++ {
		prefixes = append(prefixes, fmt.Sprintf("/v1/ns/ns-%d", k))
	}
	c := newClient(8)
	next := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for k := range next {
				name := fmt.Sprintf("ns-%d", k)
				st, b, err := call(c, "POST", url+"/v1/namespaces", []byte(fmt.Sprintf(`{"name":%q}`, name)))
				if err != nil || st != http.StatusCreated {
					errs <- fmt.Errorf("create namespace %s: %d %v %s", name, st, err, b)
					return
				}
			}
		})
	}
	var err error
feed:
	for k := 2; k <= n; k++ {
		select {
		case next <- k:
		case err = <-errs:
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err == nil && len(errs) > 0 {
		err = <-errs
	}
	return prefixes, err
}

// prefilled copies a generated ledger of n receipts and its key index to
// path, generating both once into the temp directory (the files
// BenchmarkDB_PairsRandom uses).
func prefilled(ctx context.Context, path string, n int) error {
	cached, err := gen.Cached(ctx, n, func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	})
	if err == nil {
		err = gen.Copy(cached, path)
	}
	if err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	return nil
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

// ledgerd is a running server.
type ledgerd struct {
	cmd  *exec.Cmd
	url  string
	done chan struct{}
}

func startLedgerd(bin, db string, extra []string) (*ledgerd, error) {
	args := append([]string{"--db", db, "--listen", "127.0.0.1:0", "--log-format", "json"}, extra...)
	cmd := exec.Command(bin, args...)
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	l := &ledgerd{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = pw.Close(); close(l.done) }()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var line struct {
				Msg, Addr string
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "ledgerd ready" {
				select {
				case addr <- line.Addr:
				default:
				}
			}
		}
	}()
	select {
	case a := <-addr:
		l.url = "http://" + a
		return l, nil
	case <-l.done:
		return nil, errors.New("ledgerd exited before it was ready")
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		return nil, errors.New("ledgerd not ready in 30s")
	}
}

func (l *ledgerd) stop() {
	_ = l.cmd.Process.Signal(os.Interrupt)
	select {
	case <-l.done:
	case <-time.After(30 * time.Second):
		_ = l.cmd.Process.Kill()
		<-l.done
	}
}

// rss returns VmRSS and VmHWM of pid in MiB.
func rss(pid int) (float64, float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	var cur, peak float64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			cur = kb / 1024
		case "VmHWM:":
			peak = kb / 1024
		}
	}
	return cur, peak
}

func newClient(clients int) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: clients * 2, MaxIdleConnsPerHost: clients * 2, MaxConnsPerHost: clients * 2,
		IdleConnTimeout: time.Minute, DisableCompression: true,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	}}
}

// call posts body (GET when empty) and returns the status and body.
func call(c *http.Client, method, url string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, b, err
}

// stats collects one client's latencies and errors.
type stats struct {
	lat    []time.Duration
	errors map[string]int
	pairs  int64
}

func (s *stats) record(start time.Time, status int, err error, want ...int) bool {
	s.lat = append(s.lat, time.Since(start))
	switch {
	case err != nil:
		s.errors["transport"]++
		return false
	case !slices.Contains(want, status):
		s.errors[strconv.Itoa(status)]++
		return false
	}
	return true
}

var tokenField = []byte(`"reservation":"`)

// token extracts the reservation token without a full JSON decode.
func token(b []byte) string {
	i := bytes.Index(b, tokenField)
	if i < 0 {
		return ""
	}
	b = b[i+len(tokenField):]
	j := bytes.IndexByte(b, '"')
	if j < 0 {
		return ""
	}
	return string(b[:j])
}

func reserveBody(key, exec string, n int) []byte {
	return []byte(`{"idempotency_key":"` + key + `","execution_id":"` + exec + `","tool":"payments.refund","effect":"write","input":{"order":` + strconv.Itoa(n) + `,"amount":1200}}`)
}

func commitBody(tok string) []byte {
	return []byte(`{"reservation":"` + tok + `","outcome":"succeeded","external_ref":"re_bench","result":{"amount":1200,"currency":"eur"}}`)
}

// drive runs one mode against l.
// drive runs mode with clients spread over the servers ls (replicas of one
// database) and over the route prefixes (namespaces: "/v1" or
// "/v1/ns/NAME"); replays and reads use the default namespace.
func drive(ctx context.Context, ls []*ledgerd, prefixes []string, mode string, clients int, d time.Duration) (Result, error) {
	c := newClient(clients)
	l := ls[0]
	if mode == "replay" || mode == "mixed" {
		if err := seed(c, l.url); err != nil {
			return Result{}, err
		}
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	all := make([]*stats, clients)
	run := fmt.Sprintf("%x", time.Now().UnixNano())
	start := time.Now()
	for ci := range clients {
		w := &worker{
			c: c, mode: mode, run: run, ci: ci,
			base:  ls[ci%len(ls)].url,
			stats: &stats{errors: map[string]int{}, lat: make([]time.Duration, 0, 1<<16)},
		}
		for _, p := range prefixes {
			w.nsBases = append(w.nsBases, w.base+p)
		}
		all[ci] = w.stats
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				w.op(i)
			}
		})
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	stop.Store(true)
	wg.Wait()
	res := summarize(mode, clients, time.Since(start).Seconds(), all)
	if l.cmd != nil {
		res.RSSMiB, res.PeakRSSMiB = rss(l.cmd.Process.Pid)
	}
	for _, p := range prefixes {
		if _, b, err := call(c, "GET", l.url+p+"/head", nil); err == nil {
			var h struct{ Seq uint64 }
			_ = json.Unmarshal(b, &h)
			res.Receipts += h.Seq
		}
	}
	return res, nil
}

// seeded is how many keys seed commits for the replay and mixed modes to replay and read.
const seeded = 1000

// seed reserves and commits the keys that replay and mixed modes replay and read.
func seed(c *http.Client, url string) error {
	for i := range seeded {
		key := fmt.Sprintf("seed-key-%06d", i)
		st, b, err := call(c, "POST", url+"/v1/effects/reserve", reserveBody(key, "seed", i))
		if err != nil || st != 201 {
			return fmt.Errorf("seed reserve: %d %v %s", st, err, b)
		}
		if st, b, err = call(c, "POST", url+"/v1/effects/"+key+"/commit", commitBody(token(b))); err != nil || st != 201 {
			return fmt.Errorf("seed commit: %d %v %s", st, err, b)
		}
	}
	return nil
}

// worker is one benchmark client: it runs its mode's operations against one ledgerd and
// namespace, recording each request's latency and status in stats.
type worker struct {
	c         *http.Client
	mode, run string
	ci        int
	base      string
	// nsBases are the namespaces' routes: the i-th pair of client ci
	// goes to nsBases[(ci+i) % len], so every namespace is written alike.
	nsBases []string
	stats   *stats
}

// op runs the worker's i-th operation. Keys and execution ids are UUID-like, so they land at
// random positions as real ones do.
func (w *worker) op(i int) {
	key := uuidLike(w.run, w.ci, i)
	op := w.mode
	if w.mode == "mixed" {
		switch i % 10 {
		case 0, 1, 2, 3, 4, 5:
			op = "pairs"
		case 6, 7, 8:
			op = "replay"
		default:
			op = "read"
		}
	}
	s := w.stats
	n := (w.ci*7919 + i) % seeded
	switch op {
	case "pairs", "reserve":
		nsBase := w.nsBases[(w.ci+i)%len(w.nsBases)]
		t0 := time.Now()
		st, b, err := call(w.c, "POST", nsBase+"/effects/reserve", reserveBody(key, uuidLike(w.run+"-exec", w.ci, i), i))
		if !s.record(t0, st, err, 201) || op == "reserve" {
			return
		}
		t0 = time.Now()
		st, _, err = call(w.c, "POST", nsBase+"/effects/"+key+"/commit", commitBody(token(b)))
		if s.record(t0, st, err, 201) {
			s.pairs++
		}
	case "replay":
		t0 := time.Now()
		st, _, err := call(w.c, "POST", w.base+"/v1/effects/reserve", reserveBody(fmt.Sprintf("seed-key-%06d", n), key, n))
		s.record(t0, st, err, 200)
	case "read":
		t0 := time.Now()
		st, _, err := call(w.c, "GET", w.base+"/v1/effects/"+fmt.Sprintf("seed-key-%06d", n), nil)
		s.record(t0, st, err, 200)
	}
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

// httpCeiling measures a trivial JSON handler with the same client code:
// decode a small body, encode a small reply.
func httpCeiling(ctx context.Context, clients int, d time.Duration) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in map[string]any
		_ = json.NewDecoder(r.Body).Decode(&in)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "ok", "seq": 1})
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	c := newClient(clients)
	url := "http://" + ln.Addr().String() + "/"
	var n atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := reserveBody("ceiling-key", "exec", 1)
			for !stop.Load() {
				if st, _, err := call(c, "POST", url, body); err == nil && st == 200 {
					n.Add(1)
				}
			}
		}()
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	stop.Store(true)
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds(), nil
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
		if r.StartupS > 0 {
			fmt.Printf("%s: ledgerd restarted on the ledger was ready in %.2f s\n", r.Mode, r.StartupS)
		}
	}
	if s := rep.Rounds; s != nil {
		ratios := make([]string, len(s.Ratios))
		for i, r := range s.Ratios {
			ratios[i] = fmt.Sprintf("%.2f", r)
		}
		fmt.Printf("\n%d rounds: median requests/s 1 ns %.0f, %d ns %.0f; ratio %d:1 per round %s, median %.2f\n",
			len(s.Ratios), s.MedianOne, s.Namespaces, s.MedianMany, s.Namespaces, strings.Join(ratios, " "), s.MedianRatio)
	}
}

// uuidLike is a UUID-shaped key for client ci's i-th request of a run.
func uuidLike(run string, ci, i int) string {
	return gen.UUIDLike(run+"-"+strconv.Itoa(ci), uint64(i))
}
