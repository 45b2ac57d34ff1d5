package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/effect-ledger/effect-ledger/chain"
	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// The pruned prefix of SPEC §16 (schema_prune.go): its mark, read with the
// head; the prune rows a Write records; the readers of kept tiles, kept
// key receipts and pruned keys. The deletion itself is prunedelete.go.

// pruneSchema is the first schema version with the tables of §16; a
// read-only store on an older one reads nothing pruned.
const pruneSchema = 5

// keptTileBytes is the size of a full kept tile.
const keptTileBytes = tlog.KeptLeaves * len(chain.Hash{})

// sqlPruneMark reads a namespace's pruned prefix from the prunes row of
// n.ns (columns: namespace, seq, through, segment, kept): P is the latest
// row's through (a row starts after the one before it), K the
// deleted_through of the first row whose deletion is unfinished, else of
// the latest row. A row made while an earlier one's deletion was unfinished
// says deleted_through = from_seq - 1 = the earlier through, which is not
// yet deleted: K is the contiguous deleted prefix, not max(deleted_through).
const sqlPruneMarkFrom = ` AS n(ns), LATERAL (
		SELECT seq, through, segment, deleted_through FROM prunes WHERE namespace = n.ns ORDER BY seq DESC LIMIT 1) AS p,
		LATERAL (SELECT coalesce((SELECT u.deleted_through FROM prunes AS u
			WHERE u.namespace = n.ns AND u.deleted_through < u.through ORDER BY u.seq LIMIT 1), p.deleted_through) AS kept) AS k`

const (
	// sqlBeginPruned reads the marks of a Write's namespaces. It is a
	// statement of its own after sqlBeginHeads, which it follows in the
	// same round trip: a head statement that waited for a lock reads the
	// other tables in the snapshot it started with, and would miss the
	// prune that the write it waited for committed.
	sqlBeginPruned = `SELECT n.ns, p.seq, p.through, p.segment, k.kept FROM unnest($1::text[])` + sqlPruneMarkFrom

	sqlChainPruned = `SELECT n.ns, p.seq, p.through, p.segment, k.kept FROM (VALUES ($1::text))` + sqlPruneMarkFrom

	sqlInsertPrune = `INSERT INTO prunes (namespace, seq, from_seq, through, digest, segment, deleted_through)
		VALUES ($1, $2, $3::bigint, $4, $5, $6, $3::bigint - 1)`

	sqlInsertKeptReceipts = `INSERT INTO kept_receipts (namespace, seq, body)
		SELECT $1, unnest($2::bigint[]), unnest($3::text[])`

	sqlListPrunes = `SELECT seq, from_seq, through, digest, segment, deleted_through FROM prunes
		WHERE namespace = $1 ORDER BY seq`

	// One index lookup per tile (see sqlPreloadGroupKeys on "= ANY").
	sqlKeptTiles = `SELECT k.* FROM unnest($2::bigint[]) AS u(tile), LATERAL (
		SELECT tile, hashes FROM kept_tiles WHERE namespace = $1 AND tile = u.tile LIMIT 1) AS k`

	sqlKeptReceipts = `SELECT seq, body FROM kept_receipts WHERE namespace = $1 ORDER BY seq`

	sqlWasPruned = `SELECT prune_seq FROM pruned_keys WHERE namespace = $1 AND h = $2`

	sqlCheckpointTimes = `SELECT size, signed_at FROM checkpoints WHERE namespace = $1 AND size <= $2 ORDER BY size`

	sqlKeysIn = `SELECT DISTINCT idempotency_key FROM receipts
		WHERE namespace = $1 AND seq BETWEEN $2 AND $3 AND idempotency_key != '' ORDER BY idempotency_key`
)

// scanPruneMark reads a row of sqlPruneMarkFrom's columns into marks by
// namespace.
func scanPruneMarks(rows pgx.Rows, fn func(ns string, m ledger.PruneMark)) error {
	defer rows.Close()
	for rows.Next() {
		var ns, segment string
		var seq, through, kept int64
		if err := rows.Scan(&ns, &seq, &through, &segment, &kept); err != nil {
			return err
		}
		fn(ns, ledger.PruneMark{Through: uint64(through), Kept: uint64(kept), Seq: uint64(seq), Segment: segment})
	}
	return rows.Err()
}

