#!/usr/bin/env bash
# Runs the curl walk-through of docs/walkthrough.md against a running ledgerd:
#   reserve -> commit -> replay -> failed -> runtime retry -> commit, then reads,
#   then a person in the loop (SPEC §13): a policy, an ask, its approval, the
#   reserve that consumes it (in the namespace approvals-demo).
#
# Usage: scripts/walkthrough.sh [URL]      (default http://127.0.0.1:8080)
#   LEDGER_TOKEN=elt_… scripts/walkthrough.sh   when the ledger has API tokens
#                                                (an admin token runs every step)
#
# Every run uses fresh keys (a run id from the clock and a random number), so
# it can run any number of times on one ledger. Each step checks its HTTP
# status (and what the body says); the first unexpected answer prints the
# step, the status and the body, and the script exits 1. Needs curl and jq.
set -euo pipefail

L=${1:-http://127.0.0.1:8080}
L=${L%/}
for tool in curl jq; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "walkthrough.sh needs $tool; install it (Debian/Ubuntu: apt-get install $tool)" >&2
		exit 2
	fi
done

RUN=$(date +%Y%m%d%H%M%S)-$RANDOM$RANDOM
AUTH=()
if [ -n "${LEDGER_TOKEN:-}" ]; then
	AUTH=(-H "Authorization: Bearer $LEDGER_TOKEN")
fi
BODY=$(mktemp)
HEADERS=$(mktemp)
trap 'rm -f "$BODY" "$HEADERS"' EXIT

# call STEP WANT_STATUS METHOD PATH [JSON]: sends the request, prints the
# response body, and fails the run unless the status is WANT_STATUS.
call() {
	local step=$1 want=$2 method=$3 path=$4 data=${5:-}
	local args=(-sS -X "$method" -o "$BODY" -D "$HEADERS" -w '%{http_code}' ${AUTH[@]+"${AUTH[@]}"})
	if [ -n "$data" ]; then
		args+=(-H 'Content-Type: application/json' --data-binary "$data")
	fi
	local status
	if ! status=$(curl "${args[@]}" "$L$path"); then
		echo "FAILED: $step: cannot reach ledgerd at $L" >&2
		exit 1
	fi
	if [ "$status" != "$want" ]; then
		echo "FAILED: $step: $method $path answered HTTP $status, want $want:" >&2
		cat "$BODY" >&2
		[ -z "$(tail -c 1 "$BODY")" ] || echo >&2
		exit 1
	fi
	cat "$BODY"
	[ -z "$(tail -c 1 "$BODY")" ] || echo
}

# expect STEP JQ_FILTER: fails the run unless the last body satisfies the filter.
expect() {
	if ! jq -e "$2" "$BODY" >/dev/null; then
		echo "FAILED: $1: the answer does not satisfy $2:" >&2
		cat "$BODY" >&2
		[ -z "$(tail -c 1 "$BODY")" ] || echo >&2
		exit 1
	fi
}

# reservation prints the reservation token of the last body.
reservation() { jq -r .reservation "$BODY"; }

REFUND=refund-order-$RUN
MAIL=mail-welcome-$RUN
echo "# run $RUN against $L"

echo "# 1. reserve a key before sending the refund: 201 reserved, with a reservation token"
call "1. reserve" 201 POST /v1/effects/reserve '{"idempotency_key":"'"$REFUND"'","execution_id":"exec-1","tool":"payments.refund","effect":"write","idempotent":true,"input":{"order":1234,"amount":1200}}'
expect "1. reserve" '.status == "reserved" and (.reservation | startswith("rsv_"))'
RSV=$(reservation)

echo "# 2. the refund went through: commit the outcome (201 committed)"
call "2. commit" 201 POST "/v1/effects/$REFUND/commit" '{"reservation":"'"$RSV"'","outcome":"succeeded","external_ref":"re_3Pq9","result":{"amount":1200,"currency":"eur"}}'
expect "2. commit" '.status == "committed"'

echo "# 3. the model calls refund again (a new execution): 200 replayed, the refund is not run twice"
call "3. replay" 200 POST /v1/effects/reserve '{"idempotency_key":"'"$REFUND"'","execution_id":"exec-2","tool":"payments.refund","effect":"write","input":{"order":1234,"amount":1200}}'
expect "3. replay" '.status == "replayed" and .external_ref == "re_3Pq9"'
if ! grep -qi '^Idempotent-Replayed: true' "$HEADERS"; then
	echo "FAILED: 3. replay: no Idempotent-Replayed: true header" >&2
	exit 1
fi

echo "# 4. another effect fails with a transient error: record the failure"
call "4. reserve" 201 POST /v1/effects/reserve '{"idempotency_key":"'"$MAIL"'","execution_id":"exec-3","tool":"email.send","effect":"external","idempotent":true}'
RSV=$(reservation)
call "4. commit failed" 201 POST "/v1/effects/$MAIL/commit" '{"reservation":"'"$RSV"'","outcome":"failed","error":{"code":"TIMEOUT","message":"smtp timed out","retryable":true}}'

echo "# 5. the runtime retries the same execution with the next attempt: 201 reserved, retry true"
call "5. retry" 201 POST /v1/effects/reserve '{"idempotency_key":"'"$MAIL"'","execution_id":"exec-3","attempt":2,"tool":"email.send","effect":"external","idempotent":true}'
expect "5. retry" '.retry == true and .attempt == 2'
RSV=$(reservation)

echo "# 6. the retry worked: commit it (201 committed)"
call "6. commit" 201 POST "/v1/effects/$MAIL/commit" '{"reservation":"'"$RSV"'","outcome":"succeeded","external_ref":"msg_77"}'

echo "# look at the key, its receipts and the head"
call "key" 200 GET "/v1/effects/$MAIL"
expect "key" '.state == "succeeded" and (.receipts | length) == 4'
call "receipts" 200 GET "/v1/receipts?key=$REFUND"
expect "receipts" '(.receipts | length) == 3'
call "head" 200 GET /v1/head

WIRE=wire-invoice-$RUN
echo "# 7. a person in the loop: the namespace approvals-demo sends wire.* to approval"
if ! curl -sS -o /dev/null ${AUTH[@]+"${AUTH[@]}"} -H 'Content-Type: application/json' \
	--data-binary '{"name":"approvals-demo"}' "$L/v1/namespaces"; then
	echo "FAILED: 7. namespace: cannot reach ledgerd at $L" >&2
	exit 1
fi
call "7. policy" 200 PUT /v1/namespaces/approvals-demo/policy '{"rules":[{"tool":"wire.*","approval":"required","expires_in_ms":600000}],"self_approval":"allow"}'
echo "# 8. the agent reserves a wire transfer: 202 approval_required, the effect does not run yet"
call "8. ask" 202 POST /v1/ns/approvals-demo/effects/reserve '{"idempotency_key":"'"$WIRE"'","execution_id":"exec-4","tool":"wire.transfer","effect":"external","input":{"invoice":"INV-9","amount":4200},"approval_summary":"pay invoice INV-9"}'
expect "8. ask" '.status == "approval_required" and .approval.state == "pending"'
ASK=$(jq -r .approval.seq "$BODY")
echo "# 9. a person reads the ask with its input, and approves it"
call "9. show" 200 GET "/v1/ns/approvals-demo/approvals/$ASK"
expect "9. show" '.state == "pending" and .input.invoice == "INV-9" and .input_verified == true'
call "9. approve" 201 POST "/v1/ns/approvals-demo/approvals/$ASK" '{"decision":"approve","note":"invoice checked"}'
expect "9. approve" '.state == "approved"'
echo "# 10. the agent's next reserve consumes the approval (once): 201 reserved, then commit"
call "10. consume" 201 POST /v1/ns/approvals-demo/effects/reserve '{"idempotency_key":"'"$WIRE"'","execution_id":"exec-4","tool":"wire.transfer","effect":"external","input":{"invoice":"INV-9","amount":4200}}'
expect "10. consume" '.approval.ask_seq == '"$ASK"
RSV=$(reservation)
call "10. commit" 201 POST "/v1/ns/approvals-demo/effects/$WIRE/commit" '{"reservation":"'"$RSV"'","outcome":"succeeded","external_ref":"wt_1"}'
echo "# walk-through OK (run $RUN)"
