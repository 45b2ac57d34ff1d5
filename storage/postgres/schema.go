package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// SchemaVersion is the schema version this build creates and serves.
const SchemaVersion = 5

// schemaLockKey is the pg_advisory_xact_lock key held while the schema is
// checked and created, so that replicas starting together create it once.
// (The checkpoint signer locks use the two-int4 key space with class
// signerLockClass.)
const schemaLockKey int64 = 0x6566656C00000001

// schemaSQL is the PostgreSQL schema, version 2 (version 1 without
// namespaces.key_ttl_ms; sqlKeyTTLColumn adds it). Version 3 is this plus
// sqlApprovals, version 4 plus sqlV14Kinds and sqlPayloads, version 5 plus sqlPrunes
// (schema_prune.go): a new database runs them all,
// so that a created schema and a migrated one are the same.
//
// receipts holds every namespace's chain: one row per receipt, the
// namespace and then one column per field of SPEC §2 with the same name
// (integers as bigint ≥ 0, booleans as boolean), plus prev_hash and hash.
// It is append-only (triggers refuse UPDATE, DELETE and TRUNCATE), but
// for the ledger's deletion of pruned bodies whose hashes it kept (SPEC
// §16, schema 5: sqlPrunes). Forks
// are ruled out by the primary key (one row per seq) and by the head row:
// every write transaction locks its namespace's head row FOR UPDATE and
// ends with a compare-and-set of it, and a trigger lets the head move only
// onto a stored receipt with no successor.
//
// Columns that are compared or ordered by (keys, tools, names) use the "C"
// collation, so that ORDER BY is byte order whatever the database's
// default collation.
const schemaSQL = `
CREATE TABLE schema_version (
	id      int PRIMARY KEY CHECK (id = 1),
	version int NOT NULL
);

CREATE TABLE namespaces (
	name       text COLLATE "C" PRIMARY KEY CHECK (name ~ '^[a-z0-9._-]{1,64}$'),
	created_at bigint NOT NULL
);
` + sqlKeyTTLColumn + `

-- Only head (and checkpoints) reference namespaces: every write of
-- receipts, keys and tree hashes happens in a transaction that holds its
-- namespace's head row, so a foreign key on those tables would only add
-- a lookup per inserted row (measured: 27 % of a 16-receipt batch).
CREATE TABLE head (
	namespace   text COLLATE "C" PRIMARY KEY REFERENCES namespaces (name),
	seq         bigint NOT NULL CHECK (seq >= 0),
	hash        bytea  NOT NULL CHECK (octet_length(hash) = 32),
	recorded_at bigint NOT NULL CHECK (recorded_at >= 0)
);

CREATE TABLE receipts (
	namespace        text COLLATE "C" NOT NULL,
	seq              bigint  NOT NULL CHECK (seq >= 1),
	kind             text    NOT NULL CHECK (kind IN ('reserve', 'commit', 'replay', 'resolve')),
	idempotency_key  text COLLATE "C" NOT NULL,
	key_generated    boolean NOT NULL,
	execution_id     text COLLATE "C" NOT NULL,
	attempt          bigint  NOT NULL CHECK (attempt >= 0),
	tool             text COLLATE "C" NOT NULL,
	effect           text    NOT NULL,
	idempotent       boolean NOT NULL,
	input_hash       text COLLATE "C" NOT NULL,
	outcome          text    NOT NULL,
	external_ref     text    NOT NULL,
	result           text    NOT NULL,
	error_code       text    NOT NULL,
	error_message    text    NOT NULL,
	retryable        boolean NOT NULL,
	lease_expires_at bigint  NOT NULL CHECK (lease_expires_at >= 0),
	ref_seq          bigint  NOT NULL CHECK (ref_seq >= 0),
	actor            text    NOT NULL,
	note             text    NOT NULL,
	recorded_at      bigint  NOT NULL CHECK (recorded_at >= 0),
	prev_hash        bytea   NOT NULL CHECK (octet_length(prev_hash) = 32),
	hash             bytea   NOT NULL CHECK (octet_length(hash) = 32),
	PRIMARY KEY (namespace, seq)
);
CREATE INDEX receipts_by_key ON receipts (namespace, idempotency_key, seq);
CREATE INDEX receipts_by_execution ON receipts (namespace, execution_id, idempotency_key, attempt);
CREATE INDEX receipts_by_tool ON receipts (namespace, tool, seq);
CREATE INDEX receipts_by_kind ON receipts (namespace, kind, seq);

CREATE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION '% is append-only', TG_TABLE_NAME USING ERRCODE = 'restrict_violation';
END $$;
CREATE TRIGGER receipts_append_only BEFORE UPDATE OR DELETE ON receipts
	FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER receipts_no_truncate BEFORE TRUNCATE ON receipts
	FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

-- The head moves only forward, onto a stored receipt that has no
-- successor: a compare-and-set that skipped a receipt, or pointed at a
-- hash that is not the receipt's, fails.
CREATE FUNCTION ledger_head_moves() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.seq < OLD.seq OR NEW.recorded_at < OLD.recorded_at THEN
		RAISE EXCEPTION 'the head of % moves only forward', NEW.namespace USING ERRCODE = 'check_violation';
	END IF;
	IF NEW.seq > 0 AND NOT EXISTS (SELECT 1 FROM receipts
		WHERE namespace = NEW.namespace AND seq = NEW.seq AND hash = NEW.hash) THEN
		RAISE EXCEPTION 'the head of % must be a stored receipt', NEW.namespace USING ERRCODE = 'check_violation';
	END IF;
	IF EXISTS (SELECT 1 FROM receipts WHERE namespace = NEW.namespace AND seq = NEW.seq + 1) THEN
		RAISE EXCEPTION 'the head of % must be the last receipt', NEW.namespace USING ERRCODE = 'check_violation';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER head_moves BEFORE UPDATE ON head FOR EACH ROW EXECUTE FUNCTION ledger_head_moves();

-- The state of each key, derived from its receipts (see the SQLite
-- schema); token_hash is the SHA-256 of the latest reservation token.
CREATE TABLE keys (
	namespace        text COLLATE "C" NOT NULL,
	idempotency_key  text COLLATE "C" NOT NULL,
	key_generated    boolean NOT NULL,
	tool             text COLLATE "C" NOT NULL,
	effect           text    NOT NULL,
	input_hash       text COLLATE "C" NOT NULL,
	idempotent       boolean NOT NULL,
	first_seq        bigint  NOT NULL,
	reserve_seq      bigint  NOT NULL,
	lease_expires_at bigint  NOT NULL,
	final_seq        bigint  NOT NULL,
	token_hash       bytea   NOT NULL DEFAULT '',
	PRIMARY KEY (namespace, idempotency_key)
);

-- The RFC 6962 tree of each namespace, in golang.org/x/mod/sumdb/tlog's
-- stored-hash layout (idx = StoredHashIndex(level, n)), and its signed
-- checkpoints. Both append-only; checkpoints only grow.
CREATE TABLE tree_hashes (
	namespace text COLLATE "C" NOT NULL,
	idx       bigint NOT NULL CHECK (idx >= 0),
	hash      bytea  NOT NULL CHECK (octet_length(hash) = 32),
	PRIMARY KEY (namespace, idx)
);
CREATE TRIGGER tree_hashes_append_only BEFORE UPDATE OR DELETE ON tree_hashes
	FOR EACH ROW EXECUTE FUNCTION ledger_append_only();

CREATE TABLE checkpoints (
	namespace text COLLATE "C" NOT NULL REFERENCES namespaces (name),
	size      bigint NOT NULL CHECK (size >= 1),
	root      bytea  NOT NULL CHECK (octet_length(root) = 32),
	note      text   NOT NULL,
	signed_at bigint NOT NULL,
	PRIMARY KEY (namespace, size)
);
CREATE TRIGGER checkpoints_append_only BEFORE UPDATE OR DELETE ON checkpoints
	FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE FUNCTION ledger_checkpoints_grow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.size <= (SELECT coalesce(max(size), 0) FROM checkpoints WHERE namespace = NEW.namespace) THEN
		RAISE EXCEPTION 'a checkpoint must be larger than the last one' USING ERRCODE = 'check_violation';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER checkpoints_grow BEFORE INSERT ON checkpoints
	FOR EACH ROW EXECUTE FUNCTION ledger_checkpoints_grow();

-- API bearer tokens, shared by all namespaces; namespaces '{}' = all.
CREATE TABLE tokens (
	token_id   text COLLATE "C" PRIMARY KEY,
	name       text COLLATE "C" NOT NULL UNIQUE,
	role       text   NOT NULL CHECK (role IN ('reader', 'writer', 'admin')),
	token_hash bytea  NOT NULL,
	namespaces text[] NOT NULL DEFAULT '{}',
	created_at bigint NOT NULL,
	revoked_at bigint NOT NULL DEFAULT 0
);

-- One row per committed write transaction, to learn after a lost COMMIT
-- reply whether it committed. Pruned after a day.
CREATE TABLE batches (
	batch_id     uuid   PRIMARY KEY,
	namespace    text COLLATE "C" NOT NULL,
	last_seq     bigint NOT NULL,
	committed_at bigint NOT NULL
);
CREATE INDEX batches_by_time ON batches (committed_at);

-- The readiness probe's durable write, outside the chain.
CREATE TABLE ready_probe (
	namespace text COLLATE "C" PRIMARY KEY,
	probed_at bigint NOT NULL
);
`

