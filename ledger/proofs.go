package ledger

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// Log serves the proofs and tiles of one namespace's Merkle tree (SPEC
// §9) from its reader: a Namespace, or a store opened read-only.
type Log struct {
	ChainReader
	// Payloads reads a committed namespace's values for its portable
	// receipts (SPEC §14); nil: no values are disclosed.
	Payloads PayloadReader
}

// TileHeight is the height of the tlog-tiles the ledger serves (C2SP).
const TileHeight = 8

// checkpointed returns the stored checkpoint of size n, or the latest one
// when n is 0; field names the query parameter for errors.
func (ns Log) checkpointed(ctx context.Context, n int64, field string) (*tlog.Signed, error) {
	var c *tlog.Signed
	var err error
	if n == 0 {
		c, err = ns.ChainReader.LatestCheckpoint(ctx)
	} else {
		c, err = ns.ChainReader.CheckpointAt(ctx, n)
	}
	if err != nil {
		return nil, err
	}
	if c == nil && n == 0 {
		// SPEC §9: the size defaults to the latest checkpoint's; with none
		// there is no size to prove against.
		return nil, Invalid(field, "no checkpoint has been signed yet, so there is no %s to prove against", field)
	}
	if c == nil {
		return nil, Invalid(field, "%s %d is not the size of a signed checkpoint", field, n)
	}
	if err := ns.withinTree(ctx, c); err != nil {
		return nil, Invalid(field, "%s", ErrorMessage(err))
	}
	return c, nil
}

// withinTree returns a 404 not_checkpointed *Error when checkpoint c is
// larger than the stored tree: the chain was cut after c was signed (a
// damaged ledger repaired with rebuild-index), so nothing can be proved
// against c until the missing receipts are restored.
func (ns Log) withinTree(ctx context.Context, c *tlog.Signed) error {
	size, err := ns.ChainReader.TreeSize(ctx)
	if err != nil {
		return err
	}
	if c.Size <= size {
		return nil
	}
	return &Error{Code: ECodeNotCheckpointed,
		Message: fmt.Sprintf("the signed checkpoint of size %d is beyond the chain (%d receipts): receipts were removed after it was signed; "+
			"nothing can be proved against it until they are restored (ledgerctl verify --checkpoint shows the damage)", c.Size, size),
		Details: map[string]any{"checkpoint_size": c.Size, "tree_size": size}}
}

// InclusionProof proves receipt seq in the checkpointed tree of size n
// (the latest checkpoint when n is 0). Errors: *Error with
// ECodeUnknownReceipt (seq beyond the tree) or ECodeInvalidRequest (n not
// a checkpointed size ≥ seq, or no checkpoint yet).
func (ns Log) InclusionProof(ctx context.Context, seq uint64, n int64) (*tlog.InclusionProof, error) {
	size, err := ns.ChainReader.TreeSize(ctx)
	if err != nil {
		return nil, err
	}
	if seq == 0 {
		return nil, Invalid("seq", "seq must be at least 1")
	}
	if seq > uint64(size) {
		return nil, Errorf(ECodeUnknownReceipt, "no receipt with seq %d", seq)
	}
	c, err := ns.checkpointed(ctx, n, "size")
	if err != nil {
		return nil, err
	}
	if uint64(c.Size) < seq {
		return nil, Invalid("size", "the checkpointed tree of size %d does not contain receipt %d yet", c.Size, seq)
	}
	idx := tlog.LeafIndex(seq)
	p, err := tlog.ProveInclusion(c.Size, idx, ns.ChainReader.HashReader(ctx))
	if err != nil {
		return nil, err
	}
	return &tlog.InclusionProof{Seq: seq, LeafIndex: idx, TreeSize: c.Size, Root: tlog.HexHash(c.Root), Hashes: tlog.HexHashes(p)}, nil
}

// ConsistencyProof proves that the checkpointed tree of size from (0 is
// the empty tree) is a prefix of the checkpointed tree of size to (the
// latest when 0). Errors: *Error with ECodeInvalidRequest.
func (ns Log) ConsistencyProof(ctx context.Context, from, to int64) (*tlog.ConsistencyProof, error) {
	ct, err := ns.checkpointed(ctx, to, "to")
	if err != nil {
		return nil, err
	}
	if from < 0 || from > ct.Size {
		return nil, Invalid("from", "from must be from 0 to %d", ct.Size)
	}
	rootFrom := tlog.EmptyRoot
	if from > 0 {
		cf, err := ns.checkpointed(ctx, from, "from")
		if err != nil {
			return nil, err
		}
		rootFrom = cf.Root
	}
	p, err := tlog.ProveConsistency(ct.Size, from, ns.ChainReader.HashReader(ctx))
	if err != nil {
		return nil, err
	}
	return &tlog.ConsistencyProof{From: from, To: ct.Size, RootFrom: tlog.HexHash(rootFrom), RootTo: tlog.HexHash(ct.Root),
		Hashes: tlog.HexHashes(p)}, nil
}

