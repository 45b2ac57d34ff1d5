package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// Rules of the checkpoint check (SPEC §9).
const (
	// RuleCheckpointMismatch: the ledger's Merkle root at a signed
	// checkpoint's size is not the signed root (or the chain is shorter).
	RuleCheckpointMismatch = "checkpoint_mismatch"
	// RuleCheckpointFork: a checkpoint is not consistent with the one
	// verified before (--state): the log showed two histories.
	RuleCheckpointFork = "checkpoint_fork"
)

// ConsistencyProver yields a log's consistency proof between two tree
// sizes; a fork report carries the proof and why it fails when the
// source can give one.
type ConsistencyProver interface {
	ConsistencyProof(ctx context.Context, from, to int64) ([]tlog.Hash, error)
}

// CheckpointCheck checks a chain against a signed checkpoint.
type CheckpointCheck struct {
	// Note is the signed checkpoint to check.
	Note []byte
	// Verifier is the log's verifier key.
	Verifier note.Verifier
	// Namespace is the namespace verified: a checkpoint's origin must be
	// the key's name, "/" and Namespace, so that another namespace's
	// checkpoint is refused. Empty accepts any namespace of the key.
	Namespace string
	// Previous is the checkpoint verified by an earlier run (--state),
	// nil if none; it must be consistent with Note and with the chain.
	Previous []byte
	// Prover, if set, supplies a consistency proof for fork reports.
	Prover ConsistencyProver
}

// CheckpointResult is the outcome of a CheckpointCheck.
type CheckpointResult struct {
	Checkpoint tlog.Checkpoint
	// Latest is the note to keep for the next run: the larger of Note and
	// Previous.
	Latest     []byte
	Violations []Violation
}

// ErrCheckpoint is the parent of errors about a checkpoint that cannot be
// checked at all: a bad signature, a wrong origin, malformed text. Such a
// checkpoint proves nothing about the ledger.
var ErrCheckpoint = errors.New("checkpoint rejected")

// Check verifies the signatures of Note (and Previous), then computes the
// ledger's Merkle root at each checkpoint's size from the chain hashes
// src yields and compares it with the signed root. The chain itself is
// checked by Verifier.Check: a receipt edited in place without its hash
// is a hash_mismatch there, and one rewritten with recomputed hashes
// changes the root here.
func (c *CheckpointCheck) Check(ctx context.Context, src Source) (*CheckpointResult, error) {
	cp, prev, err := c.open()
	if err != nil {
		return nil, err
	}
	res := &CheckpointResult{Checkpoint: cp, Latest: c.Note}
	if prev != nil && prev.Size > cp.Size {
		res.Latest = c.Previous
	}
	sizes, read, err := chainRoots(ctx, src, cp, prev)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	check := func(p tlog.Checkpoint, what string) bool {
		root, ok := sizes[p.Size]
		switch {
		case !ok:
			res.Violations = append(res.Violations, Violation{Seq: uint64(read), Rule: RuleCheckpointMismatch,
				Detail: fmt.Sprintf("%s signs %d receipts, but the chain has only %d (truncated)", what, p.Size, read)})
			return false
		case root != p.Root:
			res.Violations = append(res.Violations, Violation{Seq: uint64(p.Size), Rule: RuleCheckpointMismatch,
				Detail: fmt.Sprintf("%s signs root %s at size %d, the chain's Merkle root there is %s (receipts up to %d were changed)",
					what, p.Root, p.Size, root, p.Size)})
			return false
		}
		return true
	}
	okNew := check(cp, "the checkpoint")
	if prev == nil {
		return res, nil
	}
	okPrev := check(*prev, "the previously verified checkpoint")
	if okNew && okPrev {
		return res, nil // both are roots of this one chain: consistent
	}
	if v := c.fork(ctx, cp, *prev); v != nil {
		res.Violations = append(res.Violations, *v)
	}
	return res, nil
}

