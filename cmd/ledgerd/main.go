// Command ledgerd serves the effect ledger's REST API over a SQLite file
// or a PostgreSQL database.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/effect-ledger/effect-ledger/cmd/ledgerd/daemon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := daemon.NewMain(os.Stderr).Execute(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
