-- effect-ledger schema, version 6 (PRAGMA user_version = 6).
--
-- These are the tables of the namespace default. The other namespaces of
-- the ledger live in the same file, in shared tables with the same columns
-- plus ns, the namespace's id in the registry (ns_receipts, ns_head, …:
-- storage/sqlite/tables.go, made with the registry when ledgerd opens the
-- file). Version 6 added them; version 5 kept each namespace in a file of
-- its own.
--
-- receipts is the ledger: one row per receipt, one column per field of
-- SPEC §2 with the same name and type, plus prev_hash and hash. It is
-- append-only: the triggers below reject UPDATE and DELETE, and a linking
-- trigger lets a row in only when it extends the head (seq = head + 1,
-- prev_hash = the head's hash), which rules out forks without the two
-- random-position UNIQUE indexes of version 1. Anyone with sqlite3 and
-- SHA-256 can recompute the chain from this table alone.
--
-- A write transaction only appends: a receipts row (seq is the rowid, so
-- the row goes at the end of the table), the head row it moves, tree
-- hashes, and for a reserve its token hash. Nothing is written at a
-- random position. The state of each idempotency key and the lookups by
-- key, execution, tool and kind live in the key index beside the file
-- (<ledger file>.idx/, a Pebble LSM for every namespace of the ledger),
-- which ledgerd derives from these tables after each COMMIT and checks
-- against the chain on open (replaying what it lacks, rebuilding it when
-- it is missing or foreign; `ledgerctl rebuild-index`). Version 3 kept
-- that state here, in a keys table and four indexes on receipts.
--
-- head holds the chain head as of the last append: it moves in the same
-- transaction as every receipt (by trigger). On open, ledgerd compares it
-- with the receipts' actual tail: a difference (a tail removed by a bad
-- restore or by hand) stops it until `ledgerctl rebuild-index` has
-- recomputed the derived state.

PRAGMA application_id = 1701209452; -- 0x6566656C

CREATE TABLE receipts (
	seq              INTEGER PRIMARY KEY CHECK (seq >= 1),
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
	hash             BLOB    NOT NULL CHECK (length(hash) = 32)
);

CREATE TABLE head (
	id   INTEGER PRIMARY KEY CHECK (id = 1),
	seq  INTEGER NOT NULL,
	hash BLOB    NOT NULL CHECK (length(hash) = 32)
);
INSERT INTO head (id, seq, hash) VALUES (1, 0, zeroblob(32));

CREATE TRIGGER receipts_no_update BEFORE UPDATE ON receipts
BEGIN
	SELECT RAISE(ABORT, 'receipts are append-only');
END;

CREATE TRIGGER receipts_no_delete BEFORE DELETE ON receipts
BEGIN
	SELECT RAISE(ABORT, 'receipts are append-only');
END;

CREATE TRIGGER receipts_link BEFORE INSERT ON receipts
BEGIN
	SELECT RAISE(ABORT, 'a receipt must extend the head: seq = head seq + 1, prev_hash = head hash')
	FROM head
	WHERE id = 1 AND (NEW.seq IS NOT seq + 1 OR NEW.prev_hash IS NOT hash);
	SELECT RAISE(ABORT, 'the head row is missing') WHERE NOT EXISTS (SELECT 1 FROM head WHERE id = 1);
END;

CREATE TRIGGER receipts_advance_head AFTER INSERT ON receipts
BEGIN
	UPDATE head SET seq = NEW.seq, hash = NEW.hash WHERE id = 1;
END;

-- The gate's policy in force is the latest policy receipt (SPEC §13): this
-- small partial index finds it at open without reading the chain.
CREATE INDEX receipts_policy ON receipts (seq) WHERE kind = 'policy';

-- The input of each ask (SPEC §13), kept off the chain for the approvers
-- and deleted after delete_after (unix ms): the ask's expiry, or its
-- answer, plus the operator's retention. Never part of the chain.
CREATE TABLE approval_inputs (
	ask_seq      INTEGER PRIMARY KEY,
	input        TEXT    NOT NULL,
	delete_after INTEGER NOT NULL
);

-- The namespace's secret, 32 random bytes made on first use: the MCP
-- gateways derive the key of their requestState envelopes from it (SPEC
-- §11.1). Never part of the chain, never changed.
CREATE TABLE state_key (
	id  INTEGER PRIMARY KEY CHECK (id = 1),
	key BLOB    NOT NULL CHECK (length(key) = 32)
);

-- The SHA-256 of each reservation's token, by the reserve's seq: the
-- one part of a key's state the receipts cannot give back (tokens are
-- secrets and never enter a receipt), kept so that the key index can be
-- rebuilt with open reservations still committable. Rows are appended in
-- seq order; never part of the chain.
CREATE TABLE reserve_tokens (
	seq        INTEGER PRIMARY KEY,
	token_hash BLOB    NOT NULL CHECK (length(token_hash) = 32)
);

-- Settings fixed when the file was created (one row, never changed):
-- key_ttl_ms is how long a finalized idempotency key is remembered before
-- a reserve starts a new generation of it (SPEC §12; 0: forever). The
-- verifier reads it from here. Version 2 files get the row 0 when they are
-- migrated.
CREATE TABLE settings (
	id         INTEGER PRIMARY KEY CHECK (id = 1),
	key_ttl_ms INTEGER NOT NULL CHECK (key_ttl_ms >= 0)
);

CREATE TRIGGER settings_fixed BEFORE UPDATE ON settings
BEGIN
	SELECT RAISE(ABORT, 'the settings of a ledger are fixed at creation');
END;

CREATE TRIGGER settings_kept BEFORE DELETE ON settings
BEGIN
	SELECT RAISE(ABORT, 'the settings of a ledger are fixed at creation');
END;

-- API bearer tokens (not part of the chain). A token is shown once, at
-- creation; only its SHA-256 is kept. token_id is the public part of the
-- token used to find its row; the whole token's hash is then compared in
-- constant time.
CREATE TABLE IF NOT EXISTS tokens (
	name       TEXT    PRIMARY KEY,
	role       TEXT    NOT NULL CHECK (role IN ('reader', 'writer', 'admin', 'approver')),
	token_id   TEXT    NOT NULL UNIQUE,
	token_hash BLOB    NOT NULL,
	created_at INTEGER NOT NULL, -- unix ms
	revoked_at INTEGER NOT NULL DEFAULT 0 -- unix ms, 0 while valid
);

-- The readiness probe writes here after a failed write transaction, to see
-- whether the disk takes a write of real size again (never part of the
-- chain).
CREATE TABLE ready_probe (
	id  INTEGER PRIMARY KEY CHECK (id = 1),
	pad BLOB    NOT NULL
);

PRAGMA user_version = 6;
