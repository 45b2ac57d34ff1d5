package sqlite

import (
	"fmt"

	sumdb "golang.org/x/mod/sumdb/tlog"
)

// Every namespace of a ledger lives in the same tables of the ledger file
// (schema.sql), default as namespace 0. The statements of a chain are
// written here once: each takes the namespace's id as parameter ?1 and its
// own parameters after it (chainRef.args), except the inserts into ns_tree
// and ns_tokens, whose rows are keyed by the rowid of their receipt. The
// audit's longer statements read the chain through a table expression,
// chain, that SQLite flattens into them, so a lookup by seq is one search
// of the (ns, seq) index.

const (
	receiptColumns = `seq, kind, idempotency_key, key_generated, execution_id, attempt, tool,
		effect, idempotent, input_hash, outcome, external_ref, result, error_code, error_message,
		retryable, lease_expires_at, ref_seq, actor, note, recorded_at, prev_hash, hash`

	// withChain names the namespace's receipts chain in the statement it
	// starts.
	withChain = `WITH chain AS NOT MATERIALIZED (SELECT * FROM ns_receipts WHERE ns = ?1)`

	// The chain's tail: its highest integer seq (a seq edited into text
	// sorts after every integer; the verifier reports that row).
	sqlHead = `SELECT seq, hash FROM ns_receipts WHERE ns = ?1 AND typeof(seq) = 'integer' ORDER BY seq DESC LIMIT 1`
	// The head recorded with the last append.
	sqlRecordedHead = `SELECT seq, hash FROM ns_head WHERE ns = ?1`
	sqlRepairHead   = `INSERT OR REPLACE INTO ns_head (ns, seq, hash) VALUES (?1, ?2, ?3)`
	sqlNewHead      = `INSERT INTO ns_head (ns, seq, hash) VALUES (?1, 0, zeroblob(32))`
	// headMissingAbort is the message of the linking trigger (schema.sql)
	// when the head row is gone.
	headMissingAbort = "the head row is missing"
	// The newest recorded_at of the chain (0 for an empty chain, or for a
	// value that is not an unsigned integer: an edited file, which the
	// verifier reports).
	sqlLastRecordedAt = `SELECT CASE WHEN typeof(recorded_at) = 'integer' AND recorded_at >= 0
		THEN recorded_at ELSE 0 END FROM ns_receipts WHERE ns = ?1 ORDER BY seq DESC LIMIT 1`
	sqlKeyTTL      = `SELECT key_ttl_ms FROM ns_settings WHERE ns = ?1`
	sqlNewSettings = `INSERT INTO ns_settings (ns, key_ttl_ms, payloads) VALUES (?1, ?2, ?3)`
	sqlSettings    = `SELECT key_ttl_ms, payloads FROM ns_settings WHERE ns = ?1`

	// The values of committed payload fields (SPEC §14), keyed by the row
	// of their receipt.
	sqlInsertPayloads = `INSERT INTO ns_payloads (rid, external_ref, external_ref_salt, result, result_salt,
		error_message, error_message_salt, note, note_salt) VALUES `
	payloadColumns = `p.external_ref, p.external_ref_salt, p.external_ref_erased, p.result, p.result_salt, p.result_erased,
		p.error_message, p.error_message_salt, p.error_message_erased, p.note, p.note_salt, p.note_erased`
	sqlOpening = `SELECT ` + payloadColumns + ` FROM ns_receipts AS r JOIN ns_payloads AS p ON p.rid = r.rowid
		WHERE r.ns = ?1 AND r.seq = ?2`
	sqlPayloadRows = `SELECT r.seq, ` + payloadColumns + ` FROM ns_receipts AS r JOIN ns_payloads AS p ON p.rid = r.rowid
		WHERE r.ns = ?1 AND r.seq > ?2 AND typeof(r.seq) = 'integer' ORDER BY r.seq` // a malformed seq is the chain pass's to report
	sqlPending       = `SELECT erase_seq, fields, actor FROM ns_pending_erasures WHERE ns = ?1 AND key = ?2 AND first_seq = ?3`
	sqlInsertErasure = `INSERT INTO ns_erasures (ns, seq, salt, ranges) VALUES (?1, ?2, ?3, ?4)`
	sqlErasure       = `SELECT salt, ranges, purged_at FROM ns_erasures WHERE ns = ?1 AND seq = ?2`
	sqlErasures      = `SELECT seq, salt, ranges, purged_at FROM ns_erasures WHERE ns = ?1 ORDER BY seq`

	sqlInsertErasureSubject = `INSERT OR IGNORE INTO ns_erasure_subjects (ns, seq, mac) VALUES (?1, ?2, ?3)`
	sqlErasureSubjects      = `SELECT seq, mac FROM ns_erasure_subjects WHERE ns = ?1 AND seq = ?2 ORDER BY mac`
	sqlAllErasureSubjects   = `SELECT seq, mac FROM ns_erasure_subjects WHERE ns = ?1 ORDER BY seq, mac`
	sqlAllPending           = `SELECT key, first_seq, erase_seq, fields, actor FROM ns_pending_erasures WHERE ns = ?1 ORDER BY key, first_seq`
	// The bytes of the values kept (ledger_payload_bytes): a TEXT value's
	// length() counts characters, its cast to BLOB's counts UTF-8 bytes.
	sqlPayloadBytes = `SELECT coalesce(sum(coalesce(length(CAST(p.external_ref AS BLOB)), 0)
		+ coalesce(length(CAST(p.result AS BLOB)), 0) + coalesce(length(CAST(p.error_message AS BLOB)), 0)
		+ coalesce(length(CAST(p.note AS BLOB)), 0)), 0)
		FROM ns_receipts AS r JOIN ns_payloads AS p ON p.rid = r.rowid WHERE r.ns = ?1`

	sqlInsertReceipt = `INSERT INTO ns_receipts (ns, ` + receiptColumns + `)
		VALUES (?1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	sqlReceiptBySeq = `SELECT ` + receiptColumns + ` FROM ns_receipts WHERE ns = ?1 AND seq = ?2`
	sqlFirstFields  = `SELECT tool, effect, input_hash FROM ns_receipts WHERE ns = ?1 AND seq = ?2`
	sqlRecordedAtOf = `SELECT recorded_at FROM ns_receipts WHERE ns = ?1 AND seq = ?2`
	sqlHashAt       = `SELECT hash FROM ns_receipts WHERE ns = ?1 AND seq = ?2`
	// One key's receipts: a scan of the chain (the file has no index by
	// key; its writes only append).
	sqlKeyReceipts = `SELECT ` + receiptColumns + ` FROM ns_receipts WHERE ns = ?1 AND idempotency_key = ?2 ORDER BY seq`
	sqlPolicySeq   = `SELECT coalesce(max(seq), 0) FROM ns_receipts WHERE ns = ?1 AND kind = 'policy'`
	// What changes whether a key is open, in seq order (openkeys.go).
	sqlOpenKeysAfter = `SELECT seq, kind, idempotency_key, idempotent, lease_expires_at, recorded_at
		FROM ns_receipts WHERE ns = ?1 AND seq > ?2 AND kind IN ('reserve', 'commit', 'resolve', 'reconcile') ORDER BY seq`

	// A reserve's token hash, keyed by the row of the reserve appended in
	// the same batch (?1 is that rowid).
	sqlInsertToken = `INSERT OR REPLACE INTO ns_tokens (rid, token_hash) VALUES (?1, ?2)`
	sqlTokensAfter = `SELECT r.seq, t.token_hash FROM ns_receipts AS r JOIN ns_tokens AS t ON t.rid = r.rowid
		WHERE r.ns = ?1 AND r.seq > ?2 AND typeof(r.seq) = 'integer' ORDER BY r.seq` // a malformed seq is the chain pass's to report

	// The asked inputs kept off the chain (SPEC §13).
	sqlPutAskInput      = `INSERT OR REPLACE INTO ns_approval_inputs (ns, ask_seq, input, delete_after) VALUES (?1, ?2, ?3, ?4)`
	sqlAskInputDeadline = `UPDATE ns_approval_inputs SET delete_after = ?2 WHERE ns = ?1 AND ask_seq = ?3`
	sqlPurgeAskInputs   = `DELETE FROM ns_approval_inputs WHERE ns = ?1 AND delete_after < ?2`
	sqlAskInput         = `SELECT input FROM ns_approval_inputs WHERE ns = ?1 AND ask_seq = ?2 AND delete_after >= ?3`

	sqlStateKey       = `SELECT key FROM ns_state_key WHERE ns = ?1`
	sqlInsertStateKey = `INSERT OR IGNORE INTO ns_state_key (ns, key) VALUES (?1, ?2)`

	// The tree: a leaf's row holds the stored hashes its append added
	// (sumdb.StoredHashIndex(0, seq-1) on), keyed by its receipt's row.
	// sqlTreeSize is the tree's size in leaves: the last receipt with a row.
	sqlTreeHash = `SELECT t.hashes FROM ns_receipts AS r JOIN ns_tree AS t ON t.rid = r.rowid WHERE r.ns = ?1 AND r.seq = ?2`
	sqlTreeSize = `SELECT r.seq FROM ns_receipts AS r WHERE r.ns = ?1 AND EXISTS (SELECT 1 FROM ns_tree AS t WHERE t.rid = r.rowid)
		ORDER BY r.seq DESC LIMIT 1`
	sqlTreeRow       = `INSERT INTO ns_tree (rid, hashes) VALUES (?1, ?2)`
	sqlTreeRowBySeq  = `INSERT INTO ns_tree (rid, hashes) SELECT rowid, ?3 FROM ns_receipts WHERE ns = ?1 AND seq = ?2`
	sqlReceiptHashes = `SELECT seq, hash FROM ns_receipts WHERE ns = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3`

	sqlLatestCheckpoint = `SELECT size, root, note, signed_at FROM ns_checkpoints WHERE ns = ?1 ORDER BY size DESC LIMIT 1`
	sqlCheckpointAt     = `SELECT size, root, note, signed_at FROM ns_checkpoints WHERE ns = ?1 AND size = ?2`
	sqlCheckpointCover  = `SELECT size, root, note, signed_at FROM ns_checkpoints WHERE ns = ?1 AND size >= ?2 ORDER BY size DESC LIMIT 1`
	sqlCheckpointFirst  = `SELECT size, root, note, signed_at FROM ns_checkpoints WHERE ns = ?1 AND size >= ?2 ORDER BY size LIMIT 1`
	sqlInsertCheckpoint = `INSERT INTO ns_checkpoints (ns, size, root, note, signed_at) VALUES (?1, ?2, ?3, ?4, ?5)`
	sqlMaxCheckpoint    = `SELECT coalesce(max(size), 0) FROM ns_checkpoints WHERE ns = ?1`
)

// chainRef is the tables of one chain: the namespace's id in them.
type chainRef struct{ id int64 }

// defaultID is the id of the namespace default.
const defaultID = 0

// args returns a statement's arguments for the chain: the namespace's id
// first.
func (c chainRef) args(a ...any) []any { return append([]any{c.id}, a...) }

// scanArgs is args for the integer arguments of a scan (cscan.go).
func (c chainRef) scanArgs(a ...uint64) []uint64 { return append([]uint64{uint64(c.id)}, a...) }

// treeLoc returns the arguments with which sqlTreeHash reads stored tree
// hash x, and the index of x among the hashes its leaf's append stored.
func (c chainRef) treeLoc(x int64) ([]any, int) {
	level, k := sumdb.SplitStoredHashIndex(x)
	n := (k+1)<<level - 1 // the leaf whose append completed (level, k)
	return []any{c.id, n + 1}, int(x - sumdb.StoredHashIndex(0, n))
}

// treeHashIn cuts stored tree hash x out of b, read with treeLoc's
// arguments (at position off).
func treeHashIn(b []byte, off int, x int64) ([]byte, error) {
	if len(b) < (off+1)*32 {
		return nil, fmt.Errorf("tree hash %d: its leaf's row has %d bytes", x, len(b))
	}
	return b[off*32 : (off+1)*32], nil
}
