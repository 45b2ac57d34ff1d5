package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// A ledger file of an older schema (1 to 7) is brought to this one in one
// transaction, by the same steps whatever its version:
//
//  1. every trigger, view and index goes, and every table T is set aside
//     as old_T;
//  2. schema.sql makes the tables of this version;
//  3. the rows are copied in: the default namespace's from the tables it
//     had (receipts, checkpoints, …) as namespace 0, the other namespaces'
//     from the shared tables of version 6, the receipts in seq order
//     through the linking trigger, so that a broken chain is refused, not
//     carried over; the registry, the API tokens and the open
//     reservations' token hashes (from the keys table of versions 1 to 3)
//     with them;
//  4. the old tables are dropped.
//
// A crash leaves the file as it was or migrated, never between. The
// default namespace's Merkle tree is built again from its receipts when
// the file is opened (initTree); namespace files of the layout before
// version 6 are moved in by a writing Store (migratefiles.go).

// upgradeCopies copy the rows of the tables set aside (old_…) that each
// needs, in order.
var upgradeCopies = []struct {
	needs []string
	sql   string
}{
	{[]string{"receipts"}, `INSERT INTO ns_receipts (ns, ` + receiptColumns + `) SELECT 0, ` + receiptColumns + ` FROM old_receipts ORDER BY seq`},
	{[]string{"settings"}, `INSERT INTO ns_settings (ns, key_ttl_ms) SELECT 0, key_ttl_ms FROM old_settings WHERE id = 1`},
	{[]string{"reserve_tokens"}, `INSERT INTO ns_tokens (rid, token_hash) SELECT r.rowid, t.token_hash
		FROM old_reserve_tokens AS t JOIN ns_receipts AS r ON r.ns = 0 AND r.seq = t.seq ORDER BY t.seq`},
	{[]string{"keys"}, `INSERT INTO ns_tokens (rid, token_hash) SELECT r.rowid, k.token_hash
		FROM old_keys AS k JOIN ns_receipts AS r ON r.ns = 0 AND r.seq = k.reserve_seq
		WHERE length(k.token_hash) = 32 AND k.final_seq < k.reserve_seq ORDER BY k.reserve_seq`},
	{[]string{"checkpoints"}, `INSERT INTO ns_checkpoints (ns, size, root, note, signed_at) SELECT 0, size, root, note, signed_at FROM old_checkpoints ORDER BY size`},
	{[]string{"approval_inputs"}, `INSERT INTO ns_approval_inputs (ns, ask_seq, input, delete_after) SELECT 0, ask_seq, input, delete_after FROM old_approval_inputs`},
	{[]string{"state_key"}, `INSERT INTO ns_state_key (ns, key) SELECT 0, key FROM old_state_key`},

	{[]string{"namespace_ids"}, `INSERT INTO namespace_ids (id, name) SELECT id, name FROM old_namespace_ids ORDER BY id`},
	{[]string{"namespace_ids"}, `UPDATE sqlite_sequence SET seq = max(seq, (SELECT seq FROM sqlite_sequence WHERE name = 'old_namespace_ids'))
		WHERE name = 'namespace_ids'`},
	{[]string{"namespace_events"}, `INSERT INTO namespace_events (id, name, action, decided_by, reason, at, head_seq, head_hash, moved_to)
		SELECT id, name, action, decided_by, reason, at, head_seq, head_hash, moved_to FROM old_namespace_events ORDER BY id`},
	{[]string{"ns_head"}, `INSERT INTO ns_head (ns, seq, hash) SELECT ns, 0, zeroblob(32) FROM old_ns_head WHERE ns != 0`},
	{[]string{"ns_receipts"}, `INSERT INTO ns_receipts (ns, ` + receiptColumns + `) SELECT ns, ` + receiptColumns + ` FROM old_ns_receipts ORDER BY ns, seq`},
	{[]string{"ns_tree"}, `INSERT INTO ns_tree (rid, hashes) SELECT n.rowid, t.hashes FROM old_ns_tree AS t
		JOIN old_ns_receipts AS o ON o.rowid = t.rid JOIN ns_receipts AS n ON n.ns = o.ns AND n.seq = o.seq ORDER BY n.rowid`},
	{[]string{"ns_tokens"}, `INSERT INTO ns_tokens (rid, token_hash) SELECT n.rowid, t.token_hash FROM old_ns_tokens AS t
		JOIN old_ns_receipts AS o ON o.rowid = t.rid JOIN ns_receipts AS n ON n.ns = o.ns AND n.seq = o.seq ORDER BY n.rowid`},
	{[]string{"ns_checkpoints"}, `INSERT INTO ns_checkpoints (ns, size, root, note, signed_at)
		SELECT ns, size, root, note, signed_at FROM old_ns_checkpoints ORDER BY ns, size`},
	// Version 7 keeps default's settings (ns 0) here too; namespaces made
	// before version 8 keep their payloads inline (the column's default).
	// A migration from version 8 on must copy payloads as well.
	{[]string{"ns_settings"}, `INSERT INTO ns_settings (ns, key_ttl_ms) SELECT ns, key_ttl_ms FROM old_ns_settings
		WHERE ns NOT IN (SELECT ns FROM ns_settings)`},
	{nil, `INSERT OR IGNORE INTO ns_settings (ns, key_ttl_ms) VALUES (0, 0)`}, // keys of a file before key lifetimes never expire
	{[]string{"ns_reconciled_tokens"}, `INSERT INTO ns_reconciled_tokens SELECT * FROM old_ns_reconciled_tokens`},
	{[]string{"ns_pending_erasures"}, `INSERT INTO ns_pending_erasures SELECT * FROM old_ns_pending_erasures`},
	{[]string{"ns_subjects"}, `INSERT INTO ns_subjects (ns, mac, key, first_seq) SELECT ns, mac, key, first_seq FROM old_ns_subjects`},
	{[]string{"ns_erasures"}, `INSERT INTO ns_erasures (ns, seq, salt, ranges, purged_at)
		SELECT ns, seq, salt, ranges, purged_at FROM old_ns_erasures`},
	{[]string{"ns_erasure_subjects"}, `INSERT INTO ns_erasure_subjects (ns, seq, mac) SELECT ns, seq, mac FROM old_ns_erasure_subjects`},
	{[]string{"ns_payloads"}, `INSERT INTO ns_payloads SELECT n.rowid, p.external_ref, p.external_ref_salt, p.external_ref_erased,
		p.result, p.result_salt, p.result_erased, p.error_message, p.error_message_salt, p.error_message_erased,
		p.note, p.note_salt, p.note_erased FROM old_ns_payloads AS p
		JOIN old_ns_receipts AS o ON o.rowid = p.rid JOIN ns_receipts AS n ON n.ns = o.ns AND n.seq = o.seq ORDER BY n.rowid`},
	{[]string{"ns_approval_inputs"}, `INSERT INTO ns_approval_inputs (ns, ask_seq, input, delete_after)
		SELECT ns, ask_seq, input, delete_after FROM old_ns_approval_inputs`},
	{[]string{"ns_state_key"}, `INSERT INTO ns_state_key (ns, key) SELECT ns, key FROM old_ns_state_key`},
}

