package ledger

import (
	"context"
	"fmt"

	"golang.org/x/mod/sumdb/note"

	"github.com/effect-ledger/effect-ledger/archive"
	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// WriteSegment archives the receipts from … through of namespace ns into
// the archive directory dir (SPEC §16, step 1): their chain form, the
// payload values and salts still kept, and a manifest with the chain hash
// of from-1, the tree's frontier before from, the latest checkpoint
// (which must cover through) and the consistency proof from through to
// it. The segment is fsynced, renamed into place and read back
// (archive.Check with the log's verifier keys vs; none: its own
// consistency only). It returns the segment's path. Errors: *Error with
// ECodeInvalidRequest for a range outside the tree, ECodeNotCheckpointed
// while no checkpoint covers through.
func (ns Log) WriteSegment(ctx context.Context, name, dir string, from, through uint64, vs []note.Verifier) (string, error) {
	path, _, err := ns.writeSegment(ctx, name, dir, from, through, vs)
	return path, err
}

// writeSegment is WriteSegment, which also returns the segment's digest.
func (ns Log) writeSegment(ctx context.Context, name, dir string, from, through uint64, vs []note.Verifier) (path, digest string, err error) {
	size, err := ns.TreeSize(ctx)
	if err != nil {
		return "", "", err
	}
	if from == 0 || through < from || through > uint64(size) {
		return "", "", Invalid("through", "the range %d…%d is not within the chain's receipts 1…%d", from, through, size)
	}
	c, err := ns.LatestCheckpoint(ctx)
	if err != nil {
		return "", "", err
	}
	if c == nil || c.Size < int64(through) {
		return "", "", &Error{Code: ECodeNotCheckpointed, Message: fmt.Sprintf("no signed checkpoint covers receipt %d yet; retry after the next one (ledgerd --signing-key signs them)", through),
			Details: map[string]any{"seq": through}}
	}
	hr := ns.HashReader(ctx)
	proof, err := tlog.ProveConsistency(c.Size, int64(through), hr)
	if err != nil {
		return "", "", err
	}
	frontier, err := tlog.FrontierNodes(int64(from-1), hr)
	if err != nil {
		return "", "", err
	}
	prev := chain.ZeroHash
	if from > 1 {
		hs, err := ns.ReceiptHashes(ctx, from-2, 1)
		if err != nil {
			return "", "", err
		}
		prev = hs[0]
	}
	w, err := archive.Create(dir, name, from, prev, frontier)
	if err != nil {
		return "", "", err
	}
	if err := ns.segmentBodies(ctx, w, from, through); err != nil {
		w.Abort()
		return "", "", err
	}
	path, err = w.Finish(c.Note, proof, vs)
	return path, w.Digest(), err
}

// segmentBodies writes the receipts from … through, and their kept
// payloads, to w a page at a time.
func (ns Log) segmentBodies(ctx context.Context, w *archive.Writer, from, through uint64) error {
	f := ReceiptFilter{After: from - 1, Limit: MaxPageLimit}
	for f.After < through {
		rs, _, err := ns.ListReceipts(ctx, f)
		if err != nil {
			return err
		}
		if len(rs) == 0 {
			return fmt.Errorf("segment: receipt %d is missing", f.After+1)
		}
		var open map[uint64]*chain.Opening
		if ns.Payloads != nil {
			seqs := make([]uint64, 0, len(rs))
			for i := range rs {
				seqs = append(seqs, rs[i].Seq)
			}
			if open, err = ns.Payloads.Openings(ctx, seqs); err != nil {
				return fmt.Errorf("read payloads: %w", err)
			}
		}
		for i := range rs {
			if rs[i].Seq > through {
				return nil
			}
			if err := w.Receipt(&rs[i]); err != nil {
				return err
			}
			for _, fld := range chain.PayloadFields {
				if p := open[rs[i].Seq].Get(fld); p != nil && p.ErasedBy == 0 {
					if err := w.Payload(rs[i].Seq, fld, *p); err != nil {
						return err
					}
				}
			}
			f.After = rs[i].Seq
		}
	}
	return nil
}
