package sqlite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// derivedKeysSQL computes keys rows from the receipts alone, for the keys
// that match where (a condition on r, the reserves), with ttl the SQL of
// the key_ttl_ms. The fingerprint and flags come from the first reserve of
// the key's current generation: the latest reserve that is the key's
// first (ref_seq 0) or renews it (SPEC §12: it names a replay, or an
// outcome at least key_ttl_ms older than itself). The lease comes from the
// latest reserve, and final_seq is the latest commit or resolve of the
// generation. Its columns are those of the keys table, in order.
func derivedKeysSQL(where, ttl string) string {
	return `
	SELECT g.idempotency_key, f.key_generated, f.tool, f.effect, f.input_hash, f.idempotent,
		g.first_seq, g.last_seq, l.lease_expires_at,
		coalesce((SELECT max(x.seq) FROM receipts AS x INDEXED BY receipts_by_key
			WHERE x.idempotency_key = g.idempotency_key AND x.kind IN ('commit', 'resolve') AND x.seq > g.first_seq), 0)
	FROM (SELECT idempotency_key, CASE WHEN gen_seq > 0 THEN gen_seq ELSE min_seq END AS first_seq, last_seq
		FROM (SELECT r.idempotency_key,
			max(CASE WHEN r.ref_seq = 0 OR p.kind = 'replay' OR (p.kind IN ('commit', 'resolve')
				AND t.ttl > 0 AND r.recorded_at >= p.recorded_at + t.ttl) THEN r.seq ELSE 0 END) AS gen_seq,
			min(r.seq) AS min_seq, max(r.seq) AS last_seq
		FROM receipts AS r
		LEFT JOIN receipts AS p ON p.seq = r.ref_seq AND p.idempotency_key = r.idempotency_key
		CROSS JOIN (SELECT ` + ttl + ` AS ttl) AS t
		WHERE r.kind = 'reserve'` + where + `
		GROUP BY r.idempotency_key)) AS g
	JOIN receipts AS f ON f.seq = g.first_seq
	JOIN receipts AS l ON l.seq = g.last_seq`
}

// sqlFileTTL is the key_ttl_ms of the file (schema 3 on).
const sqlFileTTL = `coalesce((SELECT key_ttl_ms FROM settings WHERE id = 1), 0)`

// sqlDerivedKeys is every derived keys row of the file.
var sqlDerivedKeys = derivedKeysSQL("", sqlFileTTL)

// sqlDerivedKey is the derived keys row of the one key ?1, with the
// key_ttl_ms ?2 (a reader of a file older than schema 3 has no settings).
var sqlDerivedKey = derivedKeysSQL(" AND r.idempotency_key = ?1", "?2")

// sqlKeyDrift is SQLKeysDrift for the one key ?1: a single statement, so
// both sides come from one snapshot even while ledgerd writes.
var sqlKeyDrift = `
	SELECT 'stored', * FROM (SELECT ` + keysColumns + ` FROM keys WHERE idempotency_key = ?1 EXCEPT ` + sqlDerivedKey + `)
	UNION ALL
	SELECT 'derived', * FROM (` + sqlDerivedKey + ` EXCEPT SELECT ` + keysColumns + ` FROM keys WHERE idempotency_key = ?1)`

// KeyDrift returns the differences between the stored keys row of key and
// what its receipts say, read in one snapshot; none when they agree.
func (rd *Reader) KeyDrift(ctx context.Context, key string) ([]string, error) {
	ttl, err := rd.KeyTTL(ctx)
	if err != nil {
		return nil, fmt.Errorf("key drift: %w", err)
	}
	rows, err := rd.r.QueryContext(ctx, sqlKeyDrift, key, ttl)
	if err != nil {
		return nil, fmt.Errorf("key drift: %w", classify(err))
	}
	defer func() { _ = rows.Close() }()
	var out []string
	for rows.Next() {
		var side string
		var k ledger.KeyRecord
		if err := rows.Scan(&side, &k.Key, &k.Generated, &k.Tool, &k.Effect, &k.InputHash, &k.Idempotent,
			&k.FirstSeq, &k.ReserveSeq, &k.LeaseExpiresAt, &k.FinalSeq); err != nil {
			return nil, fmt.Errorf("key drift: %w", err)
		}
		out = append(out, fmt.Sprintf("%s: first_seq=%d reserve_seq=%d lease_expires_at=%d final_seq=%d tool=%s effect=%s input_hash=%s idempotent=%t key_generated=%t",
			side, k.FirstSeq, k.ReserveSeq, k.LeaseExpiresAt, k.FinalSeq, k.Tool, k.Effect, k.InputHash, k.Idempotent, k.Generated))
	}
	return out, rows.Err()
}

