package sqlite

import (
	"fmt"
	"regexp"
	"strings"

	sumdb "golang.org/x/mod/sumdb/tlog"
)

// Every namespace of a ledger lives in the ledger file (docs/design/tenants.md §4). The
// namespace default keeps the file's own tables (receipts, head, tree_hashes, …), as every
// ledger file always had them. Every other namespace lives in the shared tables ns_receipts,
// ns_head, ns_checkpoints, ns_approval_inputs, ns_state_key and ns_settings, which have the
// same columns plus ns, the namespace's id in the registry (namespaces.id), and in ns_tree and
// ns_tokens, whose rows (a leaf's stored tree hashes, a reservation's token hash) are keyed by
// the rowid of their receipt in ns_receipts. The schema is the same size for one namespace or 100,000,
// and one transaction of the file's single writer commits the batches of any number of
// namespaces with one durable write (Store.UpdateGroup).
//
// A statement that only reads is written once, over the default tables. For a namespace of
// the shared tables it is prefixed with common table expressions that shadow those tables
// with the namespace's rows:
//
//	WITH receipts AS NOT MATERIALIZED (SELECT … FROM ns_receipts WHERE ns = ?1) SELECT …
//
// SQLite flattens them into the statement, so a lookup by seq is one search of the
// (ns, seq) index, as it is of the rowid in the default tables. The namespace's id is
// always parameter 1 (chainRef.args puts it first); the statement's own "?" parameters
// follow it in order. Statements that write are written for both.

