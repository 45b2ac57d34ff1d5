package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	sumdb "golang.org/x/mod/sumdb/tlog"

	"github.com/effect-ledger/effect-ledger/ledger"
	"github.com/effect-ledger/effect-ledger/tlog"
)

// The deletion of a prune's bodies (SPEC §16; docs/design/pruning.md
// 2.5), one batch a transaction. It never takes a head row: appends go
// on while it runs, and the rows a writer holds (a key reserved again,
// an asked input being purged) are skipped rather than waited for.

// keptLevels is how many levels of the tree over a deleted leaf go with
// it: the domain recomputes levels 0–7 from the kept tiles; level 8 and
// above stay in tree_hashes.
const keptLevels = 8

const (
	// $1 namespace, $2 prune seq; the row is locked, so that two
	// deletions of one prune take turns.
	sqlDeletePruneRow = `SELECT through, deleted_through FROM prunes WHERE namespace = $1 AND seq = $2 FOR UPDATE`

	sqlDeleteEarlierUnfinished = `SELECT coalesce(min(seq), 0) FROM prunes
		WHERE namespace = $1 AND seq < $2 AND deleted_through < through`

	// $2 the first tile of the batch: its kept part (partial) grows.
	sqlDeleteKeptLength = `SELECT coalesce((SELECT octet_length(hashes) FROM kept_tiles WHERE namespace = $1 AND tile = $2), 0)`

	sqlDeleteRange = `SELECT count(*), coalesce(array_agg(DISTINCT idempotency_key) FILTER (WHERE idempotency_key != ''), '{}')
		FROM receipts WHERE namespace = $1 AND seq BETWEEN $2 AND $3`

	// The hashes are copied from the rows, in seq order, never computed.
	// Only the batch's first tile may exist, holding exactly the leaves
	// before $2 (checked before, and by the count of rows this writes).
	sqlKeepHashes = `INSERT INTO kept_tiles (namespace, tile, hashes)
		SELECT $1, (seq - 1) / 256, string_agg(hash, ''::bytea ORDER BY seq) FROM receipts
		WHERE namespace = $1 AND seq BETWEEN $2 AND $3 GROUP BY (seq - 1) / 256
		ON CONFLICT (namespace, tile) DO UPDATE SET hashes = kept_tiles.hashes || EXCLUDED.hashes
		WHERE kept_tiles.tile = ($2 - 1) / 256 AND octet_length(kept_tiles.hashes) = (($2 - 1) % 256) * 32`

	sqlKeepPrunedKeys = `INSERT INTO pruned_keys (namespace, h, prune_seq) SELECT $1, unnest($2::bigint[]), $3
		ON CONFLICT DO NOTHING`

	sqlDeleteReceipts = `DELETE FROM receipts WHERE namespace = $1 AND seq BETWEEN $2 AND $3`

	sqlDeletePayloads = `DELETE FROM payloads WHERE namespace = $1 AND seq BETWEEN $2 AND $3`

	sqlDeleteAskInputs = `DELETE FROM approval_inputs WHERE namespace = $1 AND ask_seq IN (
		SELECT ask_seq FROM approval_inputs WHERE namespace = $1 AND ask_seq BETWEEN $2 AND $3 FOR UPDATE SKIP LOCKED)`

	sqlDeleteReconciled = `DELETE FROM reconciled_tokens AS r USING unnest($2::text[]) AS u(key)
		WHERE r.namespace = $1 AND r.idempotency_key = u.key AND r.reserve_seq BETWEEN $3 AND $4`

	sqlDeleteTreeHashes = `DELETE FROM tree_hashes AS t USING unnest($2::bigint[]) AS u(idx)
		WHERE t.namespace = $1 AND t.idx = u.idx`

	// The records of the range's keys whose generation the prune covers
	// ($3 its through); a record a writer holds is left for later.
	sqlDeletePrunedKeys = `DELETE FROM keys WHERE namespace = $1 AND idempotency_key IN (
		SELECT k.idempotency_key FROM unnest($2::text[]) AS u(key), LATERAL (
			SELECT idempotency_key FROM keys WHERE namespace = $1 AND idempotency_key = u.key AND first_seq <= $3
			LIMIT 1 FOR UPDATE SKIP LOCKED) AS k)`

	// After a prune's last batch: every record left behind (held by a
	// writer then) whose generation a prune covers.
	sqlSweepPrunedKeys = `DELETE FROM keys WHERE namespace = $1 AND idempotency_key IN (
		SELECT idempotency_key FROM keys WHERE namespace = $1 AND first_seq <= $2 FOR UPDATE SKIP LOCKED)`

	sqlThinCheckpoints = `DELETE FROM checkpoints AS c USING unnest($2::bigint[]) AS u(size)
		WHERE c.namespace = $1 AND c.size = u.size AND c.size <= $3`

	sqlDeletedThrough = `UPDATE prunes SET deleted_through = $3 WHERE namespace = $1 AND seq = $2`
)

