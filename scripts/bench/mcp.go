package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/mcpgate"
	"github.com/effect-ledger/effect-ledger/storage"
)

// chargeArgs are the arguments of the bench upstream's tool: a new order
// makes a new derived key, so every call is reserved, forwarded and
// committed.
type chargeArgs struct {
	Order  string `json:"order"`
	Amount int    `json:"amount"`
}

// driveMCP measures tools/call through the gateway (mode mcp): an
// embedded ledger on a SQLite file in dir, an upstream MCP server in this
// process (reached over in-memory streams, as a stdio server is), and
// clients MCP sessions over Streamable HTTP on loopback, each calling a
// tool without annotations (an effect) with random arguments for d.
func driveMCP(ctx context.Context, dir string, clients int, d time.Duration) (Result, error) {
	quiet := slog.New(slog.DiscardHandler)
	store, _, err := storage.Open(ctx, filepath.Join(dir, "mcp.db"), storage.Options{Logger: quiet})
	if err != nil {
		return Result{}, err
	}
	l := ledger.New(store, ledger.Config{Logger: quiet})
	defer l.Close()
	ns, err := l.Default(ctx)
	if err != nil {
		return Result{}, err
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "shop", Version: "1"}, nil)
	var runs atomic.Int64
	mcp.AddTool(server, &mcp.Tool{Name: "charge"}, func(_ context.Context, _ *mcp.CallToolRequest, a chargeArgs) (*mcp.CallToolResult, any, error) {
		runs.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "charged " + a.Order}}}, nil, nil
	})
	up, err := mcpgate.DialTransport(ctx, "in-process", func() mcp.Transport {
		ct, st := mcp.NewInMemoryTransports()
		go func() { _ = server.Run(context.Background(), st) }()
		return ct
	}, mcpgate.UpstreamOptions{})
	if err != nil {
		return Result{}, err
	}
	defer up.Close()
	g, err := mcpgate.New(up, mcpgate.Config{Ledger: mcpgate.NewLocal(ns), Logger: quiet})
	if err != nil {
		return Result{}, err
	}
	srv := httptest.NewServer(g.Handler(mcpgate.HTTPOptions{}))
	defer srv.Close()
	sessions := make([]*mcp.ClientSession, clients)
	for i := range sessions {
		c := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
		if sessions[i], err = c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL}, nil); err != nil {
			return Result{}, fmt.Errorf("connect to the gateway: %w", err)
		}
		defer sessions[i].Close()
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	all := make([]*stats, clients)
	run := fmt.Sprintf("%x", time.Now().UnixNano())
	start, cpu0 := time.Now(), cpuTime()
	for ci, s := range sessions {
		st := &stats{errors: map[string]int{}, lat: make([]time.Duration, 0, 1<<14)}
		all[ci] = st
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				t0 := time.Now()
				res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "charge",
					Arguments: chargeArgs{Order: uuidLike(run, ci, i), Amount: 1200}})
				st.lat = append(st.lat, time.Since(t0))
				switch {
				case err != nil:
					st.errors["mcp"]++
				case res.IsError:
					st.errors["tool"]++
				default:
					st.pairs++
				}
			}
		})
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	stop.Store(true)
	wg.Wait()
	res := summarize("mcp", clients, time.Since(start).Seconds(), all)
	if res.Requests > 0 {
		res.CPUPerCallMs = float64(cpuTime()-cpu0) / float64(time.Millisecond) / float64(res.Requests)
	}
	res.PairsPerS = float64(runs.Load()) / res.Seconds // calls the upstream ran
	if h, err := ns.Head(ctx); err == nil {
		res.Receipts = h.Seq
	}
	return res, nil
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