// readPruned reads begin's sqlBeginPruned into ts (names[i] is ts[i]'s
// namespace); a namespace without a prune has no row.
func readPruned(br pgx.BatchResults, ts []*tx, names []string) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	byNS := make(map[string]*tx, len(ts))
	for i, t := range ts {
		byNS[names[i]] = t
	}
	return scanPruneMarks(rows, func(ns string, m ledger.PruneMark) {
		if t := byNS[ns]; t != nil {
			t.pruned = m
		}
	})
}

// PutPrune buffers the row of the prune receipt p.Seq, appended by this
// transaction, and the bodies of the key receipts of its range; write
// sends them after the receipts. The prunes guard checks, when they are
// inserted, that the range starts after the last prune and that p.Seq is a
// prune receipt.
func (t *tx) PutPrune(_ context.Context, p *ledger.Prune) error {
	i, ok := t.bySeq[p.Seq]
	if !ok || t.receipts[i].Kind != chain.KindPrune {
		return fmt.Errorf("record prune %d: not a prune receipt appended by this batch", p.Seq)
	}
	if p.From < 1 || p.Through < p.From || p.Through >= p.Seq {
		return fmt.Errorf("record prune %d: range %d…%d", p.Seq, p.From, p.Through)
	}
	if p.From != t.pruned.Through+1 {
		return fmt.Errorf("record prune %d: it starts at %d, the pruned prefix ends at %d", p.Seq, p.From, t.pruned.Through)
	}
	for _, s := range []string{p.Digest, p.Segment} {
		if strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) {
			return fmt.Errorf("record prune %d: digest and segment must be UTF-8 text without a NUL character", p.Seq)
		}
	}
	c := *p
	c.Kept = append([]ledger.KeptBody(nil), p.Kept...)
	for _, k := range c.Kept {
		if k.Seq < p.From || k.Seq > p.Through {
			return fmt.Errorf("record prune %d: kept receipt %d is outside its range", p.Seq, k.Seq)
		}
		if strings.IndexByte(k.Body, 0) >= 0 || !utf8.ValidString(k.Body) {
			return fmt.Errorf("record prune %d: kept receipt %d: not UTF-8 text without a NUL character", p.Seq, k.Seq)
		}
	}
	c.DeletedThrough = p.From - 1
	t.prunes = append(t.prunes, c)
	t.pruned.Through, t.pruned.Seq, t.pruned.Segment = p.Through, p.Seq, p.Segment
	return nil
}

// queuePrunes adds the prune rows and kept bodies of t to b.
func queuePrunes(b *pgx.Batch, ns string, t *tx) {
	for i := range t.prunes {
		p := &t.prunes[i]
		b.Queue(sqlInsertPrune, ns, int64(p.Seq), int64(p.From), int64(p.Through), p.Digest, p.Segment)
		if len(p.Kept) == 0 {
			continue
		}
		seqs, bodies := make([]int64, len(p.Kept)), make([]string, len(p.Kept))
		for j, k := range p.Kept {
			seqs[j], bodies[j] = int64(k.Seq), k.Body
		}
		b.Queue(sqlInsertKeptReceipts, ns, seqs, bodies)
	}
}

// KeptTiles reads kept tiles on the transaction's connection.
func (t *tx) KeptTiles(ctx context.Context, tiles []int64) ([]tlog.KeptTile, error) {
	out, err := readKeptTiles(ctx, t.conn, t.c.s.version, t.c.ns, tiles)
	if err != nil {
		return nil, t.dbFail("read kept tiles", err)
	}
	return out, nil
}

