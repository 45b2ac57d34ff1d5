#!/usr/bin/env bash
# PostgreSQL baseline for BENCHMARKS.md: what users build instead of the
# ledger, measured on this machine. Installs PostgreSQL from Debian's
# packages if needed, starts a throwaway cluster on a loopback port
# (fsync on, synchronous_commit on: durable like ledgerd), runs pgbench, then
# stops and removes the cluster.
#
#   sudo scripts/baseline/postgres.sh [CLIENTS] [SECONDS]
#
# Modes:
#   pairs    an idempotency table: INSERT ... ON CONFLICT DO NOTHING (reserve),
#            then UPDATE (commit): two durable transactions per pair
#   chained  the same, plus a SHA-256 hash chain serialised through a head
#            row, one receipt row per step: what a tamper-evident log costs
set -euo pipefail
CLIENTS=${1:-16}
SECONDS_RUN=${2:-10}
PORT=55432

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
DIR=$(mktemp -d /tmp/ledger-pg-XXXX)
chown postgres "$DIR"
as_pg() { su postgres -s /bin/bash -c "$*"; }
cleanup() {
	as_pg "$BIN/pg_ctl -D $DIR/data -m immediate stop" >/dev/null 2>&1 || true
	rm -rf "$DIR"
}
trap cleanup EXIT

as_pg "$BIN/initdb -D $DIR/data -A trust -U postgres" >/dev/null
as_pg "$BIN/pg_ctl -D $DIR/data -l $DIR/log -w -o '-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on -c max_connections=200 -c shared_buffers=512MB' start" >/dev/null
PSQL="$BIN/psql -h 127.0.0.1 -p $PORT -U postgres -q"

$PSQL <<'SQL'
CREATE TABLE idem (key text PRIMARY KEY, state text NOT NULL, token text, outcome text, ref text, result jsonb);
CREATE TABLE chain_head (id int PRIMARY KEY, seq bigint NOT NULL, hash bytea NOT NULL);
INSERT INTO chain_head VALUES (1, 0, '\x0000000000000000000000000000000000000000000000000000000000000000');
CREATE TABLE receipts (seq bigint PRIMARY KEY, key text NOT NULL, kind text NOT NULL, hash bytea NOT NULL UNIQUE);
SQL

cat > "$DIR/pairs.sql" <<'SQL'
\set k random(1, 2000000000)
INSERT INTO idem (key, state, token) VALUES ('k' || :client_id || '-' || :k, 'reserved', md5(random()::text)) ON CONFLICT (key) DO NOTHING;
UPDATE idem SET state = 'succeeded', outcome = 'succeeded', ref = 're_1', result = '{"amount":1200}' WHERE key = 'k' || :client_id || '-' || :k;
SQL

cat > "$DIR/chained.sql" <<'SQL'
\set k random(1, 2000000000)
BEGIN;
INSERT INTO idem (key, state, token) VALUES ('c' || :client_id || '-' || :k, 'reserved', md5(random()::text)) ON CONFLICT (key) DO NOTHING;
WITH h AS (UPDATE chain_head SET seq = seq + 1, hash = sha256(hash || convert_to('reserve|c' || :client_id || '-' || :k, 'UTF8')) WHERE id = 1 RETURNING seq, hash)
INSERT INTO receipts SELECT seq, 'c' || :client_id || '-' || :k, 'reserve', hash FROM h;
COMMIT;
BEGIN;
UPDATE idem SET state = 'succeeded', outcome = 'succeeded', ref = 're_1' WHERE key = 'c' || :client_id || '-' || :k;
WITH h AS (UPDATE chain_head SET seq = seq + 1, hash = sha256(hash || convert_to('commit|c' || :client_id || '-' || :k, 'UTF8')) WHERE id = 1 RETURNING seq, hash)
INSERT INTO receipts SELECT seq, 'c' || :client_id || '-' || :k, 'commit', hash FROM h;
COMMIT;
SQL
chmod 644 "$DIR"/*.sql

for mode in pairs chained; do
	out=$($BIN/pgbench -h 127.0.0.1 -p $PORT -U postgres -n -c "$CLIENTS" -j 2 -T "$SECONDS_RUN" -f "$DIR/$mode.sql" postgres 2>&1)
	tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
	lat=$(echo "$out" | sed -n 's/^latency average = \(.*\)$/\1/p')
	echo "postgres $mode: $tps pairs/s with $CLIENTS clients (latency average $lat per pair)"
done
