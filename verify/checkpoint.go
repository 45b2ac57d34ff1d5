package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
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
	// Trust, when set, replaces Verifier: the keys trusted (a state
	// file's), learning the keys the chain's key receipts announce
	// (SPEC §9.2, checkpoint_keys.go).
	Trust *KeyTrust
	// Covering, with Trust, finds a stored checkpoint covering a key
	// receipt that the checkpoint checked does not prove; nil: none.
	Covering Covering
	// Pruned, for a database, reads its pruned prefix (SPEC §16): the
	// kept hashes of deleted bodies lead the chain. nil for a server.
	Pruned DB
}

// CheckpointResult is the outcome of a CheckpointCheck.
type CheckpointResult struct {
	Checkpoint tlog.Checkpoint
	// Latest is the note to keep for the next run: the larger of Note and
	// Previous.
	Latest     []byte
	Violations []Violation
	// Trust is the key trust after the run (with CheckpointCheck.Trust).
	Trust *KeyTrust
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
	if c.Trust != nil {
		return c.checkTrust(ctx, src)
	}
	cp, prev, err := c.open()
	if err != nil {
		return nil, err
	}
	sizes, read, err := chainRoots(ctx, src, c.Pruned, cp, prev, nil)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	res := &CheckpointResult{Checkpoint: cp, Latest: c.Note}
	c.compare(ctx, res, sizes, read, cp, prev)
	return res, nil
}

// compare compares the roots of cp and prev with the chain's (sizes, of
// a chain of read receipts) and adds the violations to res.
func (c *CheckpointCheck) compare(ctx context.Context, res *CheckpointResult, sizes map[int64]tlog.Hash, read int64, cp tlog.Checkpoint, prev *tlog.Checkpoint) {
	if prev != nil && prev.Size > cp.Size {
		res.Latest = c.Previous
	}
	okNew := c.checkRoot(res, sizes, read, cp, "the checkpoint")
	if prev == nil {
		return
	}
	okPrev := c.checkRoot(res, sizes, read, *prev, "the previously verified checkpoint")
	if okNew && okPrev {
		return // both are roots of this one chain: consistent
	}
	if v := c.fork(ctx, cp, *prev); v != nil {
		res.Violations = append(res.Violations, *v)
	}
}