// sqlKeyTTLColumn adds namespaces.key_ttl_ms (SPEC §12: how long a
// finalized key is remembered, 0 forever), fixed when the namespace is
// created: a trigger refuses to change it. Schema 2 creates it; the
// migration from schema 1 adds it with 0, the behaviour of every version 1
// namespace.
const sqlKeyTTLColumn = `
ALTER TABLE namespaces ADD COLUMN key_ttl_ms bigint NOT NULL DEFAULT 0 CHECK (key_ttl_ms >= 0);
CREATE FUNCTION ledger_key_ttl_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.key_ttl_ms IS DISTINCT FROM OLD.key_ttl_ms THEN
		RAISE EXCEPTION 'the key_ttl_ms of % is fixed at creation', OLD.name USING ERRCODE = 'restrict_violation';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER namespaces_key_ttl_fixed BEFORE UPDATE ON namespaces
	FOR EACH ROW EXECUTE FUNCTION ledger_key_ttl_fixed();
`

// sqlApprovals takes schema 2 to 3 (SPEC §2.1, §13; docs/design/
// approvals.md): the kinds policy, ask, approval and deny, the token role
// approver, head.policy_seq, the asked inputs and the namespaces'
// secrets kept off the chain, and the index of the repeat guard. Every
// statement is idempotent (a schema partly at version 3 takes it again
// unharmed). It runs in migrate's transaction; its ADD CONSTRAINT and
// CREATE INDEX read receipts once.
//
// The other CHECKs of receipts already admit the new kinds' fields: a
// policy receipt's attempt is 0 (attempt >= 0), and effect and outcome
// have no CHECK (the domain and the verifier own their vocabularies).
//
// head.policy_seq is the seq of the namespace's latest policy receipt (0:
// none; every namespace of schema 2 has none), read with the head row an
// Write locks and written by its compare-and-set, so the gate's policy
// costs no round trip. ledger_head_moves now also refuses a policy_seq that
// moves back, names anything but a stored policy receipt of the chain, or
// stays behind a policy receipt the same write appended (one probe of
// receipts_by_kind over the appended seqs).
//
// approval_inputs holds the input of each ask (JSON text, at most 64 KiB)
// until delete_after (unix ms). It is not part of the chain: rows are
// updated and deleted, and not tied to the receipts by a foreign key (as
// keys and tree_hashes are not: every write holds the head row).
//
// state_keys holds each namespace's secret (ledger.Chain.StateKey), 32
// random bytes made on first use, from which the MCP gateways derive the
// key of their requestState envelopes (SPEC §11.1). It is not part of the
// chain; a row is never changed.
//
// receipts_outcomes_by_input serves Tx.RecentOutcomes (the repeat guard):
// the commit and resolve receipts of one (tool, input_hash) since a time,
// without reading the rest of the tool's receipts. It costs each commit
// and resolve one more index entry; reserves and replays none.
const sqlApprovals = `
ALTER TABLE receipts DROP CONSTRAINT IF EXISTS receipts_kind_check,
	ADD CONSTRAINT receipts_kind_check CHECK (kind IN ('reserve', 'commit', 'replay', 'resolve',
		'policy', 'ask', 'approval', 'deny'));
ALTER TABLE tokens DROP CONSTRAINT IF EXISTS tokens_role_check,
	ADD CONSTRAINT tokens_role_check CHECK (role IN ('reader', 'writer', 'admin', 'approver'));
ALTER TABLE head ADD COLUMN IF NOT EXISTS policy_seq bigint NOT NULL DEFAULT 0 CHECK (policy_seq >= 0);

CREATE OR REPLACE FUNCTION ledger_head_moves() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.seq < OLD.seq OR NEW.recorded_at < OLD.recorded_at THEN
		RAISE EXCEPTION 'the head of % moves only forward', NEW.namespace USING ERRCODE = 'check_violation';
	END IF;
	IF NEW.seq > 0 AND NOT EXISTS (SELECT 1 FROM receipts
		WHERE namespace = NEW.namespace AND seq = NEW.seq AND hash = NEW.hash) THEN
		RAISE EXCEPTION 'the head of % must be a stored receipt', NEW.namespace USING ERRCODE = 'check_violation';
	END IF;
	IF EXISTS (SELECT 1 FROM receipts WHERE namespace = NEW.namespace AND seq = NEW.seq + 1) THEN
		RAISE EXCEPTION 'the head of % must be the last receipt', NEW.namespace USING ERRCODE = 'check_violation';
	END IF;
	IF NEW.policy_seq IS DISTINCT FROM OLD.policy_seq AND (NEW.policy_seq < OLD.policy_seq
		OR NOT EXISTS (SELECT 1 FROM receipts WHERE namespace = NEW.namespace AND seq = NEW.policy_seq
			AND seq <= NEW.seq AND kind = 'policy')) THEN
		RAISE EXCEPTION 'the policy_seq of % must name a stored policy receipt, moving forward', NEW.namespace
			USING ERRCODE = 'check_violation';
	END IF;
	IF NEW.seq > OLD.seq AND EXISTS (SELECT 1 FROM receipts WHERE namespace = NEW.namespace AND kind = 'policy'
		AND seq > greatest(OLD.seq, NEW.policy_seq) AND seq <= NEW.seq) THEN
		RAISE EXCEPTION 'the policy_seq of % must name its latest policy receipt', NEW.namespace
			USING ERRCODE = 'check_violation';
	END IF;
	RETURN NEW;
END $$;

CREATE TABLE IF NOT EXISTS approval_inputs (
	namespace    text COLLATE "C" NOT NULL,
	ask_seq      bigint NOT NULL CHECK (ask_seq >= 1),
	input        text   NOT NULL CHECK (octet_length(input) <= 65536),
	delete_after bigint NOT NULL CHECK (delete_after >= 0),
	PRIMARY KEY (namespace, ask_seq)
);
CREATE INDEX IF NOT EXISTS approval_inputs_by_deadline ON approval_inputs (namespace, delete_after);

CREATE TABLE IF NOT EXISTS state_keys (
	namespace text COLLATE "C" PRIMARY KEY REFERENCES namespaces (name),
	key       bytea NOT NULL CHECK (octet_length(key) = 32)
);

CREATE INDEX IF NOT EXISTS receipts_outcomes_by_input ON receipts (namespace, tool, input_hash, recorded_at)
	WHERE kind IN ('commit', 'resolve');
`

