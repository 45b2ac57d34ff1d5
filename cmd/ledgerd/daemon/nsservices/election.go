package nsservices

import (
	"context"
	"log/slog"
	"sync"
)

// election holds the signer lock of one namespace once won (the
// PostgreSQL driver's is a session advisory lock, freed when the holder's
// connection ends): until then each checkpoint tick tries again.
type election struct {
	try func(ctx context.Context, ns string) (func(), bool, error)
	// eligible, when set, says whether this replica may sign at all: a
	// replica without the chain's current key neither takes the lock nor
	// keeps it (SPEC §9.2).
	eligible func(ctx context.Context) (bool, error)
	ns       string
	logger   *slog.Logger
	mu       sync.Mutex
	release  func()
	barred   bool // eligible said no at the last try (logged once)
}

// lead reports whether this replica signs the namespace's checkpoints,
// trying for the lock when it does not hold it yet (tlog.Checkpointer.Lead).
func (e *election) lead(ctx context.Context) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.eligible != nil {
		ok, err := e.eligible(ctx)
		if err != nil {
			return false, err
		}
		if !ok {
			if !e.barred {
				e.logger.Warn("this replica does not hold the signing key the chain announced last: it does not sign the namespace's checkpoints (restart it with the new key, docs/operations.md)")
			}
			e.barred = true
			if e.release != nil {
				e.release()
				e.release = nil
			}
			return false, nil
		}
		e.barred = false
	}
	if e.release != nil {
		return true, nil
	}
	release, ok, err := e.try(ctx, e.ns)
	if err != nil || !ok {
		return false, err
	}
	e.release = release
	e.logger.Info("this replica signs the namespace's checkpoints")
	return true, nil
}

// resign gives the lock up, if held.
func (e *election) resign() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.release != nil {
		e.release()
		e.release = nil
	}
}

// leads reports whether a replica's work for the namespace that only one
// replica does (what, for the log) is this replica's: always without an
// election (one ledgerd on a file), else while it holds the signer lock.
func leads(ctx context.Context, e *election, logger *slog.Logger, what string) bool {
	if e == nil {
		return true
	}
	lead, err := e.lead(ctx)
	if err != nil {
		logger.Warn(what+": the signer election failed", "err", err)
	}
	return lead
}
