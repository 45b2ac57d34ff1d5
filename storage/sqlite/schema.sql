-- effect-ledger schema, version 8 (PRAGMA user_version = 8).
--
-- One layout for every namespace of a ledger. Each namespace has an id:
-- default is 0, every other one the id the registry (namespaces) gave it
-- when it was created, never used again. Every table of a chain has the
-- namespace's id as its column ns, or is keyed by the row of a receipt.
--
-- ns_receipts is the ledger: one row per receipt, the namespace's id and
-- then one column per field of SPEC §2 with the same name and type, plus
-- prev_hash and hash. It is append-only: triggers reject UPDATE, and
-- DELETE while the namespace is registered — but of a receipt a prune
-- covers whose chain hash ns_kept holds (SPEC §16: its body goes, its
-- hash stays; the view then starts after the pruned prefix, its first
-- prev_hash the kept hash of the last deleted receipt) —, and a linking trigger lets a
-- row in only when it extends its namespace's head (seq = head + 1,
-- prev_hash = the head's hash), which rules out forks. The view receipts
-- is the default namespace's chain with exactly the columns of SPEC §2:
-- anyone with sqlite3 and SHA-256 can recompute the chain from it, and any
-- other namespace's from (the namespace's id, then the same columns)
--   SELECT * FROM ns_receipts WHERE ns = (SELECT id FROM namespaces WHERE name = 'NAME') ORDER BY seq
--
-- A write transaction only appends: receipts rows, the head rows they
-- move (by trigger), a row of tree hashes per receipt and, for a reserve,
-- its token hash. The tree and token rows are keyed by the rowid of their
-- receipt, so they go at the end of their tables like the receipts, not in
-- the middle of a (ns, …) key: a transaction that commits the batches of
-- many namespaces dirties no page per namespace. The state of each
-- idempotency key and the lookups by key, execution, tool and kind live in
-- the key index beside the file (<ledger file>.idx/, a Pebble LSM), which
-- ledgerd derives from these tables after each COMMIT and checks against
-- the chain on open (replaying what it lacks, rebuilding it when it is
-- missing or foreign; `ledgerctl rebuild-index`).
--
-- ns_head holds each chain's head as of its last append: it moves in the
-- same transaction as every receipt (by trigger). On open, ledgerd compares
-- it with the receipts' actual tail: a difference (a tail removed by a bad
-- restore or by hand) stops it until `ledgerctl rebuild-index` has
-- recomputed the derived state.

PRAGMA application_id = 1701209452; -- 0x6566656C

-- The registry of the namespaces other than default. ids come from
-- namespace_ids (AUTOINCREMENT: never used twice, even after a namespace
-- is forgotten). head_seq and head_hash are the heads recorded for the
-- namespace files of ledgers made before version 6, checked when such a
-- file is moved in. namespace_events records each namespace forgotten.
CREATE TABLE namespaces (
	name       TEXT    PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64 AND name NOT GLOB '*[^a-z0-9._-]*'),
	created_at INTEGER NOT NULL, -- unix ms
	head_seq   INTEGER NOT NULL DEFAULT 0,
	head_hash  BLOB,
	id         INTEGER
) WITHOUT ROWID;
CREATE UNIQUE INDEX namespaces_by_id ON namespaces (id);
CREATE TABLE namespace_ids (
	id   INTEGER PRIMARY KEY AUTOINCREMENT,
	name TEXT    NOT NULL
);
CREATE TABLE namespace_events (
	id         INTEGER PRIMARY KEY,
	name       TEXT    NOT NULL,
	action     TEXT    NOT NULL CHECK (action IN ('forget')),
	decided_by TEXT    NOT NULL,
	reason     TEXT    NOT NULL,
	at         INTEGER NOT NULL, -- unix ms
	head_seq   INTEGER NOT NULL, -- the namespace's head when it was forgotten
	head_hash  BLOB,
	moved_to   TEXT    NOT NULL  -- the file its receipts were copied to, or ''
);

