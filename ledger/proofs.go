package ledger

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// TileHeight is the height of the tlog-tiles the ledger serves (C2SP).
const TileHeight = 8

// checkpointed returns the stored checkpoint of size n, or the latest one
// when n is 0; field names the query parameter for errors.
func (rd *Reader) checkpointed(ctx context.Context, n int64, field string) (*tlog.Signed, error) {
	var c *tlog.Signed
	var err error
	if n == 0 {
		c, err = rd.LatestCheckpoint(ctx)
	} else {
		c, err = rd.CheckpointAt(ctx, n)
	}
	if err != nil {
		return nil, err
	}
	if c == nil && n == 0 {
		// SPEC §9: the size defaults to the latest checkpoint's; with none
		// there is no size to prove against.
		return nil, invalid(field, "no checkpoint has been signed yet, so there is no %s to prove against", field)
	}
	if c == nil {
		return nil, invalid(field, "%s %d is not the size of a signed checkpoint", field, n)
	}
	return c, nil
}

// InclusionProof proves receipt seq in the checkpointed tree of size n
// (the latest checkpoint when n is 0). Errors: *Error with
// ECodeUnknownReceipt (seq beyond the tree) or ECodeInvalidRequest (n not
// a checkpointed size ≥ seq, or no checkpoint yet).
func (rd *Reader) InclusionProof(ctx context.Context, seq uint64, n int64) (*tlog.InclusionProof, error) {
	size, err := rd.TreeSize(ctx)
	if err != nil {
		return nil, err
	}
	if seq == 0 {
		return nil, invalid("seq", "seq must be at least 1")
	}
	if seq > uint64(size) {
		return nil, Errorf(ECodeUnknownReceipt, "no receipt with seq %d", seq)
	}
	c, err := rd.checkpointed(ctx, n, "size")
	if err != nil {
		return nil, err
	}
	if uint64(c.Size) < seq {
		return nil, invalid("size", "the checkpointed tree of size %d does not contain receipt %d yet", c.Size, seq)
	}
	idx := tlog.LeafIndex(seq)
	p, err := tlog.ProveInclusion(c.Size, idx, rd.HashReader(ctx))
	if err != nil {
		return nil, err
	}
	return &tlog.InclusionProof{Seq: seq, LeafIndex: idx, TreeSize: c.Size, Root: tlog.HexHash(c.Root), Hashes: tlog.HexHashes(p)}, nil
}

// ConsistencyProof proves that the checkpointed tree of size from (0 is
// the empty tree) is a prefix of the checkpointed tree of size to (the
// latest when 0). Errors: *Error with ECodeInvalidRequest.
func (rd *Reader) ConsistencyProof(ctx context.Context, from, to int64) (*tlog.ConsistencyProof, error) {
	ct, err := rd.checkpointed(ctx, to, "to")
	if err != nil {
		return nil, err
	}
	if from < 0 || from > ct.Size {
		return nil, invalid("from", "from must be from 0 to %d", ct.Size)
	}
	rootFrom := tlog.EmptyRoot
	if from > 0 {
		cf, err := rd.checkpointed(ctx, from, "from")
		if err != nil {
			return nil, err
		}
		rootFrom = cf.Root
	}
	p, err := tlog.ProveConsistency(ct.Size, from, rd.HashReader(ctx))
	if err != nil {
		return nil, err
	}
	return &tlog.ConsistencyProof{From: from, To: ct.Size, RootFrom: tlog.HexHash(rootFrom), RootTo: tlog.HexHash(ct.Root),
		Hashes: tlog.HexHashes(p)}, nil
}

// PortableReceipt returns receipt seq with its inclusion proof against
// the latest checkpoint. Errors: *Error with ECodeUnknownReceipt or
// ECodeNotCheckpointed.
func (rd *Reader) PortableReceipt(ctx context.Context, seq uint64) (*tlog.PortableReceipt, error) {
	r, err := rd.GetReceipt(ctx, seq)
	if err != nil {
		return nil, err
	}
	c, err := rd.CheckpointCovering(ctx, int64(seq))
	if err != nil {
		return nil, err
	}
	return rd.portable(ctx, r, c)
}

// PortableReceiptAt returns receipt seq with its inclusion proof against
// the stored checkpoint of size n (404 not_checkpointed when there is
// none, or it does not cover seq).
func (rd *Reader) PortableReceiptAt(ctx context.Context, seq uint64, n int64) (*tlog.PortableReceipt, error) {
	r, err := rd.GetReceipt(ctx, seq)
	if err != nil {
		return nil, err
	}
	c, err := rd.CheckpointAt(ctx, n)
	if err != nil {
		return nil, err
	}
	if c != nil && c.Size < int64(seq) {
		c = nil
	}
	return rd.portable(ctx, r, c)
}

func (rd *Reader) portable(ctx context.Context, r *chain.Receipt, c *tlog.Signed) (*tlog.PortableReceipt, error) {
	seq := r.Seq
	if c == nil {
		return nil, &Error{Code: ECodeNotCheckpointed, Message: fmt.Sprintf("receipt %d is not covered by a signed checkpoint yet; retry after the next one", seq),
			Details: map[string]any{"seq": seq}}
	}
	idx := tlog.LeafIndex(seq)
	p, err := tlog.ProveInclusion(c.Size, idx, rd.HashReader(ctx))
	if err != nil {
		return nil, err
	}
	return &tlog.PortableReceipt{Receipt: *r, LeafIndex: idx, Inclusion: tlog.HexHashes(p), Checkpoint: c.Note}, nil
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
func (rd *Reader) ReadTile(ctx context.Context, path string) (*Tile, error) {
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
	size, err := rd.TreeSize(ctx)
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
		data, err := sumdb.ReadTileData(t, rd.HashReader(ctx))
		if err != nil {
			return nil, fmt.Errorf("read tile %s: %w", path, err)
		}
		return &Tile{Data: data, Full: full}, nil
	}
	from := uint64(t.N << TileHeight)
	rows, err := rd.r.QueryContext(ctx, sqlReceiptHashes, from, t.W)
	if err != nil {
		return nil, fmt.Errorf("read entries %s: %w", path, classify(err))
	}
	defer func() { _ = rows.Close() }()
	data := make([]byte, 0, t.W*34)
	next := from + 1
	for rows.Next() {
		var seq uint64
		var h hashBytes
		if err := rows.Scan(&seq, &h); err != nil {
			return nil, fmt.Errorf("read entries %s: %w", path, err)
		}
		if seq != next {
			return nil, fmt.Errorf("read entries %s: receipt %d follows %d", path, seq, next-1)
		}
		next++
		data = binary.BigEndian.AppendUint16(data, 32)
		data = append(data, h[:]...)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read entries %s: %w", path, classify(err))
	}
	if next-from-1 != uint64(t.W) {
		return nil, fmt.Errorf("read entries %s: %d of %d receipts", path, next-from-1, t.W)
	}
	return &Tile{Data: data, Full: full}, nil
}

// hashBytes scans a 32-byte BLOB.
type hashBytes [32]byte

func (h *hashBytes) Scan(v any) error {
	b, ok := v.([]byte)
	if !ok || len(b) != len(h) {
		return fmt.Errorf("hash is not 32 bytes")
	}
	copy(h[:], b)
	return nil
}
