// Command bigrun is the 10-million-receipt run of BENCHMARKS.md (not in CI):
//
//	go run ./scripts/bigrun [--receipts 10000000] [--dir DIR]
//
// It generates a valid ledger of N receipts (reused if DIR already has
// one), then measures: ledgerd start-up time to its ready line and its RSS,
// RSS after a short burst of reserve+commit pairs, and a full offline
// `ledgerctl verify` (time and peak RSS). Everything runs on loopback and
// every step is bounded.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/effect-ledger/effect-ledger/testkit/gen"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bigrun:", err)
		os.Exit(1)
	}
}

func run() error {
	n := flag.Int("receipts", 10_000_000, "receipts in the ledger")
	dir := flag.String("dir", "", "working directory (default: a new temp dir, removed at the end)")
	burst := flag.Duration("burst", 10*time.Second, "how long to drive reserve+commit pairs after start-up")
	flag.Parse()
	if *dir == "" {
		d, err := os.MkdirTemp("", "ledger-bigrun-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		*dir = d
	}
	bin := func(name string) (string, error) {
		out := filepath.Join(*dir, name)
		cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name)
		cmd.Stderr = os.Stderr
		return out, cmd.Run()
	}
	ledgerd, err := bin("ledgerd")
	if err != nil {
		return err
	}
	ledgerctl, err := bin("ledgerctl")
	if err != nil {
		return err
	}
	db := filepath.Join(*dir, fmt.Sprintf("ledger-%d.db", *n))
	if _, err := os.Stat(db); err != nil {
		start := time.Now()
		fmt.Printf("generating %d receipts in %s …\n", *n, db)
		if _, err := gen.Ledger(context.Background(), db, *n, func(done int) {
			fmt.Printf("  %d receipts (%s)\n", done, time.Since(start).Round(time.Second))
		}); err != nil {
			return err
		}
		fmt.Printf("generated in %s\n", time.Since(start).Round(time.Second))
	}
	if fi, err := os.Stat(db); err == nil {
		fmt.Printf("database: %.0f MiB\n", float64(fi.Size())/(1<<20))
	}

	// Start-up.
	start := time.Now()
	cmd := exec.Command(ledgerd, "--db", db, "--listen", "127.0.0.1:0", "--log-format", "json")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }()
	addr, err := readyAddr(stderr)
	if err != nil {
		return err
	}
	startup := time.Since(start)
	rssStart := rss(cmd.Process.Pid)
	fmt.Printf("ledgerd start-up: %s to ready, RSS %.0f MiB\n", startup.Round(time.Millisecond), rssStart)

	pairs := drive("http://"+addr, *burst)
	fmt.Printf("after %s of pairs (%d pairs, %.0f pairs/s): RSS %.0f MiB\n", *burst, pairs, float64(pairs)/burst.Seconds(), rss(cmd.Process.Pid))

	// Offline verification while ledgerd runs.
	start = time.Now()
	v := exec.Command(ledgerctl, "verify", "--db", db, "--no-progress")
	out, err := v.CombinedOutput()
	if err != nil {
		return fmt.Errorf("verify: %v: %s", err, out)
	}
	maxRSS := float64(v.ProcessState.SysUsage().(*syscall.Rusage).Maxrss) / 1024
	fmt.Printf("ledgerctl verify: %s, peak RSS %.0f MiB: %s", time.Since(start).Round(time.Millisecond), maxRSS, out)
	return nil
}

func readyAddr(r io.Reader) (string, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var line struct{ Msg, Addr string }
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "ledgerd ready" {
			go func() { _, _ = io.Copy(io.Discard, r) }()
			return line.Addr, nil
		}
	}
	return "", fmt.Errorf("ledgerd exited before it was ready")
}

func rss(pid int) float64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// drive runs 32 clients doing reserve+commit pairs for d.
func drive(url string, d time.Duration) int64 {
	var n atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for c := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				key := fmt.Sprintf("bigrun-%d-%d-%d", time.Now().UnixNano(), c, i)
				body := `{"idempotency_key":"` + key + `","execution_id":"e","tool":"payments.refund","effect":"write"}`
				res, err := http.Post(url+"/v1/effects/reserve", "application/json", strings.NewReader(body))
				if err != nil {
					continue
				}
				var b struct{ Reservation string }
				_ = json.NewDecoder(res.Body).Decode(&b)
				res.Body.Close()
				res, err = http.Post(url+"/v1/effects/"+key+"/commit", "application/json",
					bytes.NewReader([]byte(`{"reservation":"`+b.Reservation+`","outcome":"succeeded"}`)))
				if err == nil {
					if res.StatusCode == 201 {
						n.Add(1)
					}
					res.Body.Close()
				}
			}
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	return n.Load()
}