// DeletePruned deletes, in one transaction, the bodies of receipts b.From
// … b.To of namespace ns, pruned by the prune receipt b.Prune whose
// deletion has reached b.From-1, and the rows derived from them: their
// payloads, asked inputs and reconciled tokens, their tree hashes of
// levels 0–7, and the key records whose generation the prune covers, and
// the stored checkpoints of sizes b.Thin (none above b.To). It keeps their
// chain hashes in kept tiles and b.KeyMACs in pruned_keys, and moves the
// prune's deleted_through to b.To. The subject index and the
// erasure tables keep their rows (SPEC §14 outlives a prune).
func (s *Store) DeletePruned(ctx context.Context, ns string, b ledger.DeleteBatch) error {
	what := fmt.Sprintf("delete pruned receipts %d…%d of %s", b.From, b.To, ns)
	if s.opts.ReadOnly {
		return fmt.Errorf("%s: %w", what, ledger.ErrOpenedReadOnly)
	}
	if b.Prune == 0 || b.From < 1 || b.To < b.From || b.To >= b.Prune {
		return fmt.Errorf("%s: not a range of prune %d", what, b.Prune)
	}
	c, err := s.chain(ctx, ns)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	start := time.Now()
	var keys, through int64
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var err error
		keys, through, err = c.deletePruned(ctx, tx, b)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", what, classify(err))
	}
	s.log.Debug("postgres: deleted pruned receipts", "ns", ns, "prune", b.Prune, "from", b.From, "to", b.To,
		"keys", keys, "took", time.Since(start))
	if int64(b.To) == through {
		s.vacuumPruned()
	}
	return nil
}

// vacuumPruned runs VACUUM (ANALYZE) on the tables a prune deleted from,
// in the background and at most one at a time, once a prune's deletion
// has finished (SPEC §16: PostgreSQL's tables are vacuumed), so that the
// space of the deleted rows is reused without waiting for autovacuum. A
// role that does not own the tables cannot vacuum them: autovacuum then
// does it alone (logged).
func (s *Store) vacuumPruned() {
	if !s.vacuuming.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.vacuuming.Store(false)
		ctx, cancel := context.WithTimeout(s.bgCtx, time.Hour)
		defer cancel()
		for _, table := range []string{"receipts", "tree_hashes", "keys", "payloads"} {
			start := time.Now()
			if _, err := s.pool.Exec(ctx, "VACUUM (ANALYZE) "+table); err != nil { // a name from the fixed list
				if !s.isClosed() {
					s.log.Info("postgres: vacuum after a prune failed; autovacuum will do it", "table", table, "err", err)
				}
				return
			}
			s.log.Debug("postgres: vacuumed after a prune", "table", table, "took", time.Since(start))
		}
	}()
}

