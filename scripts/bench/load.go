package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effect-ledger/effect-ledger/testkit/gen"
)

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

// uuidLike is a UUID-shaped key for client ci's i-th request of a run.
func uuidLike(run string, ci, i int) string {
	return gen.UUIDLike(run+"-"+strconv.Itoa(ci), uint64(i))
}
