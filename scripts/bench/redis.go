package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The baselines of --baselines: what users build instead of the ledger,
// measured in the same run with the same HTTP client.
//
//   - redis-http: a small HTTP JSON idempotency service in front of Redis
//     (reserve = SET NX, commit = SET XX), the design the write-path issue
//     names; it keeps no chain, no history and no state machine.
//   - redis-raw: SET NX + SET XX pairs over Redis's own protocol, no HTTP:
//     the reference without any HTTP cost.
//
// Redis runs with appendonly yes and appendfsync always (every write
// fsync'd before its reply, durable like ledgerd), on a loopback port, in
// a temporary directory, and is stopped at the end.

// redisServer is a throwaway redis-server.
type redisServer struct {
	addr string
	cmd  *exec.Cmd
}

func startRedis(dir string) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Geteuid() != 0 {
			return nil, errors.New("--baselines needs redis-server (Debian: apt-get install redis-server)")
		}
		inst := exec.Command("sh", "-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null")
		inst.Stderr = os.Stderr
		if err := inst.Run(); err != nil {
			return nil, fmt.Errorf("install redis-server: %w", err)
		}
		if bin, err = exec.LookPath("redis-server"); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	rdir := filepath.Join(dir, "redis")
	if err := os.MkdirAll(rdir, 0o700); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", rdir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "yes")
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	r := &redisServer{addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd}
	for range 100 {
		if c, err := dialRESP(r.addr); err == nil {
			_ = c.close()
			return r, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.stop()
	return nil, errors.New("redis-server not ready in 5s")
}

func (r *redisServer) stop() {
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
}

// respConn is one connection speaking RESP, the Redis protocol.
type respConn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

func dialRESP(addr string) (*respConn, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &respConn{c: c, r: bufio.NewReader(c), w: bufio.NewWriter(c)}, nil
}

func (c *respConn) close() error { return c.c.Close() }

// do sends one command and returns a simple or bulk reply; nil for a nil
// bulk reply.
func (c *respConn) do(args ...string) (*string, error) {
	fmt.Fprintf(c.w, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(c.w, "$%d\r\n%s\r\n", len(a), a)
	}
	if err := c.w.Flush(); err != nil {
		return nil, err
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "+"):
		s := line[1:]
		return &s, nil
	case strings.HasPrefix(line, "-"):
		return nil, errors.New(line[1:])
	case line == "$-1":
		return nil, nil
	case strings.HasPrefix(line, "$"):
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return nil, err
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, b); err != nil {
			return nil, err
		}
		s := string(b[:n])
		return &s, nil
	}
	return nil, fmt.Errorf("unexpected reply %q", line)
}

// respPool hands out connections.
type respPool struct{ ch chan *respConn }

func newRESPPool(addr string, n int) (*respPool, error) {
	p := &respPool{ch: make(chan *respConn, n)}
	for range n {
		c, err := dialRESP(addr)
		if err != nil {
			return nil, err
		}
		p.ch <- c
	}
	return p, nil
}

func (p *respPool) do(args ...string) (*string, error) {
	c := <-p.ch
	defer func() { p.ch <- c }()
	return c.do(args...)
}