// sqlV14Kinds widens the receipt kinds for contract v1.4 at once — key
// (SPEC §9.2), erase (§14), reconcile (§15), prune (§16) — and counts a
// reconcile, which finalizes a key as a resolve does, in
// receipts_outcomes_by_input (the repeat guard reads it to know a key's
// last outcome).
const sqlV14Kinds = `
ALTER TABLE receipts DROP CONSTRAINT IF EXISTS receipts_kind_check,
	ADD CONSTRAINT receipts_kind_check CHECK (kind IN ('reserve', 'commit', 'replay', 'resolve',
		'policy', 'ask', 'approval', 'deny', 'key', 'erase', 'reconcile', 'prune'));
DROP INDEX IF EXISTS receipts_outcomes_by_input;
CREATE INDEX receipts_outcomes_by_input ON receipts (namespace, tool, input_hash, recorded_at)
	WHERE kind IN ('commit', 'resolve', 'reconcile');
`

// migrations[v] takes a writable database from schema v to v+1.
var migrations = map[int]string{1: sqlKeyTTLColumn, 2: sqlApprovals, 3: sqlV14Kinds + sqlPayloads, 4: sqlPrunes}

// sqlPayloads adds the payload mode of each namespace (SPEC §14; fixed at
// creation like key_ttl_ms; every namespace made before is inline) and the
// table of the values of committed payload fields, with their salts. A
// value is only ever erased (set to NULL with its salt, *_erased naming
// the erase receipt), inside the ledger's own writes (sqlWriterMark).
// Idempotent, like sqlApprovals.
const sqlPayloads = `
ALTER TABLE namespaces ADD COLUMN IF NOT EXISTS payloads text NOT NULL DEFAULT 'inline';
CREATE OR REPLACE FUNCTION ledger_key_ttl_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.key_ttl_ms IS DISTINCT FROM OLD.key_ttl_ms OR NEW.payloads IS DISTINCT FROM OLD.payloads THEN
		RAISE EXCEPTION 'the settings of % are fixed at creation', OLD.name USING ERRCODE = 'restrict_violation';
	END IF;
	RETURN NEW;
END $$;
CREATE TABLE IF NOT EXISTS payloads (
	namespace            text COLLATE "C" NOT NULL,
	seq                  bigint NOT NULL CHECK (seq >= 1),
	external_ref         text,
	external_ref_salt    bytea CHECK (octet_length(external_ref_salt) = 16),
	external_ref_erased  bigint NOT NULL DEFAULT 0,
	result               text,
	result_salt          bytea CHECK (octet_length(result_salt) = 16),
	result_erased        bigint NOT NULL DEFAULT 0,
	error_message        text,
	error_message_salt   bytea CHECK (octet_length(error_message_salt) = 16),
	error_message_erased bigint NOT NULL DEFAULT 0,
	note                 text,
	note_salt            bytea CHECK (octet_length(note_salt) = 16),
	note_erased          bigint NOT NULL DEFAULT 0,
	PRIMARY KEY (namespace, seq),
	CHECK ((external_ref IS NULL) = (external_ref_salt IS NULL) AND (result IS NULL) = (result_salt IS NULL)
		AND (error_message IS NULL) = (error_message_salt IS NULL) AND (note IS NULL) = (note_salt IS NULL))
);
CREATE OR REPLACE FUNCTION ledger_payloads_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'UPDATE' AND current_setting('effect_ledger.writer', true) = 'on'
		AND NEW.namespace = OLD.namespace AND NEW.seq = OLD.seq
		AND (NEW.external_ref IS NOT DISTINCT FROM OLD.external_ref OR (NEW.external_ref IS NULL AND NEW.external_ref_erased > 0))
		AND (NEW.result IS NOT DISTINCT FROM OLD.result OR (NEW.result IS NULL AND NEW.result_erased > 0))
		AND (NEW.error_message IS NOT DISTINCT FROM OLD.error_message OR (NEW.error_message IS NULL AND NEW.error_message_erased > 0))
		AND (NEW.note IS NOT DISTINCT FROM OLD.note OR (NEW.note IS NULL AND NEW.note_erased > 0)) THEN
		RETURN NEW;
	END IF;
	RAISE EXCEPTION 'a kept value can only be erased, through the ledger (% refused)', TG_OP
		USING ERRCODE = 'restrict_violation';
END $$;
CREATE OR REPLACE TRIGGER payloads_guard BEFORE UPDATE OR DELETE ON payloads
	FOR EACH ROW EXECUTE FUNCTION ledger_payloads_guard();
CREATE OR REPLACE TRIGGER payloads_no_truncate BEFORE TRUNCATE ON payloads
	FOR EACH STATEMENT EXECUTE FUNCTION ledger_payloads_guard();
CREATE TABLE IF NOT EXISTS erasures (
	namespace text COLLATE "C" NOT NULL,
	seq       bigint NOT NULL CHECK (seq >= 1),
	salt      bytea  NOT NULL CHECK (octet_length(salt) = 16),
	ranges    text   NOT NULL,
	PRIMARY KEY (namespace, seq)
);
CREATE OR REPLACE TRIGGER erasures_append_only BEFORE UPDATE OR DELETE ON erasures
	FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
`

