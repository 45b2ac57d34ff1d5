#!/usr/bin/env bash
# Redis baseline for BENCHMARKS.md: SET NX (reserve) then SET (commit)
# with appendfsync always (every write fsync'd, durable like ledgerd); no
# hash chain, no HTTP. Installs Redis from Debian's packages if needed,
# starts a throwaway server on a loopback port, runs redis-benchmark, then
# stops it.
#
#   sudo scripts/baseline/redis.sh [CLIENTS] [REQUESTS]
set -euo pipefail
CLIENTS=${1:-16}
REQUESTS=${2:-200000}
PORT=56379

if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
fi
DIR=$(mktemp -d /tmp/ledger-redis-XXXX)
redis-server --port $PORT --bind 127.0.0.1 --dir "$DIR" --appendonly yes --appendfsync always \
	--save '' --daemonize yes --pidfile "$DIR/redis.pid" --logfile "$DIR/log"
cleanup() {
	redis-cli -p $PORT shutdown nosave >/dev/null 2>&1 || kill "$(cat "$DIR/redis.pid")" 2>/dev/null || true
	rm -rf "$DIR"
}
trap cleanup EXIT
for _ in $(seq 50); do redis-cli -p $PORT ping >/dev/null 2>&1 && break; sleep 0.1; done

rps() { redis-benchmark -p $PORT -c "$CLIENTS" -n "$REQUESTS" -r 1000000000 --csv "$@" | tail -1 | cut -d, -f2 | tr -d '"'; }
reserve=$(rps SET idem:__rand_int__ reserved NX)
commit=$(rps SET idem:__rand_int__ succeeded)
pairs=$(awk -v a="$reserve" -v b="$commit" 'BEGIN { printf "%.0f", 1 / (1 / a + 1 / b) }')
echo "redis reserve (SET NX): $reserve requests/s; commit (SET): $commit requests/s; pairs: $pairs pairs/s with $CLIENTS clients"
