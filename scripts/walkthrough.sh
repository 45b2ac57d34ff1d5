#!/usr/bin/env bash
# Runs the README's curl walk-through against a running ledgerd:
#   reserve -> commit -> replay -> failed -> retry.
# Usage: scripts/walkthrough.sh [URL]   (default http://127.0.0.1:8080)
# Keys get a random suffix, so the script can run many times on one ledger.
set -euo pipefail
L=${1:-http://127.0.0.1:8080}
S=$(date +%s%N)
post() { curl -sS -H 'Content-Type: application/json' "$L$1" -d "$2"; echo; }
token() { sed -n 's/.*"reservation":"\([^"]*\)".*/\1/p'; }

echo "# 1. reserve"
out=$(post /v1/effects/reserve '{"idempotency_key":"refund-order-'$S'","execution_id":"exec-1","tool":"payments.refund","effect":"write","idempotent":true,"input":{"order":1234,"amount":1200}}')
echo "$out"; tok=$(echo "$out" | token)
echo "# 2. commit"
post /v1/effects/refund-order-$S/commit '{"reservation":"'$tok'","outcome":"succeeded","external_ref":"re_3Pq9","result":{"amount":1200,"currency":"eur"}}'
echo "# 3. replay (a new execution of the same call)"
post /v1/effects/reserve '{"idempotency_key":"refund-order-'$S'","execution_id":"exec-2","tool":"payments.refund","effect":"write","input":{"order":1234,"amount":1200}}'
echo "# 4. a failed effect"
out=$(post /v1/effects/reserve '{"idempotency_key":"mail-welcome-'$S'","execution_id":"exec-3","tool":"email.send","effect":"external","idempotent":true}')
echo "$out"; tok=$(echo "$out" | token)
post /v1/effects/mail-welcome-$S/commit '{"reservation":"'$tok'","outcome":"failed","error":{"code":"TIMEOUT","message":"smtp timed out","retryable":true}}'
echo "# 5. runtime retry (same execution, next attempt)"
post /v1/effects/reserve '{"idempotency_key":"mail-welcome-'$S'","execution_id":"exec-3","attempt":2,"tool":"email.send","effect":"external","idempotent":true}'
echo "# head"
curl -sS "$L/v1/head"; echo