// sqlSideTables are the side tables that schema 4 gained after databases
// of it were made: the subject index, the pending erasure marks and the
// erased subjects (SPEC §14), the tokens of reconciled reservations (§15).
// erasure_subjects keeps, beside each erasure by subject and like it
// never erased, the subject's MAC: ledgerctl erasures export lists it, so
// that a restored backup loses the subject's index rows too. A writable open
// applies it where one is missing (ensureSideTables), so that a database
// of schema 4 made before them gets them; idempotent.
const sqlSideTables = `
CREATE TABLE IF NOT EXISTS subjects (
	namespace       text COLLATE "C" NOT NULL,
	mac             bytea  NOT NULL CHECK (octet_length(mac) = 32),
	idempotency_key text COLLATE "C" NOT NULL,
	first_seq       bigint NOT NULL,
	PRIMARY KEY (namespace, mac, idempotency_key, first_seq)
);
CREATE INDEX IF NOT EXISTS subjects_by_key ON subjects (namespace, idempotency_key);
CREATE TABLE IF NOT EXISTS reconciled_tokens (
	namespace       text COLLATE "C" NOT NULL,
	idempotency_key text COLLATE "C" NOT NULL,
	token_hash      bytea  NOT NULL CHECK (octet_length(token_hash) = 32),
	reserve_seq     bigint NOT NULL,
	PRIMARY KEY (namespace, idempotency_key, token_hash)
);
CREATE TABLE IF NOT EXISTS pending_erasures (
	namespace       text COLLATE "C" NOT NULL,
	idempotency_key text COLLATE "C" NOT NULL,
	first_seq       bigint NOT NULL,
	erase_seq       bigint NOT NULL,
	fields          smallint NOT NULL,
	actor           text NOT NULL,
	PRIMARY KEY (namespace, idempotency_key, first_seq)
);
CREATE TABLE IF NOT EXISTS erasure_subjects (
	namespace text COLLATE "C" NOT NULL,
	seq       bigint NOT NULL CHECK (seq >= 1),
	mac       bytea  NOT NULL CHECK (octet_length(mac) = 32),
	PRIMARY KEY (namespace, seq, mac)
);
CREATE OR REPLACE TRIGGER erasure_subjects_append_only BEFORE UPDATE OR DELETE ON erasure_subjects
	FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
`

