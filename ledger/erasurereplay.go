package ledger

import (
	"context"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
)

// Backups taken before an erasure still hold the values (SPEC §14):
// ExportErasures lists what a ledger erased, by seq and chain hash;
// ReplayErasures erases the same values in a ledger restored from such a
// backup, wherever the receipt at that seq is the same (same chain hash),
// through the erase path of Erase, so that the restored ledger verifies.

// ErasureSource is what ExportErasures reads of a namespace: its erasures,
// the erase receipts, the openings and the chain hashes of the receipts
// they erased.
type ErasureSource interface {
	Erasures(ctx context.Context, fn func(*Erasure) error) error
	PendingErasures(ctx context.Context, fn func(*PendingErase) error) error
	GetReceipt(ctx context.Context, seq uint64) (*chain.Receipt, error)
	ReceiptHashes(ctx context.Context, from uint64, n int) ([]chain.Hash, error)
	Openings(ctx context.Context, seqs []uint64) (map[uint64]*chain.Opening, error)
}

// exportChunk bounds the receipts ExportErasures reads at once.
const exportChunk = 512

// ExportErasures lists the erasures of namespace ns read from c: each
// erase receipt with the receipts it erased (seq, chain hash, the fields
// whose values it deleted) and the MACs of the subjects it was asked for.
func ExportErasures(ctx context.Context, c ErasureSource, ns string) (*NamespaceErasures, error) {
	out := &NamespaceErasures{Namespace: ns, Erasures: []ErasureRecord{}, Pending: []PendingRecord{}}
	err := c.PendingErasures(ctx, func(p *PendingErase) error {
		h, err := c.ReceiptHashes(ctx, p.FirstSeq-1, 1)
		if err != nil || len(h) != 1 {
			return fmt.Errorf("pending mark of %s at %d: the reserve's hash: %w", p.Key, p.FirstSeq, err)
		}
		out.Pending = append(out.Pending, PendingRecord{Key: p.Key, FirstSeq: p.FirstSeq, Hash: h[0].String(),
			EraseSeq: p.EraseSeq, Fields: p.Fields.Names()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("export erasures of %s: %w", ns, err)
	}
	err = c.Erasures(ctx, func(e *Erasure) error {
		rec, err := exportErasure(ctx, c, e)
		if err != nil {
			return fmt.Errorf("erasure %d: %w", e.Seq, err)
		}
		out.Erasures = append(out.Erasures, *rec)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("export erasures of %s: %w", ns, err)
	}
	return out, nil
}

func exportErasure(ctx context.Context, c ErasureSource, e *Erasure) (*ErasureRecord, error) {
	r, err := c.GetReceipt(ctx, e.Seq)
	if err != nil {
		return nil, err
	}
	res, _, err := chain.ParseEraseResult(r.Result)
	if err != nil {
		return nil, err
	}
	rec := &ErasureRecord{Seq: e.Seq, Hash: r.Hash.String(), Fields: res.Fields, Retention: res.Retention,
		Subjects: macTexts(e.Subjects), Erased: []ErasedRecord{}}
	for _, rg := range e.Ranges {
		for from := rg[0]; from <= rg[1]; from += exportChunk {
			n := min(rg[1]-from+1, exportChunk)
			if err := exportRun(ctx, c, e.Seq, from, n, rec); err != nil {
				return nil, err
			}
		}
	}
	return rec, nil
}

// exportRun adds to rec the receipts from … from+n-1 with a value the
// erase at eraseSeq deleted.
func exportRun(ctx context.Context, c ErasureSource, eraseSeq, from, n uint64, rec *ErasureRecord) error {
	hashes, err := c.ReceiptHashes(ctx, from-1, int(n))
	if err != nil {
		return err
	}
	seqs := make([]uint64, 0, n)
	for s := from; s < from+n; s++ {
		seqs = append(seqs, s)
	}
	open, err := c.Openings(ctx, seqs)
	if err != nil {
		return err
	}
	for i, seq := range seqs {
		var set chain.FieldSet
		for f, by := range open[seq].Erased() {
			if by == eraseSeq {
				set = set.With(f)
			}
		}
		if set != 0 && i < len(hashes) {
			rec.Erased = append(rec.Erased, ErasedRecord{Seq: seq, Hash: hashes[i].String(), Fields: set.Names()})
		}
	}
	return nil
}

// Replay statuses of an erased receipt listed in an erasures file.
const (
	ReplayErased       = "erased"        // its values are erased now
	ReplayAlready      = "already"       // the same receipt, nothing listed left to erase
	ReplayHashMismatch = "hash_mismatch" // another receipt at that seq: skipped
	ReplayAbsent       = "absent"        // no receipt at that seq: skipped
)

// Replay statuses of a listed pending mark, besides absent and
// hash_mismatch.
const (
	ReplayMarked = "marked" // the generation is in flight here: marked
	ReplayFinal  = "final"  // the generation is finalized here: skipped
)

// ReplayPending is what a replay did with one listed pending mark:
// ReplayMarked, ReplayAlready (marked before), ReplayFinal, ReplayAbsent
// or ReplayHashMismatch (the reserve at first_seq is not the same).
type ReplayPending struct {
	Key      string
	FirstSeq uint64
	Status   string
}

// ReplayItem is what a replay did with one listed receipt.
type ReplayItem struct {
	Erasure uint64 // the erase receipt of the file that lists it
	Seq     uint64
	Status  string
}

// ReplayResult is the outcome of ReplayErasures in one namespace.
type ReplayResult struct {
	// Receipts are the erase receipts appended, one per erasure of the
	// file that found values to erase (in the file's order).
	Receipts []ReceiptRef
	// Replayed maps each appended erase receipt's seq to the seq of the
	// file's erasure it replays.
	Replayed map[uint64]uint64
	Count    uint64       // receipts whose values were erased
	Items    []ReplayItem // every listed receipt, in the file's order
	// Pending are the listed pending marks, in the file's order.
	Pending []ReplayPending
}

// Skipped are the listed receipts that were not this ledger's.
func (r *ReplayResult) Skipped() []ReplayItem {
	var out []ReplayItem
	for _, it := range r.Items {
		if it.Status == ReplayHashMismatch || it.Status == ReplayAbsent {
			out = append(out, it)
		}
	}
	return out
}

// ReplayErasures applies the erasures of f, a namespace's part of an
// erasures file, to this namespace: for each listed receipt whose seq
// holds a receipt of the same chain hash here, the listed fields' values
// and salts are deleted, and each erasure that deleted something appends
// an erase receipt (actor, reason) in one transaction; the subject index
// rows of its subjects go too. A receipt with another hash, or none, is
// skipped and reported; a replay that finds nothing to erase appends
// nothing, so replaying a file twice changes nothing the second time.
func (n *Namespace) ReplayErasures(ctx context.Context, f *NamespaceErasures, actor, reason string) (*ReplayResult, error) {
	if err := CheckEraseReason(reason); err != nil {
		return nil, err
	}
	var res *ReplayResult
	err := n.submit(ctx, "", func(ctx context.Context, t *batchTx) error {
		res = &ReplayResult{Replayed: map[uint64]uint64{}}
		head := t.Head().Seq // the receipts this replay appends are never the ones erased
		for i := range f.Erasures {
			if err := t.replayErasure(ctx, &f.Erasures[i], head, actor, reason, res); err != nil {
				return fmt.Errorf("replay erasure %d: %w", f.Erasures[i].Seq, err)
			}
		}
		for i := range f.Pending {
			st, err := t.replayPending(ctx, &f.Pending[i], head, actor)
			if err != nil {
				return fmt.Errorf("replay the pending mark of %s: %w", f.Pending[i].Key, err)
			}
			res.Pending = append(res.Pending, ReplayPending{Key: f.Pending[i].Key, FirstSeq: f.Pending[i].FirstSeq, Status: st})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(res.Receipts) > 0 {
		erasures.WithLabelValues(n.name, "replay").Add(float64(len(res.Receipts)))
		n.l.logger.InfoContext(ctx, "erasures replayed", "namespace", n.name, "receipts", len(res.Receipts), "count", res.Count)
	}
	return res, nil
}

// replayErasure replays one erasure of a file into res; a seq above head
// is absent.
func (t *batchTx) replayErasure(ctx context.Context, e *ErasureRecord, head uint64, actor, reason string, res *ReplayResult) error {
	fieldSet, err := canonicalFields(e.Fields)
	if err != nil {
		return err
	}
	macs, err := parseMACs(e.Subjects)
	if err != nil {
		return err
	}
	matched := map[uint64]chain.FieldSet{}
	var seqs []uint64
	for _, x := range e.Erased {
		item := ReplayItem{Erasure: e.Seq, Seq: x.Seq, Status: ReplayAbsent}
		if x.Seq <= head {
			r, err := t.Receipt(ctx, x.Seq)
			if err != nil {
				return err
			}
			item.Status = ReplayHashMismatch
			if r.Hash.String() == x.Hash {
				if err := t.eraseAskInput(ctx, &r); err != nil { // as the erase did there
					return err
				}
				set, _ := canonicalFields(x.Fields)
				matched[x.Seq], item.Status = set, ReplayAlready
				seqs = append(seqs, x.Seq)
			}
		}
		res.Items = append(res.Items, item)
	}
	if len(matched) == 0 {
		return nil // nothing here is that ledger's
	}
	if len(macs) > 0 {
		for i := range macs {
			if err := t.DeleteSubjects(ctx, &macs[i], nil); err != nil {
				return err
			}
		}
	}
	open, err := t.Openings(ctx, seqs)
	if err != nil {
		return err
	}
	fields := map[uint64]chain.FieldSet{}
	for seq, listed := range matched {
		if set := keptOf(open[seq], listed); set != 0 {
			fields[seq] = set
		}
	}
	if len(fields) == 0 {
		return nil // replayed before, or never held here
	}
	if reason == "" {
		reason = fmt.Sprintf("replay of erase receipt %d", e.Seq)
	}
	r, count, err := t.appendErase(ctx, fields, fieldSet, false, actor, reason, macs)
	if err != nil {
		return err
	}
	for i := len(res.Items) - len(e.Erased); i < len(res.Items); i++ {
		if _, ok := fields[res.Items[i].Seq]; ok {
			res.Items[i].Status = ReplayErased
		}
	}
	res.Receipts = append(res.Receipts, refOf(&r))
	res.Replayed[r.Seq] = e.Seq
	res.Count += count
	return nil
}

// ExportErasures lists the namespace's erasures (the function
// ExportErasures over its chain).
func (n *Namespace) ExportErasures(ctx context.Context) (*NamespaceErasures, error) {
	return ExportErasures(ctx, n.chain, n.name)
}

// replayPending marks the generation of a listed pending mark when it is
// the same here (the reserve at first_seq has the listed chain hash) and
// still in flight, or the ask of one (at first_seq) still waits for its
// approval or its consumption, so that the receipt that finalizes it is erased as it
// is appended. It returns the mark's ReplayPending status.
func (t *batchTx) replayPending(ctx context.Context, p *PendingRecord, head uint64, actor string) (string, error) {
	if p.FirstSeq > head {
		return ReplayAbsent, nil
	}
	r, err := t.Receipt(ctx, p.FirstSeq)
	if err != nil {
		return "", err
	}
	if r.Hash.String() != p.Hash || r.IdempotencyKey != p.Key {
		return ReplayHashMismatch, nil
	}
	if r.Kind == chain.KindAsk { // a key that waited for its approval
		hist, err := t.KeyHistory(ctx, p.Key, 0)
		if err != nil {
			return "", err
		}
		if a := waitingAsk(hist, t.Now()); a == nil || a.Seq != p.FirstSeq {
			return ReplayFinal, nil // answered no, expired, or consumed here
		}
		if err := t.eraseAskInput(ctx, &r); err != nil {
			return "", err
		}
	} else {
		k, found, err := t.Key(ctx, p.Key)
		if err != nil {
			return "", err
		}
		if !found || k.FirstSeq != p.FirstSeq || k.finalized() {
			return ReplayFinal, nil // this generation is over here
		}
	}
	had, err := t.Pending(ctx, p.Key, p.FirstSeq)
	if err != nil || had != nil {
		return ReplayAlready, err
	}
	fields, err := canonicalFields(p.Fields)
	if err != nil {
		return "", err
	}
	return ReplayMarked, t.PutPending(ctx, &PendingErase{Key: p.Key, FirstSeq: p.FirstSeq, Fields: fields, Actor: actor})
}
