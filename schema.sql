-- effect-ledger schema, version 3 (PRAGMA user_version = 3).
--
-- receipts is the ledger: one row per receipt, one column per field of
-- SPEC §2 with the same name and type, plus prev_hash and hash. It is
-- append-only: the triggers below reject UPDATE and DELETE, and a linking
-- trigger lets a row in only when it extends the head (seq = head + 1,
-- prev_hash = the head's hash), which rules out forks without the two
-- random-position UNIQUE indexes of version 1. Anyone with sqlite3 and
-- SHA-256 can recompute the chain from this table alone.
--
-- head holds the chain head as of the last append: it moves in the same
-- transaction as every receipt (by trigger) and so as every update of the
-- derived keys table. On open, ledgerd compares it with the receipts'
-- actual tail: a difference (a tail removed by a bad restore or by hand)
-- means the derived state cannot be trusted, and ledgerd refuses to start
-- until `ledgerctl rebuild-keys` has recomputed it.
--
-- keys is a derived table kept in the same transaction as every append, so
-- that decisions do not scan a key's receipts: the current state of each
-- idempotency key, rebuildable from the receipts at any time
-- (sqlite.DB.RebuildKeys; sqlite.SQLKeysDrift lists any difference). Its
-- one column the receipts cannot give back is token_hash, the SHA-256 of
-- the latest reservation token (tokens are secrets and never enter a
-- receipt): a rebuild empties it, which only makes outstanding
-- reservations uncommittable (their commits get stale_reservation and the
-- keys become interrupted when the leases end); it never changes a
-- recorded outcome.

PRAGMA application_id = 1701209452; -- 0x6566656C

CREATE TABLE receipts (
	seq              INTEGER PRIMARY KEY CHECK (seq >= 1),
	kind             TEXT    NOT NULL CHECK (kind IN ('reserve', 'commit', 'replay', 'resolve')),
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

CREATE INDEX receipts_by_key ON receipts (idempotency_key, seq);
CREATE INDEX receipts_by_execution ON receipts (execution_id, seq);
CREATE INDEX receipts_by_tool ON receipts (tool, seq);
CREATE INDEX receipts_by_kind ON receipts (kind, seq);

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

-- State of each key, derived from its receipts.
CREATE TABLE IF NOT EXISTS keys (
	idempotency_key  TEXT    PRIMARY KEY,
	key_generated    INTEGER NOT NULL,
	tool             TEXT    NOT NULL, -- fingerprint, from the first reserve
	effect           TEXT    NOT NULL,
	input_hash       TEXT    NOT NULL,
	idempotent       INTEGER NOT NULL,
	first_seq        INTEGER NOT NULL, -- the first reserve
	reserve_seq      INTEGER NOT NULL, -- the latest reserve
	lease_expires_at INTEGER NOT NULL, -- of the latest reserve
	final_seq        INTEGER NOT NULL, -- the latest commit or resolve, 0 if none
	token_hash       BLOB    NOT NULL DEFAULT x'' -- SHA-256 of the latest reservation token
) WITHOUT ROWID;

-- Settings fixed when the file was created (one row, never changed):
-- key_ttl_ms is how long a finalized idempotency key is remembered before
-- a reserve starts a new generation of it (SPEC §12; 0: forever). The
-- verifier reads it from here. Version 2 files get the row 0 when they are
-- migrated to version 3.
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
	role       TEXT    NOT NULL CHECK (role IN ('reader', 'writer', 'admin')),
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

PRAGMA user_version = 3;