// ensureSideTables makes the side tables of sqlSideTables where one is
// missing, under migrate's advisory lock. It looks first: a role that may
// write the ledger's tables but not create any opens a complete database.
func ensureSideTables(ctx context.Context, tx pgx.Tx) error {
	return ensure(ctx, tx, "side tables", `SELECT (to_regclass('subjects') IS NOT NULL)::int + (to_regclass('subjects_by_key') IS NOT NULL)::int
		+ (to_regclass('pending_erasures') IS NOT NULL)::int + (to_regclass('reconciled_tokens') IS NOT NULL)::int
		+ (to_regclass('erasure_subjects') IS NOT NULL)::int`, 5, sqlSideTables)
}

// ensure runs ddl unless probe, a count of what ddl makes, already
// counts want of them: a database made complete needs no right to create.
func ensure(ctx context.Context, tx pgx.Tx, what, probe string, want int, ddl string) error {
	var n int
	if err := tx.QueryRow(ctx, probe).Scan(&n); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if n == want {
		return nil
	}
	if _, err := tx.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// sqlNowMS is the database clock in unix milliseconds.
const sqlNowMS = `floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint`

// migrate checks the schema version, creates the schema on an empty
// database (the default namespace with keyTTL) and migrates an older
// schema (migrations, one step after the other), in one transaction under
// an advisory lock. readOnly stores never create or migrate it: they read
// a version 1 or 2 schema as it is. It returns the version of the schema
// in the database.
func migrate(ctx context.Context, conn *pgx.Conn, readOnly bool, def ledger.NamespaceSettings) (int, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, schemaLockKey); err != nil {
		return 0, err
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('schema_version') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, err
	}
	if exists {
		var v int
		err := tx.QueryRow(ctx, `SELECT version FROM schema_version WHERE id = 1`).Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, fmt.Errorf("%w: the schema_version table is empty", ledger.ErrNotLedger)
		}
		if err != nil {
			return 0, err
		}
		switch {
		case v > SchemaVersion:
			return 0, fmt.Errorf("%w: the database has schema version %d, this build knows %d",
				ledger.ErrSchemaVersion, v, SchemaVersion)
		case v < 1:
			return 0, fmt.Errorf("%w: the database has schema version %d, this build knows %d and has no migration from it",
				ledger.ErrSchemaVersion, v, SchemaVersion)
		}
		if readOnly {
			return v, nil
		}
		for ; v < SchemaVersion; v++ {
			if _, err := tx.Exec(ctx, migrations[v]); err != nil {
				return 0, fmt.Errorf("migrate schema %d to %d: %w", v, v+1, err)
			}
			if _, err := tx.Exec(ctx, `UPDATE schema_version SET version = $1 WHERE id = 1`, v+1); err != nil {
				return 0, fmt.Errorf("migrate schema %d to %d: %w", v, v+1, err)
			}
		}
		if err := ensureSideTables(ctx, tx); err != nil {
			return 0, err
		}
		if err := ensureKeysGuard(ctx, tx); err != nil {
			return 0, err
		}
		if err := ensureHeadGuard(ctx, tx); err != nil {
			return 0, err
		}
		if err := ensureOpenKeysIndex(ctx, tx); err != nil {
			return 0, err
		}
		return v, tx.Commit(ctx)
	}
	if readOnly {
		return 0, fmt.Errorf("%w: no schema_version table (start ledgerd on it once to create the schema)", ledger.ErrNotLedger)
	}
	if _, err := tx.Exec(ctx, schemaSQL+sqlApprovals+sqlV14Kinds+sqlPayloads+sqlSideTables+sqlPrunes); err != nil {
		return 0, fmt.Errorf("create schema: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO schema_version (id, version) VALUES (1, $1)`, SchemaVersion); err != nil {
		return 0, fmt.Errorf("create schema: %w", err)
	}
	if err := createNamespace(ctx, tx, ledger.DefaultNamespace, def); err != nil {
		return 0, fmt.Errorf("create schema: %w", err)
	}
	if err := ensureKeysGuard(ctx, tx); err != nil {
		return 0, err
	}
	if err := ensureHeadGuard(ctx, tx); err != nil {
		return 0, err
	}
	if err := ensureOpenKeysIndex(ctx, tx); err != nil {
		return 0, err
	}
	return SchemaVersion, tx.Commit(ctx)
}