// sqlSharedSchema makes the shared tables, their indexes and their triggers: the same
// checks as the default tables', per namespace. The append-only triggers let rows go only
// once their namespace is no longer registered (namespace forget, which copies them to a
// file of their own first).
const sqlSharedSchema = `
CREATE TABLE IF NOT EXISTS ns_receipts (
	ns               INTEGER NOT NULL,
	seq              INTEGER NOT NULL CHECK (seq >= 1),
	kind             TEXT    NOT NULL CHECK (kind IN ('reserve', 'commit', 'replay', 'resolve', 'policy', 'ask', 'approval', 'deny')),
	idempotency_key  TEXT    NOT NULL,
	key_generated    INTEGER NOT NULL CHECK (key_generated IN (0, 1)),
	execution_id     TEXT    NOT NULL,
	attempt          INTEGER NOT NULL,
	tool             TEXT    NOT NULL,
	effect           TEXT    NOT NULL,
	idempotent       INTEGER NOT NULL CHECK (idempotent IN (0, 1)),
	input_hash       TEXT    NOT NULL,
	outcome          TEXT    NOT NULL,
	external_ref     TEXT    NOT NULL,
	result           TEXT    NOT NULL,
	error_code       TEXT    NOT NULL,
	error_message    TEXT    NOT NULL,
	retryable        INTEGER NOT NULL CHECK (retryable IN (0, 1)),
	lease_expires_at INTEGER NOT NULL,
	ref_seq          INTEGER NOT NULL,
	actor            TEXT    NOT NULL,
	note             TEXT    NOT NULL,
	recorded_at      INTEGER NOT NULL,
	prev_hash        BLOB    NOT NULL CHECK (length(prev_hash) = 32),
	hash             BLOB    NOT NULL CHECK (length(hash) = 32),
	UNIQUE (ns, seq)
);
CREATE INDEX IF NOT EXISTS ns_receipts_policy ON ns_receipts (ns, seq) WHERE kind = 'policy';
CREATE TABLE IF NOT EXISTS ns_head (
	ns   INTEGER PRIMARY KEY,
	seq  INTEGER NOT NULL,
	hash BLOB    NOT NULL CHECK (length(hash) = 32)
);
CREATE TRIGGER IF NOT EXISTS ns_receipts_no_update BEFORE UPDATE ON ns_receipts
BEGIN SELECT RAISE(ABORT, 'receipts are append-only'); END;
CREATE TRIGGER IF NOT EXISTS ns_receipts_no_delete BEFORE DELETE ON ns_receipts
WHEN EXISTS (SELECT 1 FROM namespaces WHERE id = OLD.ns)
BEGIN SELECT RAISE(ABORT, 'receipts are append-only'); END;
CREATE TRIGGER IF NOT EXISTS ns_receipts_link BEFORE INSERT ON ns_receipts
BEGIN
	SELECT RAISE(ABORT, 'a receipt must extend the head: seq = head seq + 1, prev_hash = head hash')
	FROM ns_head
	WHERE ns = NEW.ns AND (NEW.seq IS NOT seq + 1 OR NEW.prev_hash IS NOT hash);
	SELECT RAISE(ABORT, 'the head row is missing') WHERE NOT EXISTS (SELECT 1 FROM ns_head WHERE ns = NEW.ns);
END;
CREATE TRIGGER IF NOT EXISTS ns_receipts_advance_head AFTER INSERT ON ns_receipts
BEGIN
	UPDATE ns_head SET seq = NEW.seq, hash = NEW.hash WHERE ns = NEW.ns;
END;
CREATE TRIGGER IF NOT EXISTS ns_head_kept BEFORE DELETE ON ns_head
WHEN EXISTS (SELECT 1 FROM namespaces WHERE id = OLD.ns)
BEGIN SELECT RAISE(ABORT, 'the head rows of the ledger are never removed'); END;
CREATE TRIGGER IF NOT EXISTS head_kept BEFORE DELETE ON head
BEGIN SELECT RAISE(ABORT, 'the head rows of the ledger are never removed'); END;
CREATE TABLE IF NOT EXISTS ns_approval_inputs (
	ns           INTEGER NOT NULL,
	ask_seq      INTEGER NOT NULL,
	input        TEXT    NOT NULL,
	delete_after INTEGER NOT NULL,
	PRIMARY KEY (ns, ask_seq)
);
CREATE TABLE IF NOT EXISTS ns_state_key (
	ns  INTEGER PRIMARY KEY,
	key BLOB    NOT NULL CHECK (length(key) = 32)
);
CREATE TABLE IF NOT EXISTS ns_tokens (
	rid        INTEGER PRIMARY KEY, -- the rowid of the reserve in ns_receipts
	token_hash BLOB    NOT NULL CHECK (length(token_hash) = 32)
);
CREATE TABLE IF NOT EXISTS ns_settings (
	ns         INTEGER PRIMARY KEY,
	key_ttl_ms INTEGER NOT NULL CHECK (key_ttl_ms >= 0)
);
CREATE TRIGGER IF NOT EXISTS ns_settings_fixed BEFORE UPDATE ON ns_settings
BEGIN SELECT RAISE(ABORT, 'the settings of a ledger are fixed at creation'); END;
CREATE TRIGGER IF NOT EXISTS ns_settings_kept BEFORE DELETE ON ns_settings
WHEN EXISTS (SELECT 1 FROM namespaces WHERE id = OLD.ns)
BEGIN SELECT RAISE(ABORT, 'the settings of a ledger are fixed at creation'); END;
CREATE TABLE IF NOT EXISTS ns_tree (
	rid    INTEGER PRIMARY KEY, -- the rowid of the receipt in ns_receipts
	hashes BLOB    NOT NULL CHECK (length(hashes) > 0 AND length(hashes) % 32 = 0)
);
CREATE TABLE IF NOT EXISTS ns_checkpoints (
	ns        INTEGER NOT NULL,
	size      INTEGER NOT NULL CHECK (size >= 1),
	root      BLOB    NOT NULL CHECK (length(root) = 32),
	note      TEXT    NOT NULL,
	signed_at INTEGER NOT NULL,
	PRIMARY KEY (ns, size)
);
CREATE TRIGGER IF NOT EXISTS ns_tree_no_update BEFORE UPDATE ON ns_tree
BEGIN SELECT RAISE(ABORT, 'tree hashes are append-only'); END;
CREATE TRIGGER IF NOT EXISTS ns_tree_no_delete BEFORE DELETE ON ns_tree
WHEN EXISTS (SELECT 1 FROM ns_receipts AS r JOIN namespaces AS n ON n.id = r.ns WHERE r.rowid = OLD.rid)
BEGIN SELECT RAISE(ABORT, 'tree hashes are append-only'); END;
CREATE TRIGGER IF NOT EXISTS ns_checkpoints_no_update BEFORE UPDATE ON ns_checkpoints
BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only'); END;
CREATE TRIGGER IF NOT EXISTS ns_checkpoints_no_delete BEFORE DELETE ON ns_checkpoints
WHEN EXISTS (SELECT 1 FROM namespaces WHERE id = OLD.ns)
BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only'); END;
CREATE TRIGGER IF NOT EXISTS ns_checkpoints_grow BEFORE INSERT ON ns_checkpoints
BEGIN
	SELECT RAISE(ABORT, 'a checkpoint must be larger than the last one')
	WHERE NEW.size <= (SELECT coalesce(max(size), 0) FROM ns_checkpoints WHERE ns = NEW.ns);
END;`

