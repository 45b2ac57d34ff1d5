package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// Pruning (SPEC §16): the prunes rows, the kept hash tiles, the pruned
// keys' MACs and the kept key receipts (schema.sql); the deletion of a
// batch of pruned bodies. The domain decides and hashes; this file copies
// hashes and deletes rows.

const (
	// Kept is the deleted prefix: the progress of the first prune not
	// finished (a later one's row starts after bodies still stored), else
	// of the latest.
	sqlPruned = `SELECT seq, segment, (SELECT max(through) FROM ns_prunes WHERE ns = ?1),
		coalesce((SELECT deleted_through FROM ns_prunes WHERE ns = ?1 AND deleted_through < through ORDER BY seq LIMIT 1),
			(SELECT max(deleted_through) FROM ns_prunes WHERE ns = ?1))
		FROM ns_prunes WHERE ns = ?1 ORDER BY seq DESC LIMIT 1`
	sqlPrunes       = `SELECT seq, from_seq, through, digest, segment, deleted_through FROM ns_prunes WHERE ns = ?1 ORDER BY seq`
	sqlInsertPrune  = `INSERT INTO ns_prunes (ns, seq, from_seq, through, digest, segment, deleted_through) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?3 - 1)`
	sqlPruneRow     = `SELECT from_seq, through, deleted_through FROM ns_prunes WHERE ns = ?1 AND seq = ?2`
	sqlPruneMoved   = `UPDATE ns_prunes SET deleted_through = ?3 WHERE ns = ?1 AND seq = ?2`
	sqlKeptTile     = `SELECT hashes, upper FROM ns_kept WHERE ns = ?1 AND tile = ?2`
	sqlPutKeptTile  = `INSERT INTO ns_kept (ns, tile, hashes, upper) VALUES (?1, ?2, ?3, ?4) ON CONFLICT (ns, tile) DO UPDATE SET hashes = excluded.hashes, upper = excluded.upper`
	sqlKeptReceipts = `SELECT seq, body FROM ns_kept_receipts WHERE ns = ?1 ORDER BY seq`
	sqlPutKept      = `INSERT OR REPLACE INTO ns_kept_receipts (ns, seq, body) VALUES (?1, ?2, ?3)`
	sqlWasPruned    = `SELECT prune_seq FROM ns_pruned_keys WHERE ns = ?1 AND h = ?2`
	sqlPutPruned    = `INSERT OR IGNORE INTO ns_pruned_keys (ns, h, prune_seq) VALUES (?1, ?2, ?3)`
	sqlKeysIn       = `SELECT DISTINCT idempotency_key FROM ns_receipts WHERE ns = ?1 AND seq BETWEEN ?2 AND ?3 AND idempotency_key != ''`
	sqlPruneRows    = `SELECT rowid, seq, hash FROM ns_receipts WHERE ns = ?1 AND seq BETWEEN ?2 AND ?3 ORDER BY seq`
	sqlDeleteBodies = `DELETE FROM ns_receipts WHERE ns = ?1 AND seq BETWEEN ?2 AND ?3`
)

// prunedMark is the chain's pruned prefix as of its last COMMIT.
func (c *chainWriter) prunedMark() ledger.PruneMark {
	if m := c.pruned.Load(); m != nil {
		return *m
	}
	return ledger.PruneMark{}
}

// Pruned reads the namespace's pruned prefix.
func (rd *Reader) Pruned(ctx context.Context) (ledger.PruneMark, error) {
	return readPruned(ctx, rd.r, rd.chainRef)
}

func readPruned(ctx context.Context, q queryRower, ref chainRef) (ledger.PruneMark, error) {
	var m ledger.PruneMark
	err := q.QueryRowContext(ctx, sqlPruned, ref.args()...).Scan(&m.Seq, &m.Segment, &m.Through, &m.Kept)
	if errors.Is(err, sql.ErrNoRows) || noSuchTable(err, "ns_prunes") {
		return ledger.PruneMark{}, nil
	}
	if err != nil {
		return m, fmt.Errorf("read pruned prefix: %w", classify(err))
	}
	return m, nil
}