// sqlKeysGuard protects the keys table, the state every decision reads:
// a row deleted or changed by hand (a DBA's clean-up of "old keys") would
// let a succeeded key be reserved and run again. Rows are updated only
// inside the ledger's own write transactions, which set
// effect_ledger.writer for the transaction (sqlWriterMark), and deleted
// only by its deletion of pruned bodies (sqlPrunerMark, DeletePruned), once
// a prune covers their generation (SPEC §16). Giving a key up is a
// decision for ledgerctl resolve, not for SQL.
const sqlKeysGuard = `
CREATE OR REPLACE FUNCTION ledger_keys_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'UPDATE' AND current_setting('effect_ledger.writer', true) = 'on' THEN
		RETURN NEW;
	END IF;
	IF TG_OP = 'DELETE' AND current_setting('effect_ledger.pruner', true) = 'on' THEN
		IF EXISTS (SELECT 1 FROM prunes WHERE namespace = OLD.namespace AND through >= OLD.first_seq) THEN
			RETURN OLD;
		END IF;
	END IF;
	RAISE EXCEPTION 'keys rows are derived from the receipts and change only through the ledger (% refused)', TG_OP
		USING ERRCODE = 'restrict_violation';
END $$;
CREATE OR REPLACE TRIGGER keys_guard BEFORE UPDATE OR DELETE ON keys
	FOR EACH ROW EXECUTE FUNCTION ledger_keys_guard();
CREATE OR REPLACE TRIGGER keys_no_truncate BEFORE TRUNCATE ON keys
	FOR EACH STATEMENT EXECUTE FUNCTION ledger_keys_guard();`

