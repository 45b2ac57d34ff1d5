package ledger

import (
	"context"

	"github.com/effect-ledger/effect-ledger/tlog"
)

// The ports of SPEC §16's pruning. A prune keeps, of each pruned receipt,
// its chain hash, packed 256 to a kept tile (tlog.KeptTile) with the tree
// hashes of level 8 and above that the tile's last leaf completed; the
// domain recomputes the tree hashes of levels 0–7 from them (kepttree.go),
// since a driver never hashes. Bodies go in batches (DeletePruned) after
// the prune receipt is committed: until a batch has deleted them, bodies
// in (Kept, Through] are still stored, and every read path of the domain
// treats them as pruned.

// PruneMark is a namespace's pruned prefix.
type PruneMark struct {
	// Through is P: the receipts ≤ it are pruned.
	Through uint64
	// Kept is K ≤ P: the bodies ≤ it are deleted, their hashes kept.
	Kept uint64
	// Seq is the latest prune receipt, Segment its segment's name.
	Seq     uint64
	Segment string
}

// Prune is one prune receipt as its row records it.
type Prune struct {
	Seq, From, Through uint64
	Digest, Segment    string
	// DeletedThrough is the deletion's progress: the bodies ≤ it are gone.
	DeletedThrough uint64
	// Kept are the key receipts (SPEC §9.2) of the range, whose bodies are
	// kept beside the chain (PutPrune only).
	Kept []KeptBody
}

// KeptBody is the body of a pruned key receipt, its JSON form (SPEC §2).
type KeptBody struct {
	Seq  uint64
	Body string
}

// DeleteBatch is one batch of a prune's deletion: the bodies of receipts
// From … To (whole tiles where possible), and the MACs of the keys they
// name (PrunedKeyMAC), which keep answering 410 once the bodies are gone.
type DeleteBatch struct {
	Prune    uint64 // the prune receipt whose range holds From … To
	From, To uint64
	KeyMACs  []uint64
	// Thin are the sizes of stored checkpoints, none above To, that the
	// batch deletes (the last batch of a prune: one per hour is kept).
	Thin []int64
}

// PruneReader reads a namespace's pruned prefix.
type PruneReader interface {
	// Pruned reads the pruned prefix (zero: nothing pruned).
	Pruned(ctx context.Context) (PruneMark, error)
	// Prunes lists the prune rows in seq order.
	Prunes(ctx context.Context) ([]Prune, error)
	// KeptTiles reads kept tiles by number; a tile nothing kept is absent.
	KeptTiles(ctx context.Context, tiles []int64) ([]tlog.KeptTile, error)
	// KeptReceipts lists the kept bodies of pruned key receipts.
	KeptReceipts(ctx context.Context) ([]KeptBody, error)
	// WasPruned returns the prune that deleted the last receipt of the key
	// whose MAC is mac, or 0.
	WasPruned(ctx context.Context, mac uint64) (uint64, error)
	// KeysIn lists the distinct keys of the stored receipts from … to.
	KeysIn(ctx context.Context, from, to uint64) ([]string, error)
	// CheckpointTimes lists the sizes and signing times of the stored
	// checkpoints of size at most n, by size.
	CheckpointTimes(ctx context.Context, n int64) ([]tlog.Signed, error)
}
