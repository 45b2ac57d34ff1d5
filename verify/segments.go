package verify

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/archive"
	"github.com/effect-ledger/effect-ledger/chain"
)

// Segments joins the archive directory's segments to the ledger (SPEC
// §16, verify --segments): every prune receipt the chain pass reads must
// have its segment, archive.Name(Namespace, from, through) in Dir, whole
// and holding the very receipts the ledger keeps the hashes of.
type Segments struct {
	Dir       string
	Namespace string
	// Keys, if any, check each segment's checkpoint signature too.
	Keys []note.Verifier
}

// ErrSegmentsNeedFullRun: Opts.Segments joins every prune receipt of the
// chain, which a server's chain or an incremental run's does not give.
var ErrSegmentsNeedFullRun = errors.New("segments are joined on a full run of a database")

// KeptHashes reads the chain hashes a ledger keeps for seqs from…through
// (from ≥ 1), in seq order: fn gets each seq it holds and its hash. A seq
// it does not hold is left out.
type KeptHashes func(ctx context.Context, from, through uint64, fn func(seq uint64, h chain.Hash) error) error

// liveHashes are the hashes of the live receipts of src: while no body is
// deleted, every hash the ledger keeps is a live receipt's.
func liveHashes(src Source) KeptHashes {
	return func(ctx context.Context, from, through uint64, fn func(uint64, chain.Hash) error) error {
		err := src.Receipts(ctx, from-1, func(r *chain.Receipt) error {
			if r.Seq > through {
				return errStop
			}
			return fn(r.Seq, r.Hash)
		})
		if errors.Is(err, errStop) {
			return nil
		}
		return err
	}
}

// joinSegments checks the segment of every prune receipt the chain pass
// read; it returns how many joined. An error is one of reading, never a
// fault of a segment (those are violations).
func (v *Verifier) joinSegments(ctx context.Context, r *run) (int, error) {
	s := v.opts.Segments
	joined := 0
	for _, p := range r.cc.pruned.list {
		ok, err := v.joinSegment(ctx, s, r.chainCol, p)
		if err != nil {
			return joined, fmt.Errorf("segment of prune receipt %d: %w", p.Seq, err)
		}
		if ok {
			joined++
			r.joined = append(r.joined, p)
		}
	}
	return joined, nil
}

// joinSegment checks prune receipt p's segment: present (segment_missing),
// whole alone, of p's range and digest, its prev_hash the ledger's hash of
// from-1 and each receipt's hash the ledger's (segment_mismatch).
func (v *Verifier) joinSegment(ctx context.Context, s *Segments, col *collector, p PrunedRange) (bool, error) {
	name := archive.Name(s.Namespace, p.From, p.Through)
	path := filepath.Join(s.Dir, name)
	mismatch := func(format string, args ...any) {
		col.addf(p.Seq, RuleSegmentMismatch, "segment %s of the range %d…%d (prune receipt %d): %s",
			path, p.From, p.Through, p.Seq, fmt.Sprintf(format, args...))
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		col.addf(p.Seq, RuleSegmentMissing, "no segment %s in %s for the range %d…%d that prune receipt %d pruned",
			name, s.Dir, p.From, p.Through, p.Seq)
		return false, nil
	case err != nil:
		return false, err
	case !fi.IsDir():
		mismatch("not a directory")
		return false, nil
	}
	got, err := archive.Check(path, s.Keys)
	switch {
	case errors.Is(err, archive.ErrInvalid) || errors.Is(err, fs.ErrNotExist):
		mismatch("it does not check alone: %v", err)
		return false, nil
	case err != nil:
		return false, err
	case got.Namespace != s.Namespace || got.From != p.From || got.Through != p.Through:
		mismatch("its manifest is of namespace %s, receipts %d…%d", got.Namespace, got.From, got.Through)
		return false, nil
	case got.Digest != p.Digest:
		mismatch("its digest %s is not the prune receipt's %s", got.Digest, p.Digest)
		return false, nil
	}
	detail, err := v.compareHashes(ctx, got)
	if err != nil || detail != "" {
		if detail != "" {
			mismatch("%s", detail)
		}
		return false, err
	}
	return true, nil
}

// compareHashes compares a checked segment's prev_hash and receipt hashes
// with the hashes the ledger keeps for from-1…through: the first
// difference, or "" for none.
func (v *Verifier) compareHashes(ctx context.Context, got *archive.Checked) (string, error) {
	prev, err := chain.ParseHash(got.PrevHash) // archive.Check parsed it
	if err != nil {
		return "", err
	}
	if got.From == 1 && prev != chain.ZeroHash {
		return fmt.Sprintf("its prev_hash %s is not the genesis's 32 zero bytes", prev), nil
	}
	var detail string
	next, wantPrev := got.From, got.From > 1
	stop := func(format string, args ...any) error {
		detail = fmt.Sprintf(format, args...)
		return errStop
	}
	const noHash = "the ledger keeps no hash of receipt %d"
	err = v.kept(ctx, max(got.From-1, 1), got.Through, func(seq uint64, h chain.Hash) error {
		switch {
		case wantPrev && seq != got.From-1:
			return stop(noHash, got.From-1)
		case wantPrev:
			wantPrev = false
			if h != prev {
				return stop("its prev_hash %s is not the ledger's hash %s of receipt %d", prev, h, seq)
			}
			return nil
		case seq != next:
			return stop(noHash, next)
		case got.Hashes[seq-got.From] != h:
			return stop("receipt %d has hash %s, the ledger keeps %s", seq, got.Hashes[seq-got.From], h)
		}
		next++
		return nil
	})
	switch {
	case err != nil && !errors.Is(err, errStop):
		return "", err
	case detail != "":
		return detail, nil
	case wantPrev:
		return fmt.Sprintf(noHash, got.From-1), nil
	case next <= got.Through:
		return fmt.Sprintf(noHash, next), nil
	}
	return "", nil
}
