package verify

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/effect-ledger/effect-ledger/archive"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
)

// With every pruned range joined to its segment (Opts.Segments), a full
// run checks the key states, the gate and the audit from seq 1 (SPEC
// §16): a second pass reads the segments' receipts, with their
// payloads.jsonl as openings, then the live chain, through the in-memory
// strategy (memory.go: every key state in memory, as for a server). Its
// state violations and audit replace the live range's; its chain
// violations of the pruned receipts are added (the receipts past K were
// chain-checked by the first pass already).

// joinedSource is the segments' receipts, then the live chain after P.
type joinedSource struct {
	dirs    []string // the segments of 1…P, in seq order
	through uint64   // P
	until   uint64   // the first pass's last seq: the joined pass stops there
	db      DB
}

// liveOpenBatch is how many live receipts' values are read at once.
const liveOpenBatch = 512

func (s *joinedSource) Receipts(ctx context.Context, after uint64, fn func(*chain.Receipt) error) error {
	for _, dir := range s.dirs {
		open := map[uint64]*chain.Opening{}
		err := archive.Payloads(dir, func(p *archive.Payload) error {
			f, ok := chain.ParsePayloadField(p.Field)
			salt, err := chain.ParseSalt(p.Salt)
			if !ok || err != nil {
				return fmt.Errorf("segment %s: payload %s of receipt %d: %w", dir, p.Field, p.Seq, archive.ErrInvalid)
			}
			o := open[p.Seq]
			if o == nil {
				o = &chain.Opening{}
				open[p.Seq] = o
			}
			o.Set(f, &chain.Payload{Value: p.Value, Salt: salt})
			return nil
		})
		if err != nil {
			return err
		}
		err = archive.Receipts(dir, func(r *chain.Receipt) error {
			if r.Seq <= after {
				return nil
			}
			r.Open = open[r.Seq]
			return fn(r)
		})
		if err != nil {
			return err
		}
	}
	batch := make([]chain.Receipt, 0, liveOpenBatch)
	flush := func() error {
		var seqs []uint64
		for i := range batch {
			if mayHoldValues(&batch[i]) {
				seqs = append(seqs, batch[i].Seq)
			}
		}
		if len(seqs) > 0 {
			open, err := s.db.Openings(ctx, seqs)
			if err != nil {
				return err
			}
			for i := range batch {
				batch[i].Open = open[batch[i].Seq]
			}
		}
		for i := range batch {
			if err := fn(&batch[i]); err != nil {
				return err
			}
		}
		batch = batch[:0]
		return nil
	}
	err := s.db.Receipts(ctx, max(after, s.through), func(r *chain.Receipt) error {
		if r.Seq > s.until {
			return errStop
		}
		batch = append(batch, *r)
		if len(batch) == liveOpenBatch {
			return flush()
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return err
	}
	return flush()
}

// The rest of Remote: a full run asks none of it but the TTL and the mode.

func (s *joinedSource) KeyHistory(context.Context, string, func(*chain.Receipt) error) error {
	return errors.New("a joined run reads no key history")
}
func (s *joinedSource) KeyTTL(ctx context.Context) (uint64, error) { return s.db.KeyTTL(ctx) }
func (s *joinedSource) Payloads(ctx context.Context) (ledger.PayloadMode, error) {
	return s.db.Payloads(ctx)
}
func (s *joinedSource) ListReceipts(ctx context.Context, f ledger.ReceiptFilter) ([]chain.Receipt, *uint64, error) {
	return s.db.ListReceipts(ctx, f)
}
func (s *joinedSource) SwitchedAt(context.Context) (uint64, error) { return 0, nil }

// Pruned: the segments stand for the pruned prefix, read from seq 1.
func (s *joinedSource) Pruned(context.Context) (*ServedPrune, error) { return nil, nil }

// segmentsCover returns the directories of the joined segments when they
// cover 1…P without a gap, else nil.
func (r *run) segmentsCover(s *Segments) []string {
	p := r.pruned.mark.Through
	if p == 0 || r.pruned.c == nil {
		return nil
	}
	joined := slices.Clone(r.joined)
	slices.SortFunc(joined, func(a, b PrunedRange) int { return int(a.From) - int(b.From) })
	var dirs []string
	next := uint64(1)
	for _, j := range joined {
		if j.From != next {
			return nil
		}
		dirs = append(dirs, filepath.Join(s.Dir, archive.Name(s.Namespace, j.From, j.Through)))
		next = j.Through + 1
	}
	if next != p+1 {
		return nil
	}
	return dirs
}

// joinedPass runs the key states, the gate and the audit from seq 1 over
// the segments and the live chain, and puts them in r in place of the
// live range's.
func (v *Verifier) joinedPass(ctx context.Context, r *run, dirs []string) error {
	db := v.db
	if lp, ok := db.(livePart); ok {
		db = lp.DB
	}
	src := &joinedSource{dirs: dirs, through: r.pruned.mark.Through, until: r.through, db: db}
	opts := v.opts
	opts.Segments, opts.Pinned, opts.ExpectHead, opts.Incremental, opts.Progress = nil, nil, nil, false, nil
	jv := &Verifier{remote: src, src: src, keyTTL: src.KeyTTL, list: src.ListReceipts, mode: src.Payloads, opts: opts}
	jr, err := jv.begin(ctx)
	if err != nil {
		return err
	}
	jr.state.prunes = r.pruned.rows
	jr.gate.policies, jr.gate.policyCol = &[]chain.PrunePolicy{}, r.chainCol
	err = jv.memoryPass(ctx, jr)
	if jr.cc.payloads != nil {
		err = errors.Join(err, jr.cc.payloads.close())
	}
	if err != nil {
		return err
	}
	jr.cc.finish()
	// The pruned receipts' chain violations; those after K the first
	// pass found already, but the recorded_at of K+1, which it could not
	// compare.
	k := r.pruned.mark.Kept
	for _, vi := range jr.chainCol.list {
		if vi.Seq <= k || vi.Seq <= r.pruned.mark.Through && !chainRule(vi.Rule) ||
			vi.Seq == k+1 && vi.Rule == RuleRecordedAtDecreased {
			r.chainCol.add(vi.Seq, vi.Rule, vi.Detail)
		}
	}
	r.stateCol, r.audit, r.dups, r.repeats, r.gate = jr.stateCol, jr.audit, jr.dups, jr.repeats, jr.gate
	return nil
}

// chainRule reports the rules of the chain itself, which the first pass
// checks on the receipts it reads.
func chainRule(rule string) bool {
	switch rule {
	case RuleGenesis, RuleSeqGap, RuleBrokenLink, RuleHashMismatch, RuleRecordedAtDecreased, RuleHeadMismatch:
		return true
	}
	return false
}