// sharedTables are the tables of a chain, and for each the shared table's
// rows of one namespace with the default table's columns.
var sharedTables = []struct{ name, cte string }{
	{"receipts", `receipts AS NOT MATERIALIZED (SELECT ` + receiptColumns + ` FROM ns_receipts WHERE ns = ?1)`},
	{"head", `head(id, seq, hash) AS NOT MATERIALIZED (SELECT 1, seq, hash FROM ns_head WHERE ns = ?1)`},
	{"checkpoints", `checkpoints AS NOT MATERIALIZED (SELECT size, root, note, signed_at FROM ns_checkpoints WHERE ns = ?1)`},
	{"reserve_tokens", `reserve_tokens AS NOT MATERIALIZED (SELECT r.seq AS seq, t.token_hash AS token_hash
		FROM ns_receipts AS r JOIN ns_tokens AS t ON t.rid = r.rowid WHERE r.ns = ?1)`},
	{"approval_inputs", `approval_inputs AS NOT MATERIALIZED (SELECT ask_seq, input, delete_after FROM ns_approval_inputs WHERE ns = ?1)`},
	{"state_key", `state_key(id, key) AS NOT MATERIALIZED (SELECT 1, key FROM ns_state_key WHERE ns = ?1)`},
	{"settings", `settings(id, key_ttl_ms) AS NOT MATERIALIZED (SELECT 1, key_ttl_ms FROM ns_settings WHERE ns = ?1)`},
}

var tableWords = regexp.MustCompile(`\b(receipts|head|checkpoints|reserve_tokens|approval_inputs|state_key|settings)\b`)

// sharedRead returns the read q over one namespace of the shared tables:
// q, whose parameters are all "?" (or "?1" … when numbered, which shift
// by one), prefixed with the shadowing table expressions it needs.
func sharedRead(q string) string {
	used := map[string]bool{}
	for _, m := range tableWords.FindAllString(q, -1) {
		used[m] = true
	}
	var ctes []string
	for _, t := range sharedTables {
		if used[t.name] {
			ctes = append(ctes, t.cte)
		}
	}
	if len(ctes) == 0 {
		panic("sqlite: a chain read that reads no chain table: " + q)
	}
	q = shiftNumbered(q)
	if rest, ok := strings.CutPrefix(strings.TrimLeft(q, " \t\n"), "WITH "); ok {
		return "WITH " + strings.Join(ctes, ", ") + ", " + rest // its own table expressions follow
	}
	return "WITH " + strings.Join(ctes, ", ") + " " + q
}

// shiftNumbered renumbers q's parameters ?N to ?N+1 (N < 9), making room
// for the namespace as ?1.
func shiftNumbered(q string) string {
	var b strings.Builder
	for i := 0; i < len(q); i++ {
		b.WriteByte(q[i])
		if q[i] == '?' && i+1 < len(q) && q[i+1] >= '1' && q[i+1] <= '8' && (i+2 >= len(q) || q[i+2] < '0' || q[i+2] > '9') {
			b.WriteByte(q[i+1] + 1)
			i++
		}
	}
	return b.String()
}