CREATE TABLE ns_receipts (
	ns               INTEGER NOT NULL,
	seq              INTEGER NOT NULL CHECK (seq >= 1),
	kind             TEXT    NOT NULL CHECK (kind IN ('reserve', 'commit', 'replay', 'resolve', 'policy', 'ask', 'approval', 'deny',
	                                          'key', 'erase', 'reconcile', 'prune')),
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
-- The gate's policy in force is the latest policy receipt (SPEC §13): this
-- small partial index finds it at open without reading the chain.
CREATE INDEX ns_receipts_policy ON ns_receipts (ns, seq) WHERE kind = 'policy';

CREATE VIEW receipts AS SELECT seq, kind, idempotency_key, key_generated, execution_id, attempt, tool,
	effect, idempotent, input_hash, outcome, external_ref, result, error_code, error_message,
	retryable, lease_expires_at, ref_seq, actor, note, recorded_at, prev_hash, hash
FROM ns_receipts WHERE ns = 0;

CREATE TABLE ns_head (
	ns   INTEGER PRIMARY KEY,
	seq  INTEGER NOT NULL,
	hash BLOB    NOT NULL CHECK (length(hash) = 32)
);
INSERT INTO ns_head (ns, seq, hash) VALUES (0, 0, zeroblob(32));

-- A namespace's rows may go only once it is no longer registered
-- (`ledgerctl namespace forget`, which copies them to a file of their own
-- first); default's never.
CREATE TRIGGER ns_receipts_no_update BEFORE UPDATE ON ns_receipts
BEGIN SELECT RAISE(ABORT, 'receipts are append-only'); END;
-- A pruned receipt (SPEC §16) may go too, once its hash is kept: a prune
-- covers its seq and its kept tile (ns_kept) holds its hash.
CREATE TRIGGER ns_receipts_no_delete BEFORE DELETE ON ns_receipts
WHEN (OLD.ns = 0 OR EXISTS (SELECT 1 FROM namespaces WHERE id = OLD.ns))
 AND NOT (EXISTS (SELECT 1 FROM ns_prunes AS p WHERE p.ns = OLD.ns AND OLD.seq BETWEEN p.from_seq AND p.through)
      AND EXISTS (SELECT 1 FROM ns_kept AS k WHERE k.ns = OLD.ns AND k.tile = (OLD.seq - 1) / 256
                  AND substr(k.hashes, ((OLD.seq - 1) % 256) * 32 + 1, 32) = OLD.hash))
BEGIN SELECT RAISE(ABORT, 'receipts are append-only; only a pruned receipt whose hash is kept may go'); END;
CREATE TRIGGER ns_receipts_link BEFORE INSERT ON ns_receipts
BEGIN
	SELECT RAISE(ABORT, 'a receipt must extend the head: seq = head seq + 1, prev_hash = head hash')
	FROM ns_head
	WHERE ns = NEW.ns AND (NEW.seq IS NOT seq + 1 OR NEW.prev_hash IS NOT hash);
	SELECT RAISE(ABORT, 'the head row is missing') WHERE NOT EXISTS (SELECT 1 FROM ns_head WHERE ns = NEW.ns);
END;
CREATE TRIGGER ns_receipts_advance_head AFTER INSERT ON ns_receipts
BEGIN
	UPDATE ns_head SET seq = NEW.seq, hash = NEW.hash WHERE ns = NEW.ns;
END;
CREATE TRIGGER ns_head_kept BEFORE DELETE ON ns_head
WHEN OLD.ns = 0 OR EXISTS (SELECT 1 FROM namespaces WHERE id = OLD.ns)
BEGIN SELECT RAISE(ABORT, 'the head rows of the ledger are never removed'); END;

-- The RFC 6962 tree over each chain's hashes (SPEC §9), one row per
-- receipt: the stored hashes (golang.org/x/mod/sumdb/tlog's layout) that
-- appending its leaf adds, from sumdb.StoredHashIndex(0, seq-1) on, in
-- order. Written in the same transaction as the receipt, so the tree always
-- has exactly the chain's receipts.
CREATE TABLE ns_tree (
	rid    INTEGER PRIMARY KEY, -- the rowid of the receipt in ns_receipts
	hashes BLOB    NOT NULL CHECK (length(hashes) > 0 AND length(hashes) % 32 = 0)
);
CREATE TRIGGER ns_tree_no_update BEFORE UPDATE ON ns_tree
BEGIN SELECT RAISE(ABORT, 'tree hashes are append-only'); END;
CREATE TRIGGER ns_tree_no_delete BEFORE DELETE ON ns_tree
WHEN EXISTS (SELECT 1 FROM ns_receipts AS r WHERE r.rowid = OLD.rid AND (r.ns = 0 OR EXISTS (SELECT 1 FROM namespaces WHERE id = r.ns)))
BEGIN SELECT RAISE(ABORT, 'tree hashes are append-only'); END;

-- Each signed checkpoint, stored before it is served; append-only.
CREATE TABLE ns_checkpoints (
	ns        INTEGER NOT NULL,
	size      INTEGER NOT NULL CHECK (size >= 1),
	root      BLOB    NOT NULL CHECK (length(root) = 32),
	note      TEXT    NOT NULL, -- the signed note, as served
	signed_at INTEGER NOT NULL, -- unix ms
	PRIMARY KEY (ns, size)
);
CREATE TRIGGER ns_checkpoints_no_update BEFORE UPDATE ON ns_checkpoints
BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only'); END;
-- A prune (SPEC §16) thins the checkpoints its range covers.
CREATE TRIGGER ns_checkpoints_no_delete BEFORE DELETE ON ns_checkpoints
WHEN (OLD.ns = 0 OR EXISTS (SELECT 1 FROM namespaces WHERE id = OLD.ns))
 AND NOT EXISTS (SELECT 1 FROM ns_prunes AS p WHERE p.ns = OLD.ns AND OLD.size <= p.through)
BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only; only those a prune covers may be thinned'); END;
CREATE TRIGGER ns_checkpoints_grow BEFORE INSERT ON ns_checkpoints
BEGIN
	SELECT RAISE(ABORT, 'a checkpoint must be larger than the last one')
	WHERE NEW.size <= (SELECT coalesce(max(size), 0) FROM ns_checkpoints WHERE ns = NEW.ns);
END;

-- The SHA-256 of each reservation's token, by the row of its reserve: the
-- one part of a key's state the receipts cannot give back (tokens are
-- secrets and never enter a receipt), kept so that the key index can be
-- rebuilt with open reservations still committable. Never part of the
-- chain.
CREATE TABLE ns_tokens (
	rid        INTEGER PRIMARY KEY, -- the rowid of the reserve in ns_receipts
	token_hash BLOB    NOT NULL CHECK (length(token_hash) = 32)
);

-- Settings fixed when the namespace was created (one row each, never
-- changed): key_ttl_ms is how long a finalized idempotency key is
-- remembered before a reserve starts a new generation of it (SPEC §12; 0:
-- forever); payloads is how the payload fields are kept (SPEC §14:
-- 'inline' in the receipts, or 'committed': the receipts hold salted
-- commitments and ns_payloads the values). The verifier reads them from
-- here. Namespaces made before version 8 are inline.
CREATE TABLE ns_settings (
	ns         INTEGER PRIMARY KEY,
	key_ttl_ms INTEGER NOT NULL CHECK (key_ttl_ms >= 0),
	payloads   TEXT    NOT NULL DEFAULT 'inline'
);
CREATE TRIGGER ns_settings_fixed BEFORE UPDATE ON ns_settings
BEGIN SELECT RAISE(ABORT, 'the settings of a ledger are fixed at creation'); END;
CREATE TRIGGER ns_settings_kept BEFORE DELETE ON ns_settings
WHEN OLD.ns = 0 OR EXISTS (SELECT 1 FROM namespaces WHERE id = OLD.ns)
BEGIN SELECT RAISE(ABORT, 'the settings of a ledger are fixed at creation'); END;

-- The values of the committed payload fields of a receipt (SPEC §14), with
-- their salts, keyed by the rowid of the receipt (appended at the end of the
-- table, like ns_tree): the receipt's field holds 'pc1:' and the hex of
-- SHA-256('effect-receipt-ledger/payload/v1' ‖ field number ‖ salt ‖
-- value). A value is only ever erased: set to NULL with its salt, its
-- *_erased column then naming the erase receipt. Never part of the chain.
CREATE TABLE ns_payloads (
	rid                  INTEGER PRIMARY KEY, -- the rowid of the receipt in ns_receipts
	external_ref         TEXT,
	external_ref_salt    BLOB CHECK (external_ref_salt IS NULL OR length(external_ref_salt) = 16),
	external_ref_erased  INTEGER NOT NULL DEFAULT 0,
	result               TEXT,
	result_salt          BLOB CHECK (result_salt IS NULL OR length(result_salt) = 16),
	result_erased        INTEGER NOT NULL DEFAULT 0,
	error_message        TEXT,
	error_message_salt   BLOB CHECK (error_message_salt IS NULL OR length(error_message_salt) = 16),
	error_message_erased INTEGER NOT NULL DEFAULT 0,
	note                 TEXT,
	note_salt            BLOB CHECK (note_salt IS NULL OR length(note_salt) = 16),
	note_erased          INTEGER NOT NULL DEFAULT 0,
	CHECK ((external_ref IS NULL) = (external_ref_salt IS NULL) AND (result IS NULL) = (result_salt IS NULL)
		AND (error_message IS NULL) = (error_message_salt IS NULL) AND (note IS NULL) = (note_salt IS NULL))
);
CREATE TRIGGER ns_payloads_erase_only BEFORE UPDATE ON ns_payloads
WHEN NEW.rid IS NOT OLD.rid
	OR (NEW.external_ref IS NOT OLD.external_ref AND NOT (NEW.external_ref IS NULL AND OLD.external_ref_erased = 0 AND NEW.external_ref_erased > 0))
	OR (NEW.result IS NOT OLD.result AND NOT (NEW.result IS NULL AND OLD.result_erased = 0 AND NEW.result_erased > 0))
	OR (NEW.error_message IS NOT OLD.error_message AND NOT (NEW.error_message IS NULL AND OLD.error_message_erased = 0 AND NEW.error_message_erased > 0))
	OR (NEW.note IS NOT OLD.note AND NOT (NEW.note IS NULL AND OLD.note_erased = 0 AND NEW.note_erased > 0))
	OR (NEW.external_ref_erased IS NOT OLD.external_ref_erased AND NEW.external_ref IS NOT NULL)
	OR (NEW.result_erased IS NOT OLD.result_erased AND NEW.result IS NOT NULL)
	OR (NEW.error_message_erased IS NOT OLD.error_message_erased AND NEW.error_message IS NOT NULL)
	OR (NEW.note_erased IS NOT OLD.note_erased AND NEW.note IS NOT NULL)
BEGIN SELECT RAISE(ABORT, 'a kept value can only be erased'); END;
CREATE TRIGGER ns_payloads_no_delete BEFORE DELETE ON ns_payloads
WHEN EXISTS (SELECT 1 FROM ns_receipts AS r WHERE r.rowid = OLD.rid AND (r.ns = 0 OR EXISTS (SELECT 1 FROM namespaces WHERE id = r.ns)))
BEGIN SELECT RAISE(ABORT, 'a kept value can only be erased'); END;

-- One row per erase receipt (SPEC §14): the opening of its set, the erased
-- ranges of seqs ([[from,to],…] in RFC 8785 form) and their salt, so that
-- the chain does not publish which receipts belonged to one person. Never
-- erased; read by admins and the verifier. purged_at is when the file and
-- its write-ahead log were rid of the erased values (0: not yet).
CREATE TABLE ns_erasures (
	ns        INTEGER NOT NULL,
	seq       INTEGER NOT NULL,
	salt      BLOB    NOT NULL CHECK (length(salt) = 16),
	ranges    TEXT    NOT NULL,
	purged_at INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (ns, seq)
) WITHOUT ROWID;
CREATE TRIGGER ns_erasures_kept BEFORE DELETE ON ns_erasures
WHEN OLD.ns = 0 OR EXISTS (SELECT 1 FROM namespaces WHERE id = OLD.ns)
BEGIN SELECT RAISE(ABORT, 'erasures are kept'); END;
CREATE TRIGGER ns_erasures_fixed BEFORE UPDATE ON ns_erasures
WHEN NEW.ns IS NOT OLD.ns OR NEW.seq IS NOT OLD.seq OR NEW.salt IS NOT OLD.salt OR NEW.ranges IS NOT OLD.ranges
	OR OLD.purged_at != 0
BEGIN SELECT RAISE(ABORT, 'erasures are kept'); END;

-- The subjects an erase by subject was asked for (SPEC §14), as their MACs
-- (see ns_subjects), one row each, beside the erase's ns_erasures row and,
-- like it, never erased: ledgerctl erasures export lists them, so that a
-- backup restored from before the erase loses the subject's index rows too
-- (ledgerctl erase --replay). Read by admins only.
CREATE TABLE ns_erasure_subjects (
	ns  INTEGER NOT NULL,
	seq INTEGER NOT NULL,
	mac BLOB    NOT NULL CHECK (length(mac) = 32),
	PRIMARY KEY (ns, seq, mac)
) WITHOUT ROWID;
CREATE TRIGGER ns_erasure_subjects_kept BEFORE DELETE ON ns_erasure_subjects
WHEN OLD.ns = 0 OR EXISTS (SELECT 1 FROM namespaces WHERE id = OLD.ns)
BEGIN SELECT RAISE(ABORT, 'erasures are kept'); END;
CREATE TRIGGER ns_erasure_subjects_fixed BEFORE UPDATE ON ns_erasure_subjects
BEGIN SELECT RAISE(ABORT, 'erasures are kept'); END;

-- The subject index (SPEC §14): HMAC-SHA-256(the namespace's fingerprint
-- key, subject) → the key generations a reserve named it for (the reserve
-- that started each). Never part of the chain; rows go when the subject,
-- or the key, is erased.
CREATE TABLE ns_subjects (
	ns        INTEGER NOT NULL,
	mac       BLOB    NOT NULL CHECK (length(mac) = 32),
	key       TEXT    NOT NULL,
	first_seq INTEGER NOT NULL,
	PRIMARY KEY (ns, mac, key, first_seq)
) WITHOUT ROWID;
CREATE INDEX ns_subjects_by_key ON ns_subjects (ns, key);

-- Pending erasures (SPEC §14): a key generation an erase selected while it
-- was in flight. The receipt that finalizes it is followed, in its
-- transaction, by an erase covering it, and the mark goes.
CREATE TABLE ns_pending_erasures (
	ns        INTEGER NOT NULL,
	key       TEXT    NOT NULL,
	first_seq INTEGER NOT NULL,
	erase_seq INTEGER NOT NULL,
	fields    INTEGER NOT NULL,
	actor     TEXT    NOT NULL,
	PRIMARY KEY (ns, key, first_seq)
) WITHOUT ROWID;

-- The token hash of each reservation a reconcile finalized (SPEC §15), so
-- that the original call's late commit is appended even after the key was
-- reserved again. Never part of the chain.
CREATE TABLE ns_reconciled_tokens (
	ns          INTEGER NOT NULL,
	key         TEXT    NOT NULL,
	token_hash  BLOB    NOT NULL CHECK (length(token_hash) = 32),
	reserve_seq INTEGER NOT NULL,
	PRIMARY KEY (ns, key, token_hash)
) WITHOUT ROWID;

-- The input of each ask (SPEC §13), kept off the chain for the approvers
-- and deleted after delete_after (unix ms): the ask's expiry, or its
-- answer, plus the operator's retention. Never part of the chain.
CREATE TABLE ns_approval_inputs (
	ns           INTEGER NOT NULL,
	ask_seq      INTEGER NOT NULL,
	input        TEXT    NOT NULL,
	delete_after INTEGER NOT NULL,
	PRIMARY KEY (ns, ask_seq)
);

-- Bounded disk (SPEC §16). One row per prune receipt: its range, its
-- segment, and the deletion's progress (the bodies ≤ deleted_through are
-- gone). Rows are never removed while the namespace is registered; only
-- deleted_through moves, upward, to at most through.
CREATE TABLE ns_prunes (
	ns              INTEGER NOT NULL,
	seq             INTEGER NOT NULL,
	from_seq        INTEGER NOT NULL CHECK (from_seq >= 1),
	through         INTEGER NOT NULL CHECK (through >= from_seq AND through < seq),
	digest          TEXT    NOT NULL,
	segment         TEXT    NOT NULL,
	deleted_through INTEGER NOT NULL CHECK (deleted_through BETWEEN from_seq - 1 AND through),
	PRIMARY KEY (ns, seq)
) WITHOUT ROWID;
CREATE TRIGGER ns_prunes_progress BEFORE UPDATE ON ns_prunes
WHEN NEW.ns IS NOT OLD.ns OR NEW.seq IS NOT OLD.seq OR NEW.from_seq IS NOT OLD.from_seq OR NEW.through IS NOT OLD.through
  OR NEW.digest IS NOT OLD.digest OR NEW.segment IS NOT OLD.segment OR NEW.deleted_through < OLD.deleted_through