// deletePruned is DeletePruned's transaction: one round trip to check
// the batch against the prune row (locked) and read the range, one to
// keep, delete and record progress. It returns how many key records it
// deleted and the prune's last seq.
func (c *Chain) deletePruned(ctx context.Context, tx pgx.Tx, b ledger.DeleteBatch) (int64, int64, error) {
	var q pgx.Batch
	q.Queue(sqlPrunerMark)
	q.Queue(sqlDeletePruneRow, c.ns, int64(b.Prune))
	q.Queue(sqlDeleteEarlierUnfinished, c.ns, int64(b.Prune))
	q.Queue(sqlDeleteKeptLength, c.ns, int64((b.From-1)/tlog.KeptLeaves))
	q.Queue(sqlDeleteRange, c.ns, int64(b.From), int64(b.To))
	br := tx.SendBatch(ctx, &q)
	var through, deleted, earlier, keptLen, count int64
	var keys []string
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&through, &deleted)
		if errors.Is(err, pgx.ErrNoRows) {
			err = fmt.Errorf("no prune receipt %d", b.Prune)
		}
	}
	if err == nil {
		err = br.QueryRow().Scan(&earlier)
	}
	if err == nil {
		err = br.QueryRow().Scan(&keptLen)
	}
	if err == nil {
		err = br.QueryRow().Scan(&count, &keys)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, 0, err
	}
	switch n := b.To - b.From + 1; {
	case uint64(deleted) != b.From-1:
		return 0, 0, fmt.Errorf("prune %d has deleted through %d, the batch starts at %d", b.Prune, deleted, b.From)
	case b.To > uint64(through):
		return 0, 0, fmt.Errorf("prune %d covers receipts through %d", b.Prune, through)
	case earlier != 0:
		return 0, 0, fmt.Errorf("the deletion of the earlier prune %d is unfinished", earlier)
	case keptLen != int64((b.From-1)%tlog.KeptLeaves)*32:
		return 0, 0, fmt.Errorf("kept tile %d holds %d bytes, want %d", (b.From-1)/tlog.KeptLeaves, keptLen,
			int64((b.From-1)%tlog.KeptLeaves)*32)
	case uint64(count) != n:
		return 0, 0, fmt.Errorf("%d of the %d receipts are stored", count, n)
	}

	macs := make([]int64, len(b.KeyMACs))
	for i, m := range b.KeyMACs {
		macs[i] = int64(m)
	}
	ns, from, to := c.ns, int64(b.From), int64(b.To)
	q = pgx.Batch{}
	q.Queue(sqlKeepHashes, ns, from, to)
	q.Queue(sqlKeepPrunedKeys, ns, macs, int64(b.Prune))
	q.Queue(sqlDeleteReceipts, ns, from, to)
	q.Queue(sqlDeletePayloads, ns, from, to)
	q.Queue(sqlDeleteAskInputs, ns, from, to)
	q.Queue(sqlDeleteReconciled, ns, keys, from, to)
	q.Queue(sqlDeleteTreeHashes, ns, prunedTreeIndexes(b.From, b.To))
	keyStmts := map[int]bool{q.Len(): true}
	q.Queue(sqlDeletePrunedKeys, ns, keys, through)
	if b.To == uint64(through) {
		keyStmts[q.Len()] = true
		q.Queue(sqlSweepPrunedKeys, ns, through)
	}
	if len(b.Thin) > 0 {
		q.Queue(sqlThinCheckpoints, ns, b.Thin, to)
	}
	q.Queue(sqlDeletedThrough, ns, int64(b.Prune), to)
	br = tx.SendBatch(ctx, &q)
	defer func() { _ = br.Close() }()
	var gone int64
	for i := range q.QueuedQueries {
		tag, err := br.Exec()
		if err != nil {
			return 0, 0, err
		}
		switch i {
		case 0:
			if tiles := (b.To-1)/tlog.KeptLeaves - (b.From-1)/tlog.KeptLeaves + 1; uint64(tag.RowsAffected()) != tiles {
				return 0, 0, fmt.Errorf("kept %d tiles of %d", tag.RowsAffected(), tiles)
			}
		case 2:
			if tag.RowsAffected() != count {
				return 0, 0, fmt.Errorf("deleted %d receipts of %d", tag.RowsAffected(), count)
			}
		}
		if keyStmts[i] {
			gone += tag.RowsAffected()
		}
	}
	if err := br.Close(); err != nil {
		return 0, 0, err
	}
	return gone, through, nil
}

// prunedTreeIndexes lists the stored tree hashes of levels 0–7 that the
// leaves of the tiles a batch of receipts from … to completes stored: the
// hashes that go with them.
// Leaf n completes the nodes at StoredHashIndex(0, n) onwards, one a
// level (sumdb.StoredHashes), and a node's leaves are all ≤ the leaf that
// completes it, so the kept tiles recompute every one of them.
func prunedTreeIndexes(from, to uint64) []int64 {
	// Only the tiles this batch completes: a writer that read the kept
	// prefix before this batch committed may still read the hashes of
	// the tile it appends in, which a later batch completes.
	var out []int64
	for t := int64(from-1) / tlog.KeptLeaves; (t+1)*tlog.KeptLeaves <= int64(to); t++ {
		for n := t * tlog.KeptLeaves; n < (t+1)*tlog.KeptLeaves; n++ {
			base := sumdb.StoredHashIndex(0, n)
			count := sumdb.StoredHashCount(n+1) - sumdb.StoredHashCount(n)
			for l := int64(0); l < min(count, keptLevels); l++ {
				out = append(out, base+l)
			}
		}
	}
	return out
}