// sqlWriterMark marks a transaction as the ledger's own write (see
// sqlKeysGuard); it lasts until the transaction ends.
const sqlWriterMark = `SELECT set_config('effect_ledger.writer', 'on', true)`

// ensureKeysGuard installs sqlKeysGuard where it is missing (a database
// made by an earlier build), under migrate's advisory lock.
func ensureKeysGuard(ctx context.Context, tx pgx.Tx) error {
	return ensure(ctx, tx, "keys guard", `SELECT count(*) FROM pg_trigger WHERE tgname = 'keys_guard' AND tgrelid = 'keys'::regclass`, 1, sqlKeysGuard)
}

// sqlCreateNamespace inserts a namespace with its settings and its empty
// head in one statement.
const sqlCreateNamespace = `WITH ns AS (
		INSERT INTO namespaces (name, created_at, key_ttl_ms, payloads) VALUES ($1, ` + sqlNowMS + `, $2, $3) RETURNING name)
	INSERT INTO head (namespace, seq, hash, recorded_at) SELECT name, 0, '\x` + zeroHashHex + `'::bytea, 0 FROM ns`

const zeroHashHex = "0000000000000000000000000000000000000000000000000000000000000000"

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func createNamespace(ctx context.Context, q execer, ns string, st ledger.NamespaceSettings) error {
	st = st.Resolved()
	_, err := q.Exec(ctx, sqlCreateNamespace, ns, int64(st.KeyTTL), string(st.Payloads))
	return err
}
