package postgres

import (
	"context"
	"time"
)

// PostgreSQL plans a prepared statement for its arguments five times,
// then keeps a generic plan when that looks no worse. Most lookups of
// receipts have several indexes that start with namespace; a generic plan
// made while the tables were small can pick one that matches the
// namespace alone and filters the rest, and every connection of the pool
// keeps it until the table is analyzed again. Autovacuum analyzes a new
// table a minute later at the soonest. Measured on a new database with 32
// goroutines and one namespace: 340 pairs/s over 8,000 pairs, and falling
// as the chain grew (receipts_by_kind read 34 million tuples in 6,570
// scans), against 1,990–2,100 once the tables were analyzed. Planning
// every statement instead (plan_cache_mode=force_custom_plan) cost a third
// of the writing backend's CPU with 16 namespaces, in the head trigger's
// queries above all.
//
// So the writer analyzes the ledger's tables itself while they are young:
// it looks at most once per analyzeEvery, and analyzes a table after at
// least analyzeMinChanges changes that are at least half as many rows as
// the table holds, below analyzeBelow rows. That is about a dozen
// ANALYZEs in a table's life, each of which makes every connection plan
// its statements again; past analyzeBelow rows autovacuum's own threshold
// (a tenth of the table) keeps the statistics close enough.
const (
	analyzeEvery      = time.Second
	analyzeMinChanges = 500
	analyzeBelow      = 1 << 20

	// The stale tables, and whether this role owns each: PostgreSQL
	// skips, with a WARNING only, an ANALYZE of a table the role does not
	// own.
	sqlStaleTables = `SELECT s.relname, pg_has_role(c.relowner, 'MEMBER')
		FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
		WHERE s.relid IN ('receipts'::regclass, 'keys'::regclass, 'tree_hashes'::regclass)
			AND s.n_live_tup < $1 AND s.n_mod_since_analyze >= $2 AND s.n_mod_since_analyze * 2 >= s.n_live_tup`
)

// analyzeYoung analyzes the tables whose statistics lag their growth (see
// above), in the background, one run at a time. A role that does not own
// them is told once, and these runs end for the Store; a failure is
// retried at the next look.
func (s *Store) analyzeYoung() {
	now := time.Now().UnixNano()
	if s.noAnalyze.Load() || now-s.analyzedAt.Load() < int64(analyzeEvery) || !s.analyzing.CompareAndSwap(false, true) {
		return
	}
	s.analyzedAt.Store(now)
	go func() {
		defer s.analyzing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rows, err := s.pool.Query(ctx, sqlStaleTables, analyzeBelow, analyzeMinChanges)
		var owned, foreign []string
		if err == nil {
			for rows.Next() {
				var name string
				var own bool
				if err = rows.Scan(&name, &own); err != nil {
					break
				}
				if own {
					owned = append(owned, name)
				} else {
					foreign = append(foreign, name)
				}
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		for _, table := range owned {
			if err != nil {
				break
			}
			_, err = s.pool.Exec(ctx, "ANALYZE "+table) // a name from the fixed list above
		}
		switch {
		case err != nil && !s.isClosed():
			s.log.Debug("postgres: analyzing young tables", "err", err)
		case len(foreign) > 0:
			s.noAnalyze.Store(true)
			s.log.Warn("postgres: cannot analyze the ledger's young tables (this role does not own them); autovacuum will",
				"tables", foreign)
		}
	}()
}