// upgradeCommon are the tables whose columns grew over the versions: the
// columns an old table has are copied, the others take their defaults.
var upgradeCommon = []string{"namespaces", "tokens"}

// upgrade applies the schema to an empty file, brings a file of an older
// version to this one, and refuses a file with an unknown schema version
// or that belongs to something else, through the writer w. A new file's
// default namespace has settings st.
func upgrade(ctx context.Context, w *sql.DB, abs string, st ledger.NamespaceSettings, logger *slog.Logger) error {
	tx, err := w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: %w", classify(err))
	}
	defer func() { _ = tx.Rollback() }()
	var version, objects, appID int
	for q, dst := range map[string]*int{`PRAGMA user_version`: &version, `PRAGMA application_id`: &appID,
		`SELECT count(*) FROM sqlite_schema`: &objects} {
		if err := tx.QueryRowContext(ctx, q).Scan(dst); err != nil {
			return fmt.Errorf("migrate: %w", classify(err))
		}
	}
	switch {
	case version == SchemaVersion && appID == applicationID:
		added, err := addSideTables(ctx, tx)
		if err != nil || !added {
			return err
		}
		logger.Info("added side tables to ledger database", "path", abs, "schema_version", version)
		return classify(tx.Commit())
	case version == 0 && objects == 0:
		if _, err := tx.ExecContext(ctx, schemaSQL); err != nil {
			return fmt.Errorf("create: %w", classify(err))
		}
		if _, err := tx.ExecContext(ctx, sqlNewSettings, defaultID, st.KeyTTL, string(st.Payloads)); err != nil {
			return fmt.Errorf("create: %w", classify(err))
		}
		return classify(tx.Commit())
	case version == 0 || appID != applicationID:
		return ledger.ErrNotLedger
	case version > SchemaVersion:
		return fmt.Errorf("%w: file has %d, this build knows %d", ledger.ErrSchemaVersion, version, SchemaVersion)
	}
	start := time.Now()
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM receipts`).Scan(&n); err != nil {
		return fmt.Errorf("migrate v%d: %w", version, classify(err))
	}
	logger.Info("migrating ledger database", "path", abs, "from", version, "to", SchemaVersion, "receipts", n)
	if err := upgradeTx(ctx, tx); err != nil {
		return fmt.Errorf("migrate v%d: %w (nothing was changed; `ledgerctl verify --db FILE` checks the chain)", version, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate v%d: %w", version, classify(err))
	}
	logger.Info("migrated ledger database", "path", abs, "from", version, "to", SchemaVersion, "receipts", n,
		"duration", time.Since(start))
	return nil
}

// upgradeTx runs the steps of a migration in tx.
func upgradeTx(ctx context.Context, tx *sql.Tx) error {
	old, err := setAside(ctx, tx)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, schemaSQL); err != nil {
		return fmt.Errorf("schema: %w", classify(err))
	}
	for _, t := range upgradeCommon {
		if old[t] == nil {
			continue
		}
		q := fmt.Sprintf(`INSERT INTO %s (%s) SELECT %[2]s FROM old_%[1]s`, t, strings.Join(old[t], ", "))
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("copy %s: %w", t, classify(err))
		}
	}
copies:
	for _, c := range upgradeCopies {
		for _, t := range c.needs {
			if old[t] == nil {
				continue copies
			}
		}
		if _, err := tx.ExecContext(ctx, c.sql); err != nil {
			return fmt.Errorf("copy %s: %w", strings.Join(c.needs, ", "), classify(err))
		}
	}
	for t := range old {
		if _, err := tx.ExecContext(ctx, `DROP TABLE old_`+t); err != nil {
			return fmt.Errorf("drop old_%s: %w", t, classify(err))
		}
	}
	return nil
}

// setAside drops every trigger, view and index of the file and renames
// every table T to old_T, returning the columns of each by its old name.
func setAside(ctx context.Context, tx *sql.Tx) (map[string][]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT type, name FROM sqlite_schema
		WHERE type IN ('trigger', 'view', 'index', 'table') AND name NOT LIKE 'sqlite_%' AND sql IS NOT NULL
		ORDER BY CASE type WHEN 'table' THEN 1 ELSE 0 END`)
	if err != nil {
		return nil, classify(err)
	}
	type object struct{ kind, name string }
	var objects []object
	for rows.Next() {
		var o object
		if err := rows.Scan(&o.kind, &o.name); err != nil {
			_ = rows.Close()
			return nil, err
		}
		objects = append(objects, o)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, classify(err)
	}
	old := map[string][]string{}
	for _, o := range objects {
		q := fmt.Sprintf(`DROP %s "%s"`, strings.ToUpper(o.kind), o.name)
		if o.kind == "table" {
			cols, err := tableColumns(ctx, tx, o.name)
			if err != nil {
				return nil, err
			}
			old[o.name] = cols
			q = fmt.Sprintf(`ALTER TABLE "%s" RENAME TO "old_%[1]s"`, o.name)
		}
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return nil, fmt.Errorf("set aside %s %s: %w", o.kind, o.name, classify(err))
		}
	}
	return old, nil
}