BEGIN SELECT RAISE(ABORT, 'a prune only records its deletion''s progress'); END;
CREATE TRIGGER ns_prunes_kept BEFORE DELETE ON ns_prunes
WHEN OLD.ns = 0 OR EXISTS (SELECT 1 FROM namespaces WHERE id = OLD.ns)
BEGIN SELECT RAISE(ABORT, 'prunes are kept'); END;

-- The chain hashes of pruned receipts, 256 to a row: receipt seq's is at
-- byte ((seq - 1) % 256) * 32 of tile (seq - 1) / 256. upper holds, once
-- the tile is full, the tree hashes of level 8 and above that its last
-- leaf completed (tlog.KeptUpperIndexes); those of levels 0–7 are
-- recomputed from the chain hashes. A row only grows.
CREATE TABLE ns_kept (
	ns     INTEGER NOT NULL,
	tile   INTEGER NOT NULL,
	hashes BLOB    NOT NULL CHECK (length(hashes) BETWEEN 32 AND 8192 AND length(hashes) % 32 = 0),
	upper  BLOB    NOT NULL DEFAULT x'' CHECK (length(upper) % 32 = 0),
	UNIQUE (ns, tile)
);
CREATE TRIGGER ns_kept_grows BEFORE UPDATE ON ns_kept
WHEN NEW.ns IS NOT OLD.ns OR NEW.tile IS NOT OLD.tile OR substr(NEW.hashes, 1, length(OLD.hashes)) IS NOT OLD.hashes
  OR (length(OLD.upper) > 0 AND NEW.upper IS NOT OLD.upper)
