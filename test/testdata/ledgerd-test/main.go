// Command ledgerd-test is ledgerd for the end-to-end tests: the same
// program (cmd/ledgerd/daemon), with its test seams filled from LEDGERD_TEST_*
// environment variables, so that a test can move the clock of a process,
// kill it right after a COMMIT or fill its key index's disk. The ledgerd
// binary reads none of these variables.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/effect-ledger/effect-ledger/cmd/ledgerd/daemon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	m := daemon.NewMain(os.Stderr)
	if err := setSeams(m); err != nil {
		fmt.Fprintln(os.Stderr, "ledgerd:", err)
		stop()
		os.Exit(1)
	}
	code := m.Execute(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// The environment variables read by setSeams.
const (
	// clockEnv names a file holding the time ledgerd uses instead of its
	// clock (see fileClock).
	clockEnv = "LEDGERD_TEST_CLOCK_FILE"
	// killAfterCommitEnv holds a number N: ledgerd kills itself (SIGKILL,
	// as kill -9 would) right after its Nth durable COMMIT, before that
	// batch reaches the key index.
	killAfterCommitEnv = "LEDGERD_TEST_KILL_AFTER_COMMIT"
	// indexFullEnv names a file: while it exists, every write to the key
	// index's files fails with ENOSPC, as on a full disk.
	indexFullEnv = "LEDGERD_TEST_INDEX_FULL_IF"
	// killAtEnv names a step of a prune (segment-written,
	// receipt-committed, batch-N for the Nth deletion batch): ledgerd
	// kills itself (SIGKILL) right after it.
	killAtEnv = "LEDGERD_TEST_KILL_AT"
	// replicaCountEnv and namespaceScanEnv hold durations (e.g. 10ms)
	// that shorten ledgerd's background periods, so that a test sees a
	// new replica counted or a new namespace served without waiting.
	replicaCountEnv  = "LEDGERD_TEST_REPLICA_COUNT_EVERY"
	namespaceScanEnv = "LEDGERD_TEST_NAMESPACE_SCAN_EVERY"
	// pruneEveryEnv holds a duration that replaces --prune-interval (which
	// is at least a minute in ledgerd), so that a test sees scheduled
	// prunes (SPEC §16) at once.
	pruneEveryEnv = "LEDGERD_TEST_PRUNE_EVERY"
)

// setSeams sets m's seams from the environment.
func setSeams(m *daemon.Main) error {
	var err error
	if path := os.Getenv(clockEnv); path != "" {
		if m.Now, err = fileClock(path); err != nil {
			return fmt.Errorf("%s: %w", clockEnv, err)
		}
	}
	if v := os.Getenv(killAfterCommitEnv); v != "" {
		if m.AfterCommit, err = killAfterCommit(v); err != nil {
			return fmt.Errorf("%s: %w", killAfterCommitEnv, err)
		}
	}
	if v := os.Getenv(killAtEnv); v != "" {
		m.PruneStep = killAt(v)
	}
	if path := os.Getenv(indexFullEnv); path != "" {
		m.IndexWriteFault = fullIf(path)
	}
	if m.ReplicaCountEvery, err = period(replicaCountEnv); err != nil {
		return err
	}
	if m.NamespaceScanEvery, err = period(namespaceScanEnv); err != nil {
		return err
	}
	if m.PruneEvery, err = period(pruneEveryEnv); err != nil {
		return err
	}
	return nil
}