// chainSQL is the SQL of one chain's tables: defaultSQL's of the default
// namespace, sharedSQL's of the others.
type chainSQL struct {
	shared bool

	head, receiptBySeq, lastRecordedAt, recordedHead, keyTTL, policySeq, recordedAtOf,
	askInput, tokensAfter, firstFields, scanBySeq, scanBySeqRange, scanByKey,
	scanByKeyAfter, duplicateSuccesses, repeatedFailures, openKeysAfter, keyReceipts,
	stateKey, treeHash, treeCount, receiptHashes, latestCheckpoint, checkpointAt,
	checkpointCover, maxCheckpoint, hashAt, nonIntegerSeqBySeq, nonIntegerSeqByKey string

	insertReceipt, insertToken, putAskInput, askInputDeadline, purgeAskInputs,
	insertStateKey, insertCheckpoint, repairHead string
	treeInsert [8]string

	// The shared tables' tree and tokens, keyed by their receipt's row:
	// treeHash reads a leaf's row by (ns, seq), treeCount returns the
	// tree's size in leaves (not a count of hashes), treeRow and
	// insertToken take the receipt's rowid, not the namespace.
	treeRow, treeRowBySeq string
}

// read returns the read q of the default tables for this chain's tables.
func (c *chainSQL) read(q string) string {
	if !c.shared {
		return q
	}
	return sharedRead(q)
}

var (
	defaultSQL = newChainSQL(false)
	sharedSQL  = newChainSQL(true)
)