// Prunes lists the prune rows in seq order.
func (rd *Reader) Prunes(ctx context.Context) ([]ledger.Prune, error) {
	rows, err := rd.r.QueryContext(ctx, sqlPrunes, rd.args()...)
	if noSuchTable(err, "ns_prunes") {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read prunes: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var out []ledger.Prune
	for rows.Next() {
		var p ledger.Prune
		if err := rows.Scan(&p.Seq, &p.From, &p.Through, &p.Digest, &p.Segment, &p.DeletedThrough); err != nil {
			return nil, fmt.Errorf("read prunes: %w", classify(err))
		}
		out = append(out, p)
	}
	return out, classify(rows.Err())
}

// KeptTiles reads kept tiles by number.
func (rd *Reader) KeptTiles(ctx context.Context, tiles []int64) ([]tlog.KeptTile, error) {
	return readKeptTiles(ctx, rd.r, rd.chainRef, tiles)
}

// KeptTiles reads kept tiles in the batch's transaction.
func (t *writeTx) KeptTiles(ctx context.Context, tiles []int64) ([]tlog.KeptTile, error) {
	return readKeptTiles(ctx, t.tx, t.ref, tiles)
}

func readKeptTiles(ctx context.Context, q queryRower, ref chainRef, tiles []int64) ([]tlog.KeptTile, error) {
	out := make([]tlog.KeptTile, 0, len(tiles))
	for _, n := range tiles {
		var hashes, upper []byte
		err := q.QueryRowContext(ctx, sqlKeptTile, ref.args(n)...).Scan(&hashes, &upper)
		if errors.Is(err, sql.ErrNoRows) || noSuchTable(err, "ns_kept") {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read kept tile %d: %w", n, classify(err))
		}
		kt, err := keptTile(n, hashes, upper)
		if err != nil {
			return nil, err
		}
		out = append(out, kt)
	}
	return out, nil
}

// keptTile decodes a row of ns_kept.
func keptTile(n int64, hashes, upper []byte) (tlog.KeptTile, error) {
	kt := tlog.KeptTile{Tile: n}
	if len(hashes)%32 != 0 || len(hashes) > tlog.KeptLeaves*32 || len(upper)%32 != 0 {
		return kt, fmt.Errorf("kept tile %d: %d bytes of hashes, %d of upper hashes: %w", n, len(hashes), len(upper), ledger.ErrStorageCorrupt)
	}
	kt.Hashes = make([]chain.Hash, len(hashes)/32)
	for i := range kt.Hashes {
		copy(kt.Hashes[i][:], hashes[i*32:])
	}
	kt.Upper = make([]tlog.Hash, len(upper)/32)
	for i := range kt.Upper {
		copy(kt.Upper[i][:], upper[i*32:])
	}
	return kt, nil
}

// KeptReceipts lists the kept bodies of pruned key receipts.
func (rd *Reader) KeptReceipts(ctx context.Context) ([]ledger.KeptBody, error) {
	rows, err := rd.r.QueryContext(ctx, sqlKeptReceipts, rd.args()...)
	if noSuchTable(err, "ns_kept_receipts") {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read kept receipts: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var out []ledger.KeptBody
	for rows.Next() {
		var b ledger.KeptBody
		if err := rows.Scan(&b.Seq, &b.Body); err != nil {
			return nil, fmt.Errorf("read kept receipts: %w", classify(err))
		}
		out = append(out, b)
	}
	return out, classify(rows.Err())
}

// WasPruned returns the prune that deleted the key whose MAC is mac, or 0.
func (rd *Reader) WasPruned(ctx context.Context, mac uint64) (uint64, error) {
	var seq uint64
	err := rd.r.QueryRowContext(ctx, sqlWasPruned, rd.args(int64(mac))...).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) || noSuchTable(err, "ns_pruned_keys") {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read pruned keys: %w", classify(err))
	}
	return seq, nil
}

// KeysIn lists the distinct keys of the stored receipts from … to.
func (rd *Reader) KeysIn(ctx context.Context, from, to uint64) ([]string, error) {
	rows, err := rd.r.QueryContext(ctx, sqlKeysIn, rd.args(from, to)...)
	if err != nil {
		return nil, fmt.Errorf("read keys: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var out []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, fmt.Errorf("read keys: %w", classify(err))
		}
		out = append(out, k)
	}
	return out, classify(rows.Err())
}

// PutPrune records a prune receipt just appended, and the bodies of the
// key receipts it prunes.
func (t *writeTx) PutPrune(ctx context.Context, p *ledger.Prune) error {
	if _, err := t.tx.ExecContext(ctx, sqlInsertPrune, t.ref.args(p.Seq, p.From, p.Through, p.Digest, p.Segment)...); err != nil {
		return fmt.Errorf("record prune %d: %w", p.Seq, classify(err))
	}
	for _, b := range p.Kept {
		if _, err := t.tx.ExecContext(ctx, sqlPutKept, t.ref.args(b.Seq, b.Body)...); err != nil {
			return fmt.Errorf("keep key receipt %d: %w", b.Seq, classify(err))
		}
	}
	t.pruned = ledger.PruneMark{Through: max(t.pruned.Through, p.Through), Kept: t.pruned.Kept, Seq: p.Seq, Segment: p.Segment}
	return nil
}

// DeletePruned deletes a batch of pruned bodies in one write transaction
// on the writer connection, between batches (SPEC §16). The key index
// loses the batch's postings first, durably: its watermark never falls
// below the bodies kept, so an open never replays from a deleted receipt,
// and postings of receipts still in the file but pruned are never read
// (every read starts after the pruned prefix).
func (s *Store) DeletePruned(ctx context.Context, ns string, b ledger.DeleteBatch) error {
	if s.readOnly {
		return ledger.ErrOpenedReadOnly
	}
	c, release, err := s.writer(ctx, ns)
	if err != nil {
		return err
	}
	defer release()
	// Off the writer's lock: the postings of pruned receipts are never
	// read, so they may go first (and must, before the bodies).
	keys, through, err := c.pruneIndex(ctx, c.r, b)
	if err != nil {
		return err
	}
	m := s.main
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || c.closed {
		return ledger.ErrClosed
	}
	tx, err := m.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("delete pruned: %w", classify(err))
	}
	defer func() { _ = tx.Rollback() }()
	if err := deleteBatch(ctx, tx, c.chainRef, b); err != nil {
		return fmt.Errorf("delete pruned %d…%d of %s: %w", b.From, b.To, ns, err)
	}
	if err := m.commit(tx); err != nil {
		return err
	}
	mark := c.prunedMark()
	mark.Kept = max(mark.Kept, b.To)
	c.pruned.Store(&mark)
	c.cache.drop(c.id) // records and receipts of pruned keys
	// The records of keys pruned whole go once their MACs are committed
	// (a read between finds the record, of a pruned generation: 410; one
	// left by a failure here is of a pruned generation too).
	if err := c.idx.ForgetKeys(c.ns, keys, through); err != nil {
		return fmt.Errorf("delete pruned: %w: %w", ledger.ErrIO, err)
	}
	return nil
}

