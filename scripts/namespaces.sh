#!/usr/bin/env bash
# Measures ledgerd with many namespaces (BENCHMARKS.md, "Many namespaces"):
# creating N namespaces, then a restart — its time, RSS and open file
# descriptors — and RSS and descriptors after a write to each of M of them
# in turn. Loopback only; every loop is bounded.
#
#   scripts/namespaces.sh [N=10000] [M=2000]
set -euo pipefail
N=${1:-10000}
M=${2:-2000}
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/ledger-namespaces.XXXXXX)
trap 'kill "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
go build -o "$work/ledgerd" ./cmd/ledgerd
port=18190
url=http://127.0.0.1:$port
start() {
	"$work/ledgerd" --db "$work/ledger.db" --listen 127.0.0.1:$port --max-namespaces $((N + 1)) >"$work/log" 2>&1 &
	pid=$!
	for _ in $(seq 600); do curl -s -o /dev/null $url/healthz && return; sleep 0.05; done
	echo "ledgerd did not start"; cat "$work/log"; exit 1
}
usage() { echo "RSS $(awk '/VmRSS/ {print $2/1024 " MiB"}' /proc/$pid/status), descriptors $(ls /proc/$pid/fd | wc -l)"; }
start
t0=$(date +%s.%N)
seq -w 1 "$N" | xargs -P 4 -I{} curl -s -o /dev/null -X POST -H 'Content-Type: application/json' \
	$url/v1/namespaces -d '{"name":"ns{}"}'
echo "created $N namespaces in $(echo "$(date +%s.%N) - $t0" | bc) s; $(usage)"
kill $pid; wait $pid || true
t0=$(date +%s.%N)
start
echo "start with $N namespaces: $(echo "$(date +%s.%N) - $t0" | bc) s; $(usage)"
for i in $(seq -w 1 "$M"); do
	curl -s -o /dev/null -X POST -H 'Content-Type: application/json' $url/v1/ns/ns$(printf "%0${#N}d" $((10#$i)))/effects/reserve \
		-d "{\"idempotency_key\":\"key-$i-$(od -An -tx8 -N8 /dev/urandom | tr -d ' ')\",\"tool\":\"t\",\"effect\":\"write\",\"execution_id\":\"e-$i\"}"
done
echo "after a write to each of $M namespaces in turn: $(usage)"