// batcher is a pool, a connection or a transaction.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// readKeptTiles reads the kept tiles of ns by number, in the order asked
// (a tile nothing kept is left out), and the stored hashes of level 8 and
// above that each full one's last leaf completed (tlog.KeptUpperIndexes),
// which stay in tree_hashes, in one round trip.
func readKeptTiles(ctx context.Context, q batcher, version int, ns string, tiles []int64) ([]tlog.KeptTile, error) {
	if version < pruneSchema || len(tiles) == 0 {
		return nil, nil
	}
	var upper []int64
	for _, n := range tiles {
		upper = append(upper, tlog.KeptUpperIndexes(n)...)
	}
	var b pgx.Batch
	b.Queue(sqlKeptTiles, ns, tiles)
	b.Queue(sqlTreeHashes, ns, upper)
	br := q.SendBatch(ctx, &b)
	defer func() { _ = br.Close() }()
	got := make(map[int64][]byte, len(tiles))
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var n int64
		var hs []byte
		if err := rows.Scan(&n, &hs); err != nil {
			rows.Close()
			return nil, err
		}
		got[n] = hs
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	stored := make(map[int64]tlog.Hash, len(upper))
	if rows, err = br.Query(); err != nil {
		return nil, err
	}
	for rows.Next() {
		var x int64
		var h []byte
		if err := rows.Scan(&x, &h); err != nil {
			rows.Close()
			return nil, err
		}
		if len(h) == len(tlog.Hash{}) {
			stored[x] = tlog.Hash(h)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	out := make([]tlog.KeptTile, 0, len(tiles))
	for _, n := range tiles {
		hs, ok := got[n]
		if !ok {
			continue
		}
		kt := tlog.KeptTile{Tile: n, Hashes: make([]chain.Hash, len(hs)/len(chain.Hash{}))}
		for i := range kt.Hashes {
			kt.Hashes[i] = chain.Hash(hs[i*len(chain.Hash{}) : (i+1)*len(chain.Hash{})])
		}
		if len(hs) == keptTileBytes {
			for _, x := range tlog.KeptUpperIndexes(n) {
				h, ok := stored[x]
				if !ok {
					return nil, fmt.Errorf("kept tile %d: tree hash %d is not stored", n, x)
				}
				kt.Upper = append(kt.Upper, h)
			}
		}
		out = append(out, kt)
	}
	return out, nil
}

// keptHashes returns the kept chain hashes of receipts from+1 … to, all
// of which must be kept.
func keptHashes(ctx context.Context, q batcher, version int, ns string, from, to uint64) ([]chain.Hash, error) {
	if to <= from {
		return nil, nil
	}
	var tiles []int64
	for n := int64(from / tlog.KeptLeaves); n <= int64((to-1)/tlog.KeptLeaves); n++ {
		tiles = append(tiles, n)
	}
	kts, err := readKeptTiles(ctx, q, version, ns, tiles)
	if err != nil {
		return nil, err
	}
	byTile := make(map[int64]*tlog.KeptTile, len(kts))
	for i := range kts {
		byTile[kts[i].Tile] = &kts[i]
	}
	out := make([]chain.Hash, 0, to-from)
	for seq := from + 1; seq <= to; seq++ {
		kt := byTile[int64((seq-1)/tlog.KeptLeaves)]
		i := int((seq - 1) % tlog.KeptLeaves)
		if kt == nil || i >= len(kt.Hashes) {
			return nil, fmt.Errorf("receipt %d is neither stored nor kept", seq)
		}
		out = append(out, kt.Hashes[i])
	}
	return out, nil
}

// Pruned reads the namespace's pruned prefix (zero: nothing pruned).
func (c *Chain) Pruned(ctx context.Context) (ledger.PruneMark, error) {
	var m ledger.PruneMark
	if c.s.version < pruneSchema {
		return m, nil
	}
	rows, err := c.s.pool.Query(ctx, sqlChainPruned, c.ns)
	if err != nil {
		return m, fmt.Errorf("read pruned prefix: %w", classify(err))
	}
	if err := scanPruneMarks(rows, func(_ string, got ledger.PruneMark) { m = got }); err != nil {
		return m, fmt.Errorf("read pruned prefix: %w", classify(err))
	}
	return m, nil
}

// Prunes lists the namespace's prune rows in seq order (Kept left empty).
func (c *Chain) Prunes(ctx context.Context) ([]ledger.Prune, error) {
	if c.s.version < pruneSchema {
		return nil, nil
	}
	rows, err := c.s.pool.Query(ctx, sqlListPrunes, c.ns)
	if err != nil {
		return nil, fmt.Errorf("read prunes: %w", classify(err))
	}
	defer rows.Close()
	var out []ledger.Prune
	for rows.Next() {
		var p ledger.Prune
		var seq, from, through, deleted int64
		if err := rows.Scan(&seq, &from, &through, &p.Digest, &p.Segment, &deleted); err != nil {
			return nil, fmt.Errorf("read prunes: %w", classify(err))
		}
		p.Seq, p.From, p.Through, p.DeletedThrough = uint64(seq), uint64(from), uint64(through), uint64(deleted)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read prunes: %w", classify(err))
	}
	return out, nil
}

// KeptTiles reads kept tiles by number; a tile nothing kept is absent.
func (c *Chain) KeptTiles(ctx context.Context, tiles []int64) ([]tlog.KeptTile, error) {
	out, err := readKeptTiles(ctx, c.s.pool, c.s.version, c.ns, tiles)
	if err != nil {
		return nil, fmt.Errorf("read kept tiles: %w", classify(err))
	}
	return out, nil
}

// KeptReceipts lists the kept bodies of pruned key receipts, by seq.
func (c *Chain) KeptReceipts(ctx context.Context) ([]ledger.KeptBody, error) {
	if c.s.version < pruneSchema {
		return nil, nil
	}
	rows, err := c.s.pool.Query(ctx, sqlKeptReceipts, c.ns)
	if err != nil {
		return nil, fmt.Errorf("read kept receipts: %w", classify(err))
	}
	defer rows.Close()
	var out []ledger.KeptBody
	for rows.Next() {
		var k ledger.KeptBody
		var seq int64
		if err := rows.Scan(&seq, &k.Body); err != nil {
			return nil, fmt.Errorf("read kept receipts: %w", classify(err))
		}
		k.Seq = uint64(seq)
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read kept receipts: %w", classify(err))
	}
	return out, nil
}

// WasPruned returns the prune that deleted the last receipt of the key
// whose MAC is mac, or 0.
func (c *Chain) WasPruned(ctx context.Context, mac uint64) (uint64, error) {
	if c.s.version < pruneSchema {
		return 0, nil
	}
	var seq int64
	err := c.s.pool.QueryRow(ctx, sqlWasPruned, c.ns, int64(mac)).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read pruned key: %w", classify(err))
	}
	return uint64(seq), nil
}

// KeysIn lists the distinct keys of the stored receipts from … to, in
// byte order; keyless receipts name none.
func (c *Chain) KeysIn(ctx context.Context, from, to uint64) ([]string, error) {
	rows, err := c.s.pool.Query(ctx, sqlKeysIn, c.ns, int64(from), int64(to))
	if err != nil {
		return nil, fmt.Errorf("read keys of receipts %d…%d: %w", from, to, classify(err))
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read keys of receipts %d…%d: %w", from, to, classify(err))
	}
	return keys, nil
}

// CheckpointTimes lists the sizes and signing times of the stored
// checkpoints of size at most n, by size.
func (c *Chain) CheckpointTimes(ctx context.Context, n int64) ([]tlog.Signed, error) {
	rows, err := c.s.pool.Query(ctx, sqlCheckpointTimes, c.ns, n)
	if err != nil {
		return nil, fmt.Errorf("read checkpoints: %w", classify(err))
	}
	defer rows.Close()
	var out []tlog.Signed
	for rows.Next() {
		var s tlog.Signed
		var at int64
		if err := rows.Scan(&s.Size, &at); err != nil {
			return nil, fmt.Errorf("read checkpoints: %w", classify(err))
		}
		s.SignedAt = uint64(at)
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read checkpoints: %w", classify(err))
	}
	return out, nil
}