BEGIN SELECT RAISE(ABORT, 'kept hashes only grow'); END;
CREATE TRIGGER ns_kept_kept BEFORE DELETE ON ns_kept
WHEN OLD.ns = 0 OR EXISTS (SELECT 1 FROM namespaces WHERE id = OLD.ns)
BEGIN SELECT RAISE(ABORT, 'kept hashes are kept'); END;

-- The keys whose receipts were all pruned, as the first 8 bytes of a
-- keyed hash (never the key): a read of one answers 410 pruned. Never
-- part of the chain.
CREATE TABLE ns_pruned_keys (
	ns        INTEGER NOT NULL,
	h         INTEGER NOT NULL,
	prune_seq INTEGER NOT NULL,
	PRIMARY KEY (ns, h)
) WITHOUT ROWID;

-- The bodies of pruned key receipts (SPEC §9.2), as JSON: the chain's
-- active signing keys still need them. A reader rehashes each against
-- its kept hash.
CREATE TABLE ns_kept_receipts (
	ns   INTEGER NOT NULL,
	seq  INTEGER NOT NULL,
	body TEXT    NOT NULL,
	PRIMARY KEY (ns, seq)
) WITHOUT ROWID;

-- Each namespace's secret, 32 random bytes made on first use: the MCP
-- gateways derive the key of their requestState envelopes from it (SPEC
-- §11.1). Never part of the chain, never changed.
CREATE TABLE ns_state_key (
	ns  INTEGER PRIMARY KEY,
	key BLOB    NOT NULL CHECK (length(key) = 32)
);

-- API bearer tokens (not part of the chain). A token is shown once, at
-- creation; only its SHA-256 is kept. token_id is the public part of the
-- token used to find its row; the whole token's hash is then compared in
-- constant time. namespaces lists the namespaces the token may use,
-- separated by commas; '' is every namespace.
CREATE TABLE tokens (
	name       TEXT    PRIMARY KEY,
	role       TEXT    NOT NULL CHECK (role IN ('reader', 'writer', 'admin', 'approver')),
	token_id   TEXT    NOT NULL UNIQUE,
	token_hash BLOB    NOT NULL,
	created_at INTEGER NOT NULL, -- unix ms
	revoked_at INTEGER NOT NULL DEFAULT 0, -- unix ms, 0 while valid
	namespaces TEXT    NOT NULL DEFAULT ''
);

-- The readiness probe writes here after a failed write transaction, to see
-- whether the disk takes a write of real size again (never part of the
-- chain).
CREATE TABLE ready_probe (
	id  INTEGER PRIMARY KEY CHECK (id = 1),
	pad BLOB    NOT NULL
);

PRAGMA user_version = 8;