// pruneIndex deletes the key index's postings of b's receipts; it
// returns their keys and the prune's last seq.
func (c *chainWriter) pruneIndex(ctx context.Context, r *sql.DB, b ledger.DeleteBatch) ([]string, uint64, error) {
	var from, through, done uint64
	if err := r.QueryRowContext(ctx, sqlPruneRow, c.args(b.Prune)...).Scan(&from, &through, &done); err != nil {
		return nil, 0, fmt.Errorf("delete pruned: prune %d: %w", b.Prune, classify(err))
	}
	rows, err := r.QueryContext(ctx, `SELECT seq, kind, idempotency_key, execution_id, tool FROM ns_receipts
		WHERE ns = ?1 AND seq BETWEEN ?2 AND ?3 ORDER BY seq`, c.args(b.From, b.To)...)
	if err != nil {
		return nil, 0, fmt.Errorf("delete pruned: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var rs []chain.Receipt
	var keys []string
	seen := map[string]bool{}
	for rows.Next() {
		var r chain.Receipt
		if err := rows.Scan(&r.Seq, &r.Kind, &r.IdempotencyKey, &r.ExecutionID, &r.Tool); err != nil {
			return nil, 0, fmt.Errorf("delete pruned: %w", classify(err))
		}
		rs = append(rs, r)
		if r.IdempotencyKey != "" && !seen[r.IdempotencyKey] {
			seen[r.IdempotencyKey] = true
			keys = append(keys, r.IdempotencyKey)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("delete pruned: %w", classify(err))
	}
	if err := c.idx.PrunePostings(c.ns, rs); err != nil {
		return nil, 0, fmt.Errorf("delete pruned: %w: %w", ledger.ErrIO, err)
	}
	return keys, through, nil
}

// deleteBatch copies the chain hashes of b's receipts into kept tiles
// (with the upper tree hashes of each tile they complete), keeps the keys'
// MACs, deletes the receipts (the trigger checks each one's kept hash)
// and the rows derived from them, and records the progress.
func deleteBatch(ctx context.Context, tx *sql.Tx, ref chainRef, b ledger.DeleteBatch) error {
	var from, through, done uint64
	err := tx.QueryRowContext(ctx, sqlPruneRow, ref.args(b.Prune)...).Scan(&from, &through, &done)
	if err != nil {
		return fmt.Errorf("prune %d: %w", b.Prune, classify(err))
	}
	if b.From != done+1 || b.To < b.From || b.To > through {
		return fmt.Errorf("prune %d has deleted through %d of %d…%d: %w", b.Prune, done, from, through, ledger.ErrStorageCorrupt)
	}
	var earlier bool
	if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM ns_prunes WHERE ns = ?1 AND seq < ?2 AND deleted_through < through)`,
		ref.args(b.Prune)...).Scan(&earlier); err != nil {
		return classify(err)
	}
	if earlier {
		return fmt.Errorf("prune %d: an earlier prune's deletion is not finished: %w", b.Prune, ledger.ErrStorageCorrupt)
	}
	rids, err := keepHashes(ctx, tx, ref, b.From, b.To)
	if err != nil {
		return err
	}
	for _, h := range b.KeyMACs {
		if _, err := tx.ExecContext(ctx, sqlPutPruned, ref.args(int64(h), b.Prune)...); err != nil {
			return fmt.Errorf("keep pruned keys: %w", classify(err))
		}
	}
	list, err := json.Marshal(rids)
	if err != nil {
		return err
	}
	thin, err := json.Marshal(append([]int64{}, b.Thin...))
	if err != nil {
		return err
	}
	for _, st := range []struct {
		q    string
		args []any
	}{
		{sqlDeleteBodies, ref.args(b.From, b.To)},
		{`DELETE FROM ns_tree WHERE rid IN (SELECT value FROM json_each(?1))`, []any{string(list)}},
		{`DELETE FROM ns_payloads WHERE rid IN (SELECT value FROM json_each(?1))`, []any{string(list)}},
		{`DELETE FROM ns_tokens WHERE rid IN (SELECT value FROM json_each(?1))`, []any{string(list)}},
		{`DELETE FROM ns_approval_inputs WHERE ns = ?1 AND ask_seq BETWEEN ?2 AND ?3`, ref.args(b.From, b.To)},
		{`DELETE FROM ns_reconciled_tokens WHERE ns = ?1 AND reserve_seq BETWEEN ?2 AND ?3`, ref.args(b.From, b.To)},
		{`DELETE FROM ns_checkpoints WHERE ns = ?1 AND size IN (SELECT value FROM json_each(?2)) AND size <= ?3`, ref.args(string(thin), b.To)},
		{sqlPruneMoved, ref.args(b.Prune, b.To)},
	} {
		if _, err := tx.ExecContext(ctx, st.q, st.args...); err != nil {
			return classify(err)
		}
	}
	return nil
}

// keepHashes copies the hashes of receipts from … to into their tiles
// and returns the receipts' rowids.
func keepHashes(ctx context.Context, tx *sql.Tx, ref chainRef, from, to uint64) ([]int64, error) {
	rows, err := tx.QueryContext(ctx, sqlPruneRows, ref.args(from, to)...)
	if err != nil {
		return nil, classify(err)
	}
	defer func() { _ = rows.Close() }()
	var rids []int64
	tiles := map[int64][]byte{}
	next := from
	for rows.Next() {
		var rid int64
		var seq uint64
		var h []byte
		if err := rows.Scan(&rid, &seq, &h); err != nil {
			return nil, classify(err)
		}
		if seq != next || len(h) != 32 {
			return nil, fmt.Errorf("receipt %d is missing: %w", next, ledger.ErrStorageCorrupt)
		}
		tile := int64(seq-1) / tlog.KeptLeaves
		tiles[tile] = append(tiles[tile], h...)
		rids = append(rids, rid)
		next++
	}
	if err := rows.Err(); err != nil {
		return nil, classify(err)
	}
	if next != to+1 {
		return nil, fmt.Errorf("receipt %d is missing: %w", next, ledger.ErrStorageCorrupt)
	}
	for tile, hs := range tiles {
		var old, upper []byte
		err := tx.QueryRowContext(ctx, sqlKeptTile, ref.args(tile)...).Scan(&old, &upper)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return nil, classify(err)
		}
		if first := max(int64(from-1), tile*tlog.KeptLeaves); int64(len(old)/32) != first-tile*tlog.KeptLeaves {
			return nil, fmt.Errorf("kept tile %d holds %d hashes, the batch starts at leaf %d: %w", tile, len(old)/32, first, ledger.ErrStorageCorrupt)
		}
		hashes := append(old, hs...)
		if len(hashes) == tlog.KeptLeaves*32 {
			// The tile is full: keep what its last leaf's tree row holds
			// above level 7 before the row goes.
			var row []byte
			last := uint64(tile+1) * tlog.KeptLeaves
			if err := tx.QueryRowContext(ctx, sqlTreeHash, ref.args(last)...).Scan(&row); err != nil {
				return nil, fmt.Errorf("tree row of receipt %d: %w", last, classify(err))
			}
			if len(row) < 8*32 {
				return nil, fmt.Errorf("tree row of receipt %d has %d bytes: %w", last, len(row), ledger.ErrStorageCorrupt)
			}
			upper = row[8*32:]
		}
		if upper == nil {
			upper = []byte{}
		}
		if _, err := tx.ExecContext(ctx, sqlPutKeptTile, ref.args(tile, hashes, upper)...); err != nil {
			return nil, fmt.Errorf("keep tile %d: %w", tile, classify(err))
		}
	}
	return rids, nil
}

// The pruned prefix of a namespace behind the open-namespaces bound, read
// from the file.

func (f *lazyChain) Pruned(ctx context.Context) (ledger.PruneMark, error) { return f.rd.Pruned(ctx) }
func (f *lazyChain) Prunes(ctx context.Context) ([]ledger.Prune, error)   { return f.rd.Prunes(ctx) }
func (f *lazyChain) KeptTiles(ctx context.Context, tiles []int64) ([]tlog.KeptTile, error) {
	return f.rd.KeptTiles(ctx, tiles)
}
func (f *lazyChain) KeptReceipts(ctx context.Context) ([]ledger.KeptBody, error) {
	return f.rd.KeptReceipts(ctx)
}
func (f *lazyChain) WasPruned(ctx context.Context, mac uint64) (uint64, error) {
	return f.rd.WasPruned(ctx, mac)
}
func (f *lazyChain) KeysIn(ctx context.Context, from, to uint64) ([]string, error) {
	return f.rd.KeysIn(ctx, from, to)
}

// CheckpointTimes lists the sizes and signing times of the stored
// checkpoints of size at most n.
func (rd *Reader) CheckpointTimes(ctx context.Context, n int64) ([]tlog.Signed, error) {
	rows, err := rd.r.QueryContext(ctx, `SELECT size, signed_at FROM ns_checkpoints WHERE ns = ?1 AND size <= ?2 ORDER BY size`, rd.args(n)...)
	if err != nil {
		return nil, fmt.Errorf("read checkpoints: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var out []tlog.Signed
	for rows.Next() {
		var c tlog.Signed
		if err := rows.Scan(&c.Size, &c.SignedAt); err != nil {
			return nil, fmt.Errorf("read checkpoints: %w", classify(err))
		}
		out = append(out, c)
	}
	return out, classify(rows.Err())
}

func (f *lazyChain) CheckpointTimes(ctx context.Context, n int64) ([]tlog.Signed, error) {
	return f.rd.CheckpointTimes(ctx, n)
}