// redisIdempotencyService is the HTTP JSON service users build instead:
// the same routes and bodies as ledgerd's reserve and commit.
func redisIdempotencyService(pool *respPool) http.Handler {
	mux := http.NewServeMux()
	write := func(w http.ResponseWriter, status int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("POST /v1/effects/reserve", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Key string `json:"idempotency_key"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.Key == "" {
			write(w, 400, map[string]string{"error": "bad request"})
			return
		}
		var b [16]byte
		_, _ = rand.Read(b[:])
		tok := hex.EncodeToString(b[:])
		ok, err := pool.do("SET", "idem:"+req.Key, "reserved:"+tok, "NX")
		if err != nil {
			write(w, 503, map[string]string{"error": err.Error()})
			return
		}
		if ok != nil {
			write(w, 201, map[string]string{"status": "reserved", "reservation": tok})
			return
		}
		v, err := pool.do("GET", "idem:"+req.Key)
		switch {
		case err != nil:
			write(w, 503, map[string]string{"error": err.Error()})
		case v != nil && strings.HasPrefix(*v, "succeeded:"):
			write(w, 200, map[string]any{"status": "replayed", "result": json.RawMessage(strings.TrimPrefix(*v, "succeeded:"))})
		default:
			write(w, 409, map[string]string{"error": "in_progress"})
		}
	})
	mux.HandleFunc("POST /v1/effects/{key}/commit", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Result json.RawMessage `json:"result"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
			write(w, 400, map[string]string{"error": "bad request"})
			return
		}
		if len(req.Result) == 0 {
			req.Result = json.RawMessage("null")
		}
		ok, err := pool.do("SET", "idem:"+r.PathValue("key"), "succeeded:"+string(req.Result), "XX")
		switch {
		case err != nil:
			write(w, 503, map[string]string{"error": err.Error()})
		case ok == nil:
			write(w, 404, map[string]string{"error": "unknown_key"})
		default:
			write(w, 201, map[string]string{"status": "committed"})
		}
	})
	return mux
}

// baselines runs redis-http (pairs, driven like ledgerd), redis-raw and
// the hand-built PostgreSQL tables (pgbench, unchained and chained).
func baselines(ctx context.Context, dir string, clients int, d time.Duration) ([]Result, error) {
	rs, err := startRedis(dir)
	if err != nil {
		return nil, err
	}
	defer rs.stop()
	pool, err := newRESPPool(rs.addr, clients)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: redisIdempotencyService(pool), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	httpRes, err := drive(ctx, []*ledgerd{{url: "http://" + ln.Addr().String()}}, []string{"/v1"}, "pairs", clients, d)
	if err != nil {
		return nil, err
	}
	httpRes.Mode = "redis-http pairs"
	raw, err := rawRedisPairs(ctx, rs.addr, clients, d)
	if err != nil {
		return nil, err
	}
	out := []Result{httpRes, raw}
	// PostgreSQL as users would hand-build it, unchained and chained, on a
	// throwaway cluster (fsync on), driven by pgbench with as many clients.
	pg, err := startPG(dir)
	if err != nil {
		return nil, err
	}
	defer pg.stop()
	base, err := pgbenchBoth(pg, clients, d)
	if err != nil {
		return nil, err
	}
	return append(out, base...), nil
}

// rawRedisPairs drives SET NX + SET XX pairs over RESP, one connection
// per client, with the same UUID-like keys.
func rawRedisPairs(ctx context.Context, addr string, clients int, d time.Duration) (Result, error) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	lats := make([][]time.Duration, clients)
	errs := make([]error, clients)
	run := strconv.FormatInt(time.Now().UnixNano(), 10)
	start := time.Now()
	for ci := range clients {
		c, err := dialRESP(addr)
		if err != nil {
			return Result{}, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.close()
			for i := 0; !stop.Load(); i++ {
				key := "idem:" + uuidLike(run, ci, i)
				t0 := time.Now()
				if _, err := c.do("SET", key, "reserved", "NX"); err != nil {
					errs[ci] = err
					return
				}
				if _, err := c.do("SET", key, "succeeded", "XX"); err != nil {
					errs[ci] = err
					return
				}
				lats[ci] = append(lats[ci], time.Since(t0))
			}
		}()
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	stop.Store(true)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Result{}, err
	}
	elapsed := time.Since(start).Seconds()
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	slices.Sort(all)
	res := Result{Mode: "redis-raw pairs", Clients: clients, Seconds: elapsed, Errors: map[string]int{},
		Requests: int64(2 * len(all)), RequestsPerS: float64(2*len(all)) / elapsed, PairsPerS: float64(len(all)) / elapsed}
	if len(all) > 0 {
		pct := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))]) / 1e6 }
		res.P50Ms, res.P99Ms, res.MaxMs = pct(0.50), pct(0.99), float64(all[len(all)-1])/1e6
	}
	return res, nil
}