// PortableReceipt returns receipt seq with its inclusion proof against
// the latest checkpoint. Errors: *Error with ECodeUnknownReceipt or
// ECodeNotCheckpointed.
func (ns Log) PortableReceipt(ctx context.Context, seq uint64) (*tlog.PortableReceipt, error) {
	r, err := ns.ChainReader.GetReceipt(ctx, seq)
	if err != nil {
		return nil, err
	}
	c, err := ns.ChainReader.CheckpointCovering(ctx, int64(seq))
	if err != nil {
		return nil, err
	}
	return ns.portable(ctx, r, c)
}

// PortableReceiptAt returns receipt seq with its inclusion proof against
// the stored checkpoint of size n (404 not_checkpointed when there is
// none, or it does not cover seq).
func (ns Log) PortableReceiptAt(ctx context.Context, seq uint64, n int64) (*tlog.PortableReceipt, error) {
	r, err := ns.ChainReader.GetReceipt(ctx, seq)
	if err != nil {
		return nil, err
	}
	c, err := ns.ChainReader.CheckpointAt(ctx, n)
	if err != nil {
		return nil, err
	}
	if c != nil && c.Size < int64(seq) {
		c = nil
	}
	return ns.portable(ctx, r, c)
}

func (ns Log) portable(ctx context.Context, r *chain.Receipt, c *tlog.Signed) (*tlog.PortableReceipt, error) {
	p, err := ns.bare(ctx, r, c)
	if err != nil {
		return nil, err
	}
	if p.Keys, err = ns.keyProofs(ctx, c.Size); err != nil {
		return nil, err
	}
	return p, nil
}

// keyProofs returns the portable receipts of the key receipts in the tree
// of size n (SPEC §9.2), each against the first checkpoint that covers it:
// one signed while the key it retires still signed.
func (ns Log) keyProofs(ctx context.Context, n int64) ([]tlog.PortableReceipt, error) {
	var out []tlog.PortableReceipt
	f := ReceiptFilter{Kind: chain.KindKey, Limit: MaxPageLimit}
	kept, err := keptKeyBodies(ctx, ns.ChainReader) // pruned ones first (SPEC §16)
	if err != nil {
		return nil, err
	}
	if len(kept) > 0 {
		f.After = kept[len(kept)-1].Seq
	}
	for {
		rs, next, err := ns.ChainReader.ListReceipts(ctx, f)
		if err != nil {
			return nil, err
		}
		rs, kept = append(kept, rs...), nil
		for i := range rs {
			if int64(rs[i].Seq) > n {
				return out, nil
			}
			c, err := ns.ChainReader.FirstCheckpointCovering(ctx, int64(rs[i].Seq))
			if err != nil {
				return nil, err
			}
			if c == nil || c.Size > n {
				continue
			}
			p, err := ns.bare(ctx, &rs[i], c)
			if err != nil {
				return nil, err
			}
			out = append(out, *p)
		}
		if next == nil {
			return out, nil
		}
		f.After = *next
	}
}

// bare is the portable receipt of r against c, without key receipts.
func (ns Log) bare(ctx context.Context, r *chain.Receipt, c *tlog.Signed) (*tlog.PortableReceipt, error) {
	seq := r.Seq
	if c == nil {
		return nil, &Error{Code: ECodeNotCheckpointed, Message: fmt.Sprintf("receipt %d is not covered by a signed checkpoint yet; retry after the next one", seq),
			Details: map[string]any{"seq": seq}}
	}
	if err := ns.withinTree(ctx, c); err != nil {
		return nil, err
	}
	idx := tlog.LeafIndex(seq)
	p, err := tlog.ProveInclusion(c.Size, idx, ns.ChainReader.HashReader(ctx))
	if err != nil {
		return nil, err
	}
	out := &tlog.PortableReceipt{Receipt: *r, LeafIndex: idx, Inclusion: tlog.HexHashes(p), Checkpoint: c.Note}
	out.Receipt.Open = nil // the chain's text: the values go in Payloads
	if err := ns.disclose(ctx, out); err != nil {
		return nil, err
	}
	return out, nil
}

