// Command bench load-tests a real ledgerd over HTTP.
//
//	go run ./scripts/bench [--mode pairs|reserve|replay|mixed|mcp|all] [--clients 32] [--duration 10s] [--namespaces 1] [--json]
//
// It builds ./cmd/ledgerd, starts it on a temporary database, drives it
// with N concurrent keep-alive clients for D seconds, and prints requests/s,
// pairs/s, p50/p99/max latency, errors by status and ledgerd's RSS. In the
// same run it measures the machine's HTTP ceiling (a trivial JSON handler
// driven by the same client code) and prints the ledger's ratio to it, so
// figures compare across noisy machines. All traffic stays on loopback and
// every loop is bounded by --duration. Mode mcp (not part of all) measures
// tools/call through the MCP gateway instead, in this process: an embedded
// ledger, an in-process upstream and random arguments (one new key a call).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
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
	if o.bin == "" && !o.mcpOnly() {
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
		a, b := o.variants()
		rep.Rounds = summarizeRounds(rep.Results, a.label, b.label)
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
	payloads                bool
}

func parseOptions(args []string) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	mode := fs.String("mode", "all", "pairs, reserve, replay, mixed, all, or mcp (tools/call through the MCP gateway; not in all)")
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
	fs.IntVar(&o.rounds, "rounds", 0, "with --namespaces N: run this many rounds, each one namespace and N (a fresh ledger each; one namespace first in odd rounds, last in even ones), and print the median of each and of the rounds' ratios N:1 (a noisy machine's speed drifts between runs: compare within rounds); with --payloads, each round runs inline and committed instead")
	fs.BoolVar(&o.payloads, "payloads", false, "with --rounds: compare payload modes, inline against committed (the default namespace and the created ones; on a --prefill ledger, committed switches it by policy first)")
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
	if o.payloads && o.rounds == 0 {
		return options{}, errors.New("--payloads compares payload modes in --rounds: give --rounds K")
	}
	if o.rounds > 0 && ((o.namespaces < 2 && !o.payloads) || o.registered != 0 || o.backends || o.withBaselines || *mode == "all") {
		return options{}, errors.New("--rounds compares one namespace with --namespaces N (at least 2), or inline with committed (--payloads), in one --mode, without --registered, --backends or --baselines")
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

// mcpOnly reports whether the run measures the MCP gateway alone, which
// needs no ledgerd.
func (o options) mcpOnly() bool {
	return len(o.modes) == 1 && o.modes[0] == "mcp" && !o.backends && !o.withBaselines
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
		if m == "mcp" {
			res, err := driveMCP(ctx, dir, o.clients, o.duration)
			if err != nil {
				return nil, fmt.Errorf("mcp: %w", err)
			}
			out = append(out, res)
			continue
		}
		if o.rounds > 0 {
			a, b := o.variants()
			for r := 1; r <= o.rounds; r++ {
				// The first variant first in odd rounds, last in even ones:
				// an effect of the order cancels out. pair is (a, b) either way.
				vs, order := [2]variant{a, b}, [2]int{0, 1}
				if r%2 == 0 {
					order = [2]int{1, 0}
				}
				var pair [2]Result
				for _, i := range order {
					v := vs[i]
					res, err := o.runMode(ctx, dir, pg, m, v, fmt.Sprintf("r%d_%s", r, v.tag))
					if err != nil {
						return nil, err
					}
					res.Mode = fmt.Sprintf("%s, %s, round %d", m, v.label, r)
					pair[i] = res
				}
				out = append(out, pair[:]...)
			}
			continue
		}
		res, err := o.runMode(ctx, dir, pg, m, variant{namespaces: o.namespaces}, "")
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

// variant is one side of a --rounds comparison.
type variant struct {
	label, tag string
	namespaces int
	payloads   string // "" or a payload mode
}

// variants are the two sides --rounds compares: one namespace and
// --namespaces, or inline and committed payloads.
func (o options) variants() (variant, variant) {
	if o.payloads {
		return variant{"inline", "inline", o.namespaces, "inline"}, variant{"committed", "committed", o.namespaces, "committed"}
	}
	many := fmt.Sprintf("%d ns", o.namespaces)
	return variant{"1 ns", "1", 1, ""}, variant{many, strconv.Itoa(o.namespaces), o.namespaces, ""}
}

// runMode runs mode m on a fresh ledger (named for m and tag) with the
// load spread over v's namespaces, in v's payload mode.
func (o options) runMode(ctx context.Context, dir string, pg *pgCluster, m string, v variant, tag string) (Result, error) {
	namespaces := v.namespaces
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
	extra := o.extra
	if v.payloads != "" {
		extra = append([]string{"--default-payloads", v.payloads}, extra...)
	}
	l, err := startLedgerd(o.bin, db, extra)
	if err != nil {
		return Result{}, err
	}
	if o.prefill > 0 && v.payloads == "committed" { // the generated ledger is inline
		if err := switchCommitted(l.url); err != nil {
			l.stop()
			return Result{}, err
		}
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
		if l, err = startLedgerd(o.bin, db, extra); err != nil {
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