// checkRoot compares the root p signs with the chain's at its size.
func (c *CheckpointCheck) checkRoot(res *CheckpointResult, sizes map[int64]tlog.Hash, read int64, p tlog.Checkpoint, what string) bool {
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

// checkTrust is Check with a KeyTrust: the chain's key receipts teach it
// new keys, and the checkpoint must be signed by a current one.
func (c *CheckpointCheck) checkTrust(ctx context.Context, src Source) (*CheckpointResult, error) {
	body, err := tlog.ParseCheckpoint(tlog.NoteText(c.Note))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCheckpoint, err)
	}
	var prev *tlog.Checkpoint
	if c.Previous != nil {
		all, err := verifiers(append(slices.Clone(c.Trust.Current), c.Trust.Retired...))
		if err != nil {
			return nil, fmt.Errorf("%w: the state file's keys: %w", ErrCheckpoint, err)
		}
		p, _, err := tlog.OpenCheckpointAny(c.Previous, all, c.Namespace)
		if err != nil {
			return nil, fmt.Errorf("%w: the checkpoint in the state file: %w", ErrCheckpoint, err)
		}
		prev = &p
	}
	k := &keyLearner{trust: KeyTrust{Current: slices.Clone(c.Trust.Current), Retired: slices.Clone(c.Trust.Retired),
		Handovers: slices.Clone(c.Trust.Handovers)}, note: c.Note, size: body.Size, covering: c.Covering, proofs: map[int64]tlog.Checkpoint{}}
	if k.covering == nil {
		k.covering = func(context.Context, int64) (*tlog.Signed, error) { return nil, nil }
	}
	sizes, read, err := chainRoots(ctx, src, c.Pruned, body, prev, k)
	if err == nil {
		err = k.err
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	cp, v, err := k.judge(c.Namespace)
	if err != nil {
		return nil, err
	}
	if v != nil && v.Rule == RuleCheckpointKeyUnknown && c.Previous == nil && len(k.trust.Handovers) == 0 {
		// Nothing pinned, nothing learnt: the key given is not the log's.
		return nil, fmt.Errorf("%w: %s: %s", ErrCheckpoint, v.Rule, v.Detail)
	}
	res := &CheckpointResult{Checkpoint: cp, Latest: c.Note, Trust: &k.trust}
	if v != nil {
		res.Violations = append(res.Violations, *v)
		if v.Rule == RuleCheckpointKeyUnknown {
			return res, nil // what it signs proves nothing
		}
	}
	if prev != nil && prev.Origin != cp.Origin {
		return nil, fmt.Errorf("%w: origin %q, but the state file's checkpoint is for %q", ErrCheckpoint, cp.Origin, prev.Origin)
	}
	for _, p := range k.proofs {
		c.checkRoot(res, sizes, read, p, "the checkpoint proving a key receipt")
	}
	c.compare(ctx, res, sizes, read, cp, prev)
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
// and how many receipts it read. k, if set, sees every receipt read and
// may ask for the root at a further size.
func chainRoots(ctx context.Context, src Source, pruned DB, cp tlog.Checkpoint, prev *tlog.Checkpoint, k *keyLearner) (map[int64]tlog.Hash, int64, error) {
	sizes := map[int64]tlog.Hash{0: tlog.EmptyRoot}
	want := map[int64]bool{cp.Size: true}
	var f tlog.Frontier
	maxSize := cp.Size
	if prev != nil {
		maxSize = max(maxSize, prev.Size)
		want[prev.Size] = true
	}
	leaf := func(r *chain.Receipt) error {
		f.Append(r.Hash)
		if k != nil {
			if n := k.receipt(ctx, r); n > 0 {
				want[n] = true
			}
		}
		if want[f.Size()] {
			sizes[f.Size()] = f.Root()
		}
		if f.Size() >= maxSize {
			return errStop
		}
		return nil
	}
	// A pruned ledger (SPEC §16): the kept hashes of the deleted bodies
	// first, with the key receipts whose bodies it keeps.
	after, err := keptLeaves(ctx, pruned, leaf)
	if err == nil {
		err = src.Receipts(ctx, after, leaf)
	}
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
// checkpoint and the signing keys trusted beside the head.
type stateWithCheckpoint struct {
	Pin
	Checkpoint string    `json:"checkpoint,omitempty"`
	Keys       *KeyTrust `json:"keys,omitempty"`
}

// readStateFile reads a state file; zero without one.
func readStateFile(path string) (stateWithCheckpoint, error) {
	var s stateWithCheckpoint
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("read state: %w", err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("read state %s: %w", path, err)
	}
	return s, nil
}

// ReadStateCheckpoint returns the checkpoint kept in a state file, nil if
// none (or no file).
func ReadStateCheckpoint(path string) ([]byte, error) {
	s, err := readStateFile(path)
	if err != nil || s.Checkpoint == "" {
		return nil, err
	}
	return []byte(s.Checkpoint), nil
}

// ReadStateKeys returns the signing keys a state file trusts, nil if none
// (or no file).
func ReadStateKeys(path string) (*KeyTrust, error) {
	s, err := readStateFile(path)
	if err != nil || s.Keys == nil {
		return nil, err
	}
	if _, err := verifiers(append(slices.Clone(s.Keys.Current), s.Keys.Retired...)); err != nil {
		return nil, fmt.Errorf("read state %s: keys: %w", path, err)
	}
	return s.Keys, nil
}

// WriteStateCheckpoint pins head, the latest verified checkpoint and the
// keys trusted (nil: none kept) in path atomically, like WriteState.
func WriteStateCheckpoint(path string, head Pin, checkpoint []byte, keys *KeyTrust) error {
	return writeJSONAtomic(path, stateWithCheckpoint{Pin: head, Checkpoint: string(checkpoint), Keys: keys})
}
