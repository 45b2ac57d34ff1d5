package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/effect-ledger/effect-ledger/testkit/gen"
)

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

// switchCommitted switches the default namespace to committed payloads
// by policy (SPEC §14's one-way switch).
func switchCommitted(url string) error {
	st, b, err := call(newClient(1), "PUT", url+"/v1/namespaces/default/policy", []byte(`{"payloads":"committed"}`))
	if err != nil || st != http.StatusOK {
		return fmt.Errorf("switch to committed payloads: %d %v %s", st, err, b)
	}
	return nil
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
