// Command gateway is a small tool gateway for AI agents that records
// every side effect in an effect ledger with the Go client: a model (or
// its runtime, or another replica) calling the same tool twice gets the
// first call's result instead of a second refund or a second email.
//
// It wraps two fake tools, payments.refund (idempotent: the fake payment
// provider dedupes on the key) and email.send (not idempotent), and
// serves them as POST /tools/{tool}; GET /stats shows how many times each
// tool really ran.
//
//	go run ./cmd/ledgerd &
//	go run ./examples/gateway --ledger 127.0.0.1:8080 --listen 127.0.0.1:8090
//	curl -s 127.0.0.1:8090/tools/payments.refund -d '{"execution_id":"call-1","input":{"order":1234,"amount":1200}}'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/effect-ledger/effect-ledger/client"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// run parses flags, serves until ctx ends and shuts down.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ledgerURL := fs.String("ledger", envOr("LEDGER_URL", "127.0.0.1:8080"), "ledgerd base `URL` (scheme optional; env LEDGER_URL)")
	listen := fs.String("listen", "127.0.0.1:8090", "`address` to serve the tools on")
	logFormat := fs.String("log-format", "text", "log `format`: text or json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	if *logFormat == "json" {
		logger = slog.New(slog.NewJSONHandler(stderr, nil))
	}
	lc, err := client.New(*ledgerURL,
		client.WithToken(os.Getenv("LEDGER_TOKEN")), // a writer token, when the ledger has tokens
		client.WithLogger(logger))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: NewGateway(lc, logger), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("gateway ready", "addr", ln.Addr().String(), "ledger", lc.BaseURL())
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 35*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