// disclose adds to a committed namespace's portable receipt the openings
// of its payload fields, and the fields erased with the seq of each
// erase (SPEC §14). A kept value that does not open its commitment is an
// integrity error, as in every answer.
func (ns Log) disclose(ctx context.Context, p *tlog.PortableReceipt) error {
	if ns.Payloads == nil {
		return nil
	}
	r := &p.Receipt
	mode, err := ns.Payloads.Payloads(ctx)
	if err != nil {
		return err
	}
	if mode != PayloadsCommitted {
		at, _, err := FindPayloadSwitch(ctx, ns.ChainReader, 0)
		if err != nil || at == 0 || r.Seq <= at {
			return err // inline, or in the inline part of a switched namespace
		}
	}
	open, err := ns.Payloads.Openings(ctx, []uint64{r.Seq})
	if err != nil {
		return fmt.Errorf("read payloads: %w", err)
	}
	o := open[r.Seq]
	if faults := o.Check(r); len(faults) > 0 {
		f := faults[0].Field
		return &Error{Code: ECodeIntegrityError,
			Message: fmt.Sprintf("the %s of receipt %d does not match the commitment the chain recorded for it; `ledgerctl verify` shows what changed", f.Name(), r.Seq),
			Details: map[string]any{"seq": r.Seq, "field": f.Name()}}
	}
	d := tlog.Disclosures{}
	for _, f := range chain.PayloadFields {
		switch v := o.Get(f); {
		case v == nil:
		case v.ErasedBy > 0:
			if p.Erased == nil {
				p.Erased = map[string]uint64{}
			}
			p.Erased[f.Name()] = v.ErasedBy
		default:
			d[f.Name()] = tlog.Disclosed{Value: v.Value, Salt: v.Salt.String()}
		}
	}
	p.Payloads = &d
	return nil
}

// Tile is a tlog-tiles tile: its data and whether it is full (immutable).
type Tile struct {
	Data []byte
	Full bool
}

// ReadTile returns the tile at path, relative to the log's prefix:
// "tile/<L>/<N>[.p/<W>]" (hash tiles) or "tile/entries/<N>[.p/<W>]"
// (entry bundles: uint16be(32) ‖ chain hash per leaf), as C2SP tlog-tiles
// names them. Errors: *Error with ECodeNotFound for a malformed path or a
// tile beyond the stored tree.
func (ns Log) ReadTile(ctx context.Context, path string) (*Tile, error) {
	rest, ok := strings.CutPrefix(path, "tile/")
	if !ok {
		return nil, Errorf(ECodeNotFound, "no such tile")
	}
	if e, ok := strings.CutPrefix(rest, "entries/"); ok {
		rest = "data/" + e
	}
	t, err := sumdb.ParseTilePath(fmt.Sprintf("tile/%d/%s", TileHeight, rest))
	if err != nil || t.H != TileHeight {
		return nil, Errorf(ECodeNotFound, "no such tile: %s", path)
	}
	size, err := ns.ChainReader.TreeSize(ctx)
	if err != nil {
		return nil, err
	}
	level := max(t.L, 0)
	if level > 5 || t.N >= 1<<(62-TileHeight*(level+1)) {
		return nil, Errorf(ECodeNotFound, "tile %s is beyond the tree (size %d)", path, size)
	}
	if need := (t.N<<TileHeight + int64(t.W)) << (level * TileHeight); need > size {
		return nil, Errorf(ECodeNotFound, "tile %s is beyond the tree (size %d)", path, size)
	}
	full := t.W == 1<<TileHeight
	if t.L >= 0 {
		data, err := sumdb.ReadTileData(t, ns.ChainReader.HashReader(ctx))
		if err != nil {
			return nil, fmt.Errorf("read tile %s: %w", path, err)
		}
		return &Tile{Data: data, Full: full}, nil
	}
	from := uint64(t.N << TileHeight)
	hs, err := ns.ChainReader.ReceiptHashes(ctx, from, t.W)
	if err != nil {
		return nil, fmt.Errorf("read entries %s: %w", path, err)
	}
	if len(hs) != t.W {
		return nil, fmt.Errorf("read entries %s: %d of %d receipts", path, len(hs), t.W)
	}
	data := make([]byte, 0, t.W*34)
	for _, h := range hs {
		data = binary.BigEndian.AppendUint16(data, 32)
		data = append(data, h[:]...)
	}
	return &Tile{Data: data, Full: full}, nil
}

// StoreCheckpoint stores a signed checkpoint durably (through the
// namespace's queue, in a batch) before anyone may serve it. A size that
// is not larger than every stored one is refused (ErrStaleCheckpoint:
// another replica stored it first); the caller checks consistency before
// signing.
func (ns *Namespace) StoreCheckpoint(ctx context.Context, c *tlog.Signed) error {
	var stale error
	err := ns.submit(ctx, "", func(ctx context.Context, t *batchTx) error {
		stale = nil
		// Refusals are *Error values, decided before any write, so that they
		// never fail the other operations of the batch.
		if head := t.Head(); uint64(c.Size) > head.Seq {
			return Errorf(ECodeInternal, "store checkpoint: size %d is beyond the chain (%d)", c.Size, head.Seq)
		}
		err := t.PutCheckpoint(ctx, c)
		if errors.Is(err, ErrStaleCheckpoint) {
			stale = err
			return Errorf(ECodeInternal, "store checkpoint: %v", err)
		}
		return err
	})
	if stale != nil {
		return stale
	}
	return err
}

var _ tlog.Store = (*Namespace)(nil)