const keysColumns = `idempotency_key, key_generated, tool, effect, input_hash, idempotent,
	first_seq, reserve_seq, lease_expires_at, final_seq`

// SQLKeysDrift lists the rows in which the stored keys table and the keys
// derived from the receipts differ (either way round); it returns no rows
// when the derived table is consistent. It is the set-based form of the
// verifier's merge-join check, for operators with sqlite3 and for tests
// (on files of schema 3 on).
var SQLKeysDrift = `
	SELECT 'stored', * FROM (SELECT ` + keysColumns + ` FROM keys EXCEPT ` + sqlDerivedKeys + `)
	UNION ALL
	SELECT 'derived', * FROM (` + sqlDerivedKeys + ` EXCEPT SELECT ` + keysColumns + ` FROM keys)`

// RebuildKeys recomputes the keys table from the receipts, and the
// recorded head from their tail, in one write transaction, for recovery
// after the derived state was lost or damaged (open the store with
// Options.Repair when it refuses to open for that reason).
// It returns the number of keys. Reservation token hashes cannot be
// rebuilt (tokens never enter a receipt) and are left as they are.
func (db *fileChain) RebuildKeys(ctx context.Context) (int64, error) {
	var n int64
	err := db.update(ctx, func(ctx context.Context, t *writeTx) error {
		if _, err := t.tx.ExecContext(ctx, `DELETE FROM keys`); err != nil {
			return fmt.Errorf("rebuild keys: %w", classify(err))
		}
		res, err := t.tx.ExecContext(ctx, `INSERT INTO keys (`+keysColumns+`) `+sqlDerivedKeys)
		if err != nil {
			return fmt.Errorf("rebuild keys: %w", classify(err))
		}
		// The recorded head follows the receipts' actual tail again.
		tail, err := readTail(ctx, t.tx)
		if err != nil {
			return fmt.Errorf("rebuild keys: %w", err)
		}
		if _, err := t.tx.ExecContext(ctx, `INSERT OR REPLACE INTO head (id, seq, hash) VALUES (1, ?, ?)`,
			tail.Seq, tail.Hash[:]); err != nil {
			return fmt.Errorf("rebuild keys: %w", classify(err))
		}
		t.head = tail
		t.resetCache = true
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}

// RebuildNamespace recomputes the derived state of namespace ns of the
// ledger at path (its own file, FILE.ns/ns-NS.db; FILE itself for
// default), opened alone for writing and without the derived-state check,
// and then opens it again normally to prove the repair. ledgerd must not
// be serving the ledger (the file's lock). It returns the number of keys
// and the head.
func RebuildNamespace(ctx context.Context, path, ns string, opts Options) (int64, ledger.Head, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return 0, ledger.Head{}, err
	}
	opts.defaults()
	file := NamespacePath(abs, ns)
	if _, err := os.Stat(file); err != nil {
		return 0, ledger.Head{}, fmt.Errorf("namespace %s: %w", ns, err)
	}
	opts.Repair = true
	c, err := openFileChain(ctx, file, ns, opts)
	if err != nil {
		return 0, ledger.Head{}, err
	}
	n, err := c.RebuildKeys(ctx)
	head := *c.head.Load()
	if cerr := c.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, head, err
	}
	opts.Repair = false
	check, err := openFileChain(ctx, file, ns, opts)
	if err != nil {
		return n, head, fmt.Errorf("after rebuilding: %w", err)
	}
	return n, head, check.Close()
}
