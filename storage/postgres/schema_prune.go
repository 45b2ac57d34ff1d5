package postgres

// sqlPrunes takes schema 4 to 5 (SPEC §16; docs/design/pruning.md): the
// tables of a namespace's pruned prefix, and guards that let the ledger's
// own deletion (DeletePruned, which marks its transaction with
// sqlPrunerMark) and nothing else delete what a prune covers. Idempotent,
// like sqlApprovals; it runs in migrate's transaction.
//
// prunes has one row per prune receipt: the range from_seq … through it
// pruned (from_seq is the previous row's through + 1), the segment's
// digest and directory name, and deleted_through, the deletion's
// progress (bodies ≤ it are gone; from_seq - 1 when the row is made).
// Only deleted_through changes, upward, under the pruner mark.
//
// kept_tiles keeps the chain hashes of deleted receipts, 256 to a row:
// leaf i (seq i+1) at byte (i % 256) * 32 of the row of tile i / 256. Its
// rows only grow (a partial tile is extended), under the pruner mark.
// STORAGE EXTERNAL: hashes do not compress, and the receipts guard reads
// 32 bytes of a row without detoasting all of it. The tree hashes of
// level 8 and above stay in tree_hashes (keyed by idx): only levels 0–7
// of deleted leaves go, which the domain recomputes from the kept tiles.
//
// pruned_keys holds h, the first 8 bytes (signed) of HMAC(fingerprint
// key, key) of each key whose bodies a deletion removed, so that GET of it
// keeps answering 410 (the domain hashes); kept_receipts the bodies of the
// key receipts (SPEC §9.2) of a prune's range, written with the prune.
// Both are append-only.
//
// The guards: receipts rows go only under the pruner mark, when a prunes
// row covers the seq and the kept tile holds the row's own hash at its
// place (ledger_receipts_pruned; UPDATE and TRUNCATE stay refused);
// tree_hashes rows under the pruner mark; keys rows (ledger_keys_guard,
// sqlKeysGuard) under the pruner mark once a prune covers their
// generation; payloads rows under the pruner mark once a prune covers them
// and their receipt is gone; checkpoints rows under the pruner mark once a
// prune covers their size, the latest one never.
const sqlPrunes = `
CREATE TABLE IF NOT EXISTS prunes (
	namespace       text COLLATE "C" NOT NULL,
	seq             bigint NOT NULL,
	from_seq        bigint NOT NULL CHECK (from_seq >= 1),
	through         bigint NOT NULL,
	digest          text   NOT NULL,
	segment         text   NOT NULL,
	deleted_through bigint NOT NULL,
	PRIMARY KEY (namespace, seq),
	CHECK (through >= from_seq AND through < seq),
	CHECK (deleted_through BETWEEN from_seq - 1 AND through)
);
CREATE INDEX IF NOT EXISTS prunes_unfinished ON prunes (namespace, seq) WHERE deleted_through < through;

CREATE TABLE IF NOT EXISTS kept_tiles (
	namespace text COLLATE "C" NOT NULL,
	tile      bigint NOT NULL CHECK (tile >= 0),
	hashes    bytea  NOT NULL CHECK (octet_length(hashes) BETWEEN 32 AND 8192 AND octet_length(hashes) % 32 = 0),
	PRIMARY KEY (namespace, tile)
);
ALTER TABLE kept_tiles ALTER COLUMN hashes SET STORAGE EXTERNAL;

CREATE TABLE IF NOT EXISTS pruned_keys (
	namespace text COLLATE "C" NOT NULL,
	h         bigint NOT NULL,
	prune_seq bigint NOT NULL,
	PRIMARY KEY (namespace, h)
);

CREATE TABLE IF NOT EXISTS kept_receipts (
	namespace text COLLATE "C" NOT NULL,
	seq       bigint NOT NULL CHECK (seq >= 1),
	body      text   NOT NULL,
	PRIMARY KEY (namespace, seq)
);

CREATE OR REPLACE FUNCTION ledger_prunes_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		IF NEW.from_seq <> coalesce((SELECT max(through) FROM prunes WHERE namespace = NEW.namespace), 0) + 1
			OR NEW.deleted_through <> NEW.from_seq - 1 THEN
			RAISE EXCEPTION 'a prune of % starts after the last one, nothing deleted', NEW.namespace
				USING ERRCODE = 'check_violation';
		END IF;
		IF NOT EXISTS (SELECT 1 FROM receipts WHERE namespace = NEW.namespace AND seq = NEW.seq AND kind = 'prune') THEN
			RAISE EXCEPTION 'a prunes row of % must name a stored prune receipt', NEW.namespace
				USING ERRCODE = 'check_violation';
		END IF;
		RETURN NEW;
	END IF;
	IF TG_OP = 'UPDATE' AND current_setting('effect_ledger.pruner', true) = 'on'
		AND NEW.namespace = OLD.namespace AND NEW.seq = OLD.seq AND NEW.from_seq = OLD.from_seq
		AND NEW.through = OLD.through AND NEW.digest = OLD.digest AND NEW.segment = OLD.segment
		AND NEW.deleted_through >= OLD.deleted_through THEN
		RETURN NEW;
	END IF;
	RAISE EXCEPTION 'prunes rows only record the deletion''s progress, through the ledger (% refused)', TG_OP
		USING ERRCODE = 'restrict_violation';
END $$;
CREATE OR REPLACE TRIGGER prunes_guard BEFORE INSERT OR UPDATE OR DELETE ON prunes
	FOR EACH ROW EXECUTE FUNCTION ledger_prunes_guard();
CREATE OR REPLACE TRIGGER prunes_no_truncate BEFORE TRUNCATE ON prunes
	FOR EACH STATEMENT EXECUTE FUNCTION ledger_prunes_guard();

CREATE OR REPLACE FUNCTION ledger_kept_tiles_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF current_setting('effect_ledger.pruner', true) = 'on' THEN
		IF TG_OP = 'INSERT' THEN
			RETURN NEW;
		END IF;
		IF TG_OP = 'UPDATE' AND NEW.namespace = OLD.namespace AND NEW.tile = OLD.tile
			AND octet_length(NEW.hashes) > octet_length(OLD.hashes)
			AND substring(NEW.hashes FROM 1 FOR octet_length(OLD.hashes)) = OLD.hashes THEN
			RETURN NEW;
		END IF;
	END IF;
	RAISE EXCEPTION 'kept tiles only grow, through the ledger (% refused)', TG_OP
		USING ERRCODE = 'restrict_violation';
END $$;
CREATE OR REPLACE TRIGGER kept_tiles_guard BEFORE INSERT OR UPDATE OR DELETE ON kept_tiles
	FOR EACH ROW EXECUTE FUNCTION ledger_kept_tiles_guard();
CREATE OR REPLACE TRIGGER kept_tiles_no_truncate BEFORE TRUNCATE ON kept_tiles
	FOR EACH STATEMENT EXECUTE FUNCTION ledger_kept_tiles_guard();

CREATE OR REPLACE TRIGGER pruned_keys_append_only BEFORE UPDATE OR DELETE ON pruned_keys
	FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE OR REPLACE TRIGGER pruned_keys_no_truncate BEFORE TRUNCATE ON pruned_keys
	FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();
CREATE OR REPLACE TRIGGER kept_receipts_append_only BEFORE UPDATE OR DELETE ON kept_receipts
	FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE OR REPLACE TRIGGER kept_receipts_no_truncate BEFORE TRUNCATE ON kept_receipts
	FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

-- Deletes of receipts, tree hashes and payloads: refused row by row
-- without the pruner mark (WHEN is evaluated without calling a function,
-- so a deletion pays nothing per row for it), checked per statement with
-- it, over the deleted rows at once.
CREATE OR REPLACE TRIGGER receipts_append_only BEFORE UPDATE ON receipts
	FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE OR REPLACE TRIGGER receipts_guard BEFORE DELETE ON receipts
	FOR EACH ROW WHEN (current_setting('effect_ledger.pruner', true) IS DISTINCT FROM 'on')
	EXECUTE FUNCTION ledger_append_only();
-- Each tile's deleted rows, in seq order, must be contiguous, covered by
-- one prune, and their hashes the kept tile's bytes at their place.
CREATE OR REPLACE FUNCTION ledger_receipts_pruned() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	bad record;
BEGIN
	SELECT g.namespace, g.lo INTO bad FROM (
		SELECT namespace, (seq - 1) / 256 AS tile, min(seq) AS lo, max(seq) AS hi, count(*) AS n,
			string_agg(hash, ''::bytea ORDER BY seq) AS hashes
		FROM gone GROUP BY namespace, (seq - 1) / 256) AS g
	LEFT JOIN kept_tiles AS k ON k.namespace = g.namespace AND k.tile = g.tile
	WHERE current_setting('effect_ledger.pruner', true) IS DISTINCT FROM 'on' OR g.n <> g.hi - g.lo + 1
		OR substring(k.hashes FROM ((g.lo - 1) % 256)::int * 32 + 1 FOR g.n::int * 32) IS DISTINCT FROM g.hashes
		OR NOT EXISTS (SELECT 1 FROM prunes AS p WHERE p.namespace = g.namespace AND p.from_seq <= g.lo AND p.through >= g.hi)
	LIMIT 1;
	IF FOUND THEN
		RAISE EXCEPTION 'receipts are append-only; only a pruned receipt whose hash is kept may go (receipts from % of %)',
			bad.lo, bad.namespace USING ERRCODE = 'restrict_violation';
	END IF;
	RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER receipts_pruned AFTER DELETE ON receipts REFERENCING OLD TABLE AS gone
	FOR EACH STATEMENT EXECUTE FUNCTION ledger_receipts_pruned();

CREATE OR REPLACE TRIGGER tree_hashes_append_only BEFORE UPDATE ON tree_hashes
	FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE OR REPLACE TRIGGER tree_hashes_guard BEFORE DELETE ON tree_hashes
	FOR EACH ROW WHEN (current_setting('effect_ledger.pruner', true) IS DISTINCT FROM 'on')
	EXECUTE FUNCTION ledger_append_only();
CREATE OR REPLACE TRIGGER tree_hashes_no_truncate BEFORE TRUNCATE ON tree_hashes
	FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

CREATE OR REPLACE TRIGGER payloads_guard BEFORE UPDATE ON payloads
	FOR EACH ROW EXECUTE FUNCTION ledger_payloads_guard();
CREATE OR REPLACE TRIGGER payloads_kept BEFORE DELETE ON payloads
	FOR EACH ROW WHEN (current_setting('effect_ledger.pruner', true) IS DISTINCT FROM 'on')
	EXECUTE FUNCTION ledger_payloads_guard();
CREATE OR REPLACE FUNCTION ledger_payloads_pruned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF current_setting('effect_ledger.pruner', true) IS DISTINCT FROM 'on' OR EXISTS (SELECT 1 FROM gone AS g
		WHERE EXISTS (SELECT 1 FROM receipts AS r WHERE r.namespace = g.namespace AND r.seq = g.seq)
		OR NOT EXISTS (SELECT 1 FROM prunes AS p WHERE p.namespace = g.namespace AND p.from_seq <= g.seq AND p.through >= g.seq)) THEN
		RAISE EXCEPTION 'a kept value goes only with its pruned receipt' USING ERRCODE = 'restrict_violation';
	END IF;
	RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER payloads_pruned AFTER DELETE ON payloads REFERENCING OLD TABLE AS gone
	FOR EACH STATEMENT EXECUTE FUNCTION ledger_payloads_pruned();

-- A prune's last batch thins the stored checkpoints it covers; the latest
-- one stays (checkpoints_grow compares with it).
CREATE OR REPLACE TRIGGER checkpoints_append_only BEFORE UPDATE ON checkpoints
	FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE OR REPLACE FUNCTION ledger_checkpoints_thinned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF current_setting('effect_ledger.pruner', true) = 'on'
		AND EXISTS (SELECT 1 FROM prunes WHERE namespace = OLD.namespace AND through >= OLD.size)
		AND EXISTS (SELECT 1 FROM checkpoints WHERE namespace = OLD.namespace AND size > OLD.size) THEN
		RETURN OLD;
	END IF;
	RAISE EXCEPTION 'checkpoints are append-only; only those a prune covers may be thinned'
		USING ERRCODE = 'restrict_violation';
END $$;
CREATE OR REPLACE TRIGGER checkpoints_thinned BEFORE DELETE ON checkpoints
	FOR EACH ROW EXECUTE FUNCTION ledger_checkpoints_thinned();
` + sqlKeysGuard

// sqlPrunerMark marks a transaction as the ledger's deletion of pruned
// bodies (DeletePruned); it lasts until the transaction ends.
const sqlPrunerMark = `SELECT set_config('effect_ledger.pruner', 'on', true)`