// open checks the signatures of Note and Previous (nil without one) and
// that both are for one origin.
func (c *CheckpointCheck) open() (tlog.Checkpoint, *tlog.Checkpoint, error) {
	cp, err := tlog.OpenCheckpoint(c.Note, c.Verifier, c.Namespace)
	if err != nil {
		return cp, nil, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	if c.Previous == nil {
		return cp, nil, nil
	}
	p, err := tlog.OpenCheckpoint(c.Previous, c.Verifier, c.Namespace)
	if err != nil {
		return cp, nil, fmt.Errorf("%w: the checkpoint in the state file: %w", ErrCheckpoint, err)
	}
	if p.Origin != cp.Origin {
		return cp, nil, fmt.Errorf("%w: origin %q, but the state file's checkpoint is for %q", ErrCheckpoint, cp.Origin, p.Origin)
	}
	return cp, &p, nil
}

// chainRoots reads the chain up to the larger checkpoint's size and
// returns its Merkle roots at 0 and at the checkpoints' sizes it reaches,
// and how many receipts it read.
func chainRoots(ctx context.Context, src Source, cp tlog.Checkpoint, prev *tlog.Checkpoint) (map[int64]tlog.Hash, int64, error) {
	sizes := map[int64]tlog.Hash{0: tlog.EmptyRoot}
	var f tlog.Frontier
	maxSize := cp.Size
	if prev != nil {
		maxSize = max(maxSize, prev.Size)
	}
	err := src.Receipts(ctx, 0, func(r *chain.Receipt) error {
		f.Append(r.Hash)
		if f.Size() == cp.Size || prev != nil && f.Size() == prev.Size {
			sizes[f.Size()] = f.Root()
		}
		if f.Size() >= maxSize {
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return nil, 0, err
	}
	return sizes, f.Size(), nil
}

// fork decides, when one of two checkpoints does not match the chain,
// whether they are at least consistent with each other: a violation if
// they sign two roots at one size, or the larger does not prove it
// extends the smaller (a Prover that gives no proof counts as no).
func (c *CheckpointCheck) fork(ctx context.Context, cp, prev tlog.Checkpoint) *Violation {
	small, large := prev, cp
	if small.Size > large.Size {
		small, large = large, small
	}
	detail := fmt.Sprintf("the checkpoint:\n%s\nthe previously verified checkpoint:\n%s", c.Note, c.Previous)
	fork := small.Size == large.Size && small.Root != large.Root
	if !fork && c.Prover != nil && small.Size > 0 && small.Size < large.Size {
		proof, err := c.Prover.ConsistencyProof(ctx, small.Size, large.Size)
		if err != nil {
			detail += fmt.Sprintf("\nno consistency proof %d→%d: %v", small.Size, large.Size, err)
			fork = true
		} else if err := tlog.CheckConsistency(proof, large.Size, large.Root, small.Size, small.Root); err != nil {
			hs := make([]string, len(proof))
			for i := range proof {
				hs[i] = proof[i].String()
			}
			detail += fmt.Sprintf("\nconsistency proof %d→%d [%s]: %v", small.Size, large.Size, strings.Join(hs, " "), err)
			fork = true
		}
	}
	if !fork {
		return nil
	}
	return &Violation{Seq: uint64(small.Size), Rule: RuleCheckpointFork, Detail: detail}
}

// stateWithCheckpoint is the --state file with the latest verified
// checkpoint beside the head.
type stateWithCheckpoint struct {
	Pin
	Checkpoint string `json:"checkpoint,omitempty"`
}

// ReadStateCheckpoint returns the checkpoint kept in a state file, nil if
// none (or no file).
func ReadStateCheckpoint(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	var s stateWithCheckpoint
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("read state %s: %w", path, err)
	}
	if s.Checkpoint == "" {
		return nil, nil
	}
	return []byte(s.Checkpoint), nil
}

// WriteStateCheckpoint pins head and the latest verified checkpoint in
// path atomically, like WriteState.
func WriteStateCheckpoint(path string, head Pin, checkpoint []byte) error {
	return writeJSONAtomic(path, stateWithCheckpoint{Pin: head, Checkpoint: string(checkpoint)})
}
