package tlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"
	sumdb "golang.org/x/mod/sumdb/tlog"
)

// Signed is a signed checkpoint as a log stores it before serving it.
type Signed struct {
	Size     int64
	Root     Hash
	Note     string // the signed note, as served
	SignedAt uint64 // unix ms, set by the store
}

// Store is what the checkpoint signer needs of a log's storage.
type Store interface {
	// TreeSize is the number of leaves whose hashes are stored.
	TreeSize(ctx context.Context) (int64, error)
	// HashReader reads stored tree hashes.
	HashReader(ctx context.Context) sumdb.HashReader
	// LatestCheckpoint returns the largest stored checkpoint, nil if none.
	LatestCheckpoint(ctx context.Context) (*Signed, error)
	// StoreCheckpoint stores c durably; it fails unless c is larger than
	// every stored checkpoint.
	StoreCheckpoint(ctx context.Context, c *Signed) error
}

// ErrFork means the stored tree is no longer an extension of the last
// signed checkpoint: the log was changed behind the signer's back, and it
// refuses to sign a checkpoint that would fork the published history.
var ErrFork = errors.New("the tree does not extend the last signed checkpoint")

// ErrStale is what Store.StoreCheckpoint returns for a checkpoint that is
// not larger than the stored one: another signer (a replica) stored that
// size first. The signer treats it as done elsewhere, not as a failure.
var ErrStale = errors.New("a checkpoint of that size or larger is stored")

// ErrKeyNotActive means none of the signer's keys is in the chain's
// active key set (SPEC §9.2): it does not sign rather than switch keys
// silently.
var ErrKeyNotActive = errors.New("no signing key of this process is in the chain's active key set")

// Checkpointer signs a new checkpoint when the tree has grown.
type Checkpointer struct {
	Store  Store
	Signer note.Signer
	// Handover, when set, is the key the log hands over from (SPEC §9.2):
	// every checkpoint carries its signature after Signer's.
	Handover note.Signer
	// Active, when set, is asked before each signing which key ids may
	// sign (the chain's active key set); a checkpoint is signed only when
	// one of the held keys may, and then by every held key.
	Active   func(ctx context.Context) (func(id string) bool, error)
	Origin   string
	Interval time.Duration
	Logger   *slog.Logger
	// Namespace labels the metrics (default "default").
	Namespace string
	// Lead, when set, is asked before each signing whether this process
	// is the namespace's signer now (replicas on one database elect one,
	// so that witnesses see one signer); false skips the tick.
	Lead func(ctx context.Context) (bool, error)
}

// SignOnce signs and stores a checkpoint of the current tree if it is
// larger than the last one, and returns it (nil when the tree has not
// grown). Before signing it checks that the stored tree still has the
// last checkpoint's root at its size (ErrFork otherwise).
func (c *Checkpointer) SignOnce(ctx context.Context) (*Signed, error) {
	// The last checkpoint is read before the tree, each in a read of its
	// own: a checkpoint is stored only for a tree already stored, so the
	// tree read after it is at least as large, even when another signer
	// (a replica) stores a checkpoint between the two reads.
	last, err := c.Store.LatestCheckpoint(ctx)
	if err != nil {
		return nil, fmt.Errorf("sign checkpoint: %w", err)
	}
	n, err := c.Store.TreeSize(ctx)
	if err != nil {
		return nil, fmt.Errorf("sign checkpoint: %w", err)
	}
	if n == 0 || last != nil && n <= last.Size {
		if last != nil && n < last.Size {
			return nil, fmt.Errorf("%w: the tree has %d leaves, the last checkpoint %d", ErrFork, n, last.Size)
		}
		return nil, nil
	}
	hr := c.Store.HashReader(ctx)
	if last != nil {
		old, err := TreeHash(last.Size, hr)
		if err != nil {
			return nil, fmt.Errorf("sign checkpoint: %w", err)
		}
		if old != last.Root {
			return nil, fmt.Errorf("%w: the root at size %d is %s, the checkpoint signed %s", ErrFork, last.Size, old, last.Root)
		}
	}
	root, err := TreeHash(n, hr)
	if err != nil {
		return nil, fmt.Errorf("sign checkpoint: %w", err)
	}
	signers, err := c.signers(ctx)
	if err != nil {
		return nil, err
	}
	msg, err := SignCheckpoint(Checkpoint{Origin: c.Origin, Size: n, Root: root}, signers)
	if err != nil {
		return nil, err
	}
	s := &Signed{Size: n, Root: root, Note: string(msg)}
	if err := c.Store.StoreCheckpoint(ctx, s); err != nil {
		return nil, fmt.Errorf("sign checkpoint: %w", err)
	}
	return s, nil
}

// signers returns the held keys, once the chain's active key set (read
// after the tree size, so it covers every key receipt in the tree) holds
// one of them.
func (c *Checkpointer) signers(ctx context.Context) ([]note.Signer, error) {
	held := []note.Signer{c.Signer}
	if c.Handover != nil {
		held = append(held, c.Handover)
	}
	if c.Active == nil {
		return held, nil
	}
	active, err := c.Active(ctx)
	if err != nil {
		return nil, fmt.Errorf("sign checkpoint: %w", err)
	}
	var ids []string
	for _, s := range held {
		if active(KeyID(s)) {
			return held, nil
		}
		ids = append(ids, KeyID(s))
	}
	return nil, fmt.Errorf("%w: it holds %s; the chain's key receipts announce others (announce the key with ledgerctl keys rotate, or start with the announced key)",
		ErrKeyNotActive, strings.Join(ids, " and "))
}

// Run signs checkpoints every Interval until ctx ends. Failures are
// logged (a fork once per distinct error) and retried on the next tick.
func (c *Checkpointer) Run(ctx context.Context) {
	logger := c.Logger
	if logger == nil {
		logger = slog.Default()
	}
	ns := c.Namespace
	if ns == "" {
		ns = "default"
	}
	t := time.NewTicker(c.Interval)
	defer t.Stop()
	if last, err := c.Store.LatestCheckpoint(ctx); err == nil && last != nil {
		checkpointSize.WithLabelValues(ns).Set(float64(last.Size)) // what is published, also right after a restart
	}
	var lastErr string
	for {
		var s *Signed
		var err error
		lead := true
		if c.Lead != nil {
			lead, err = c.Lead(ctx)
		}
		if lead && err == nil {
			s, err = c.SignOnce(ctx)
		}
		switch {
		case errors.Is(err, ErrStale):
			logger.DebugContext(ctx, "checkpoint stored by another signer", "origin", c.Origin, "err", err)
		case err != nil && ctx.Err() == nil:
			checkpointFailures.WithLabelValues(ns).Inc()
			if err.Error() != lastErr {
				logger.ErrorContext(ctx, "checkpoint not signed", "origin", c.Origin, "err", err)
				lastErr = err.Error()
			}
		case s == nil && !lead:
			if last, err := c.Store.LatestCheckpoint(ctx); err == nil && last != nil {
				checkpointSize.WithLabelValues(ns).Set(float64(last.Size))
			}
		case s != nil:
			lastErr = ""
			checkpointsSigned.WithLabelValues(ns).Inc()
			checkpointSize.WithLabelValues(ns).Set(float64(s.Size))
			logger.DebugContext(ctx, "checkpoint signed", "origin", c.Origin, "size", s.Size, "root", s.Root.String())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