// tableColumns lists the columns of table t (none when there is no t).
func tableColumns(ctx context.Context, q querier, t string) ([]string, error) {
	rows, err := q.QueryContext(ctx, `SELECT name FROM pragma_table_info(?) ORDER BY cid`, t)
	if err != nil {
		return nil, classify(err)
	}
	defer func() { _ = rows.Close() }()
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, err
		}
		cols = append(cols, c)
	}
	return cols, classify(rows.Err())
}

// migratedCopy opens a reader of a copy of the ledger file at abs (and of
// its namespace files, for a ledger made before version 6), made in a
// temporary directory by VACUUM INTO (a consistent snapshot that leaves
// the original as it is) and migrated there by a writing Store. Close
// removes the copy.
func migratedCopy(ctx context.Context, abs string, opts Options) (*Reader, error) {
	dir, err := os.MkdirTemp("", "ledger-migrated-")
	if err != nil {
		return nil, fmt.Errorf("open ledger %s: copy to migrate: %w", abs, err)
	}
	dst := filepath.Join(dir, filepath.Base(abs))
	files := map[string]string{abs: dst}
	if old, _ := filepath.Glob(filepath.Join(abs+".ns", "ns-*.db")); len(old) > 0 {
		if err := os.Mkdir(dst+".ns", 0o700); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		for _, f := range old {
			files[f] = filepath.Join(dst+".ns", filepath.Base(f))
		}
	}
	for from, to := range files {
		if err := vacuumInto(ctx, from, to, opts.BusyTimeout); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("open ledger %s: copy to migrate: %w", abs, err)
		}
	}
	sopts := opts
	sopts.Logger = slog.New(slog.DiscardHandler)
	st, err := OpenStore(ctx, dst, sopts, false)
	if err == nil {
		err = st.Close()
	}
	var rd *Reader
	if err == nil {
		rd, err = openReader(ctx, dst, opts)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	rd.cleanup = func() { _ = os.RemoveAll(dir) }
	return rd, nil
}

// vacuumInto writes a consistent copy of the database file at from to to,
// through a read-only connection.
func vacuumInto(ctx context.Context, from, to string, busy time.Duration) error {
	db, err := sql.Open("sqlite3", dsn(from, "ro", busy, 0))
	if err != nil {
		return err
	}
	defer func() { _ = db.Close() }()
	if _, err := db.ExecContext(ctx, `VACUUM INTO ?`, to); err != nil {
		return classify(err)
	}
	return nil
}