func newChainSQL(shared bool) *chainSQL {
	c := &chainSQL{shared: shared}
	for _, r := range []struct {
		dst *string
		q   string
	}{
		{&c.head, sqlHead}, {&c.receiptBySeq, sqlReceiptBySeq}, {&c.lastRecordedAt, sqlLastRecordedAt},
		{&c.recordedHead, sqlRecordedHead}, {&c.keyTTL, sqlKeyTTL}, {&c.policySeq, sqlPolicySeq},
		{&c.recordedAtOf, sqlRecordedAtOf}, {&c.askInput, sqlAskInput}, {&c.tokensAfter, sqlTokensAfter},
		{&c.firstFields, sqlFirstFields}, {&c.scanBySeq, sqlScanBySeq}, {&c.scanBySeqRange, sqlScanBySeqRange},
		{&c.scanByKey, sqlScanByKey}, {&c.scanByKeyAfter, sqlScanByKeyAfter},
		{&c.duplicateSuccesses, sqlDuplicateSuccesses}, {&c.repeatedFailures, sqlRepeatedFailures},
		{&c.openKeysAfter, sqlOpenKeysAfter}, {&c.keyReceipts, sqlKeyReceipts}, {&c.stateKey, sqlStateKey},
		{&c.receiptHashes, sqlReceiptHashes},
		{&c.latestCheckpoint, sqlLatestCheckpoint}, {&c.checkpointAt, sqlCheckpointAt},
		{&c.checkpointCover, sqlCheckpointCover}, {&c.maxCheckpoint, sqlMaxCheckpoint}, {&c.hashAt, sqlHashAt},
		{&c.nonIntegerSeqBySeq, sqlNonIntegerSeqBySeq}, {&c.nonIntegerSeqByKey, sqlNonIntegerSeqByKey},
	} {
		*r.dst = c.read(r.q)
	}
	if !shared {
		c.treeHash, c.treeCount = sqlTreeHash, sqlTreeCount
		c.insertReceipt, c.insertToken = sqlInsertReceipt, sqlInsertToken
		c.putAskInput, c.askInputDeadline, c.purgeAskInputs = sqlPutAskInput, sqlAskInputDeadline, sqlPurgeAskInputs
		c.insertStateKey, c.insertCheckpoint, c.repairHead = sqlInsertStateKey, sqlInsertCheckpoint, sqlRepairHead
		for k := range c.treeInsert {
			c.treeInsert[k] = sqlInsertTreeHashes(1 << k)
		}
		return c
	}
	c.insertReceipt = `INSERT INTO ns_receipts (ns, ` + receiptColumns + `)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	// A namespace's tree hashes and token hashes are keyed by the row of
	// their receipt, so that they are appended at the end of their tables
	// like the receipt, not in the middle of a (ns, …) key: each
	// namespace of a group would otherwise dirty its own leaf page of
	// each table in the transaction, and a COMMIT writes dirty pages
	// whole. One row holds the stored hashes that the leaf's append adds
	// (sumdb.StoredHashIndex(0, n) on), in order.
	c.treeHash = `SELECT t.hashes FROM ns_receipts AS r JOIN ns_tree AS t ON t.rid = r.rowid WHERE r.ns = ? AND r.seq = ?`
	c.treeCount = `SELECT r.seq FROM ns_receipts AS r WHERE r.ns = ? AND EXISTS (SELECT 1 FROM ns_tree AS t WHERE t.rid = r.rowid)
		ORDER BY r.seq DESC LIMIT 1`
	c.treeRow = `INSERT INTO ns_tree (rid, hashes) VALUES (?, ?)`
	c.treeRowBySeq = `INSERT INTO ns_tree (rid, hashes) SELECT rowid, ?3 FROM ns_receipts WHERE ns = ?1 AND seq = ?2`
	c.insertToken = `INSERT OR REPLACE INTO ns_tokens (rid, token_hash) VALUES (?, ?)`
	c.putAskInput = `INSERT OR REPLACE INTO ns_approval_inputs (ns, ask_seq, input, delete_after) VALUES (?, ?, ?, ?)`
	c.askInputDeadline = `UPDATE ns_approval_inputs SET delete_after = ?2 WHERE ns = ?1 AND ask_seq = ?3`
	c.purgeAskInputs = `DELETE FROM ns_approval_inputs WHERE ns = ? AND delete_after < ?`
	c.insertStateKey = `INSERT OR IGNORE INTO ns_state_key (ns, key) VALUES (?, ?)`
	c.insertCheckpoint = `INSERT INTO ns_checkpoints (ns, size, root, note, signed_at) VALUES (?, ?, ?, ?, ?)`
	c.repairHead = `INSERT OR REPLACE INTO ns_head (ns, seq, hash) VALUES (?, ?, ?)`
	return c
}

// chainRef is the tables of one chain: a chainSQL and, for the shared
// tables, the namespace's id.
type chainRef struct {
	q  *chainSQL
	id int64
}

// args returns a statement's arguments for the chain: the namespace's id
// first when the tables are shared.
func (c chainRef) args(a ...any) []any {
	if !c.q.shared {
		return a
	}
	return append([]any{c.id}, a...)
}

// scanArgs is args for the integer arguments of a scan (cscan.go).
func (c chainRef) scanArgs(a ...uint64) []uint64 {
	if !c.q.shared {
		return a
	}
	return append([]uint64{uint64(c.id)}, a...)
}

// treeLoc returns the arguments with which c.q.treeHash reads stored tree
// hash x, and where x is in the value read: -1 for the whole value (the
// default tables, a row per hash); for the shared tables, the index of x
// among the hashes that its leaf's append stored.
func (c chainRef) treeLoc(x int64) ([]any, int) {
	if !c.q.shared {
		return []any{x}, -1
	}
	level, k := sumdb.SplitStoredHashIndex(x)
	n := (k+1)<<level - 1 // the leaf whose append completed (level, k)
	return []any{c.id, n + 1}, int(x - sumdb.StoredHashIndex(0, n))
}

// treeHashIn cuts stored tree hash x out of b, read with treeLoc's
// arguments (at position off).
func treeHashIn(b []byte, off int, x int64) ([]byte, error) {
	if off < 0 {
		return b, nil
	}
	if len(b) < (off+1)*32 {
		return nil, fmt.Errorf("tree hash %d: its leaf's row has %d bytes", x, len(b))
	}
	return b[off*32 : (off+1)*32], nil
}
