package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/testkit/openapicheck"
)

// The exchanges of docs/design/approvals.md, checked against
// api/openapi.yaml: the document describes the shapes the design fixes
// (the server's own answers are checked by test/openapi_walk_test.go).

const (
	apHash  = "c536a7804a3ee6fc1e44013c9550bcb8eb839e87df00f32e9462edc720f7771d"
	apToken = "rsv_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	apAsk   = `{"seq":12,"idempotency_key":"k-order-1234","execution_id":"exec-1","attempt":1,"tool":"payments.charge",` +
		`"effect":"external","idempotent":false,"input_hash":"sha256:ab","summary":"charge 12 EUR","actor":"token:agent",` +
		`"asked_at":1764475200000,"expires_at":1764478800000,"state":"pending","answer":null,"consumed_by":null}`
	apAnswered = `{"seq":12,"idempotency_key":"k-order-1234","execution_id":"exec-1","attempt":1,"tool":"payments.charge",` +
		`"effect":"external","idempotent":false,"input_hash":"sha256:ab","summary":"","actor":"token:agent",` +
		`"asked_at":1764475200000,"expires_at":1764478800000,"state":"consumed",` +
		`"answer":{"seq":13,"decision":"approve","actor":"token:alice","role":"approver","note":"ok","recorded_at":1764475260000},` +
		`"consumed_by":{"seq":14,"execution_id":"exec-1","attempt":1}}`
	apPolicy = `{"rules":[{"tool":"payments.*","approval":"required","approvers":["role:approver"],"expires_in_ms":3600000},` +
		`{"tool":"shell.rm*","deny":true},{"tool":"*","repeat_failure":"refuse","repeat_window_ms":86400000}],"self_approval":"deny"}`
	apReserve = `{"idempotency_key":"k-order-1234","execution_id":"exec-1","tool":"payments.charge","effect":"external",` +
		`"input":{"amount":1200},"approval_summary":"charge 12 EUR","changed":{"strategy":"smaller amount"},"wait_ms":1000}`
)

func apError(code, details string) string {
	return `{"error":{"code":"` + code + `","message":"m","details":` + details + `}}`
}

func TestOpenAPI_approvals(t *testing.T) {
	t.Parallel()
	doc, err := openapicheck.Load()
	require.NoError(t, err)
	for _, tc := range []struct {
		desc    string
		x       openapicheck.Exchange
		wantOp  string
		wantErr string
	}{
		{desc: "OK reserve 202", wantOp: "POST /v1/effects/reserve", x: openapicheck.JSONExchange("POST", "/v1/effects/reserve", apReserve, 202,
			`{"status":"approval_required","idempotency_key":"k-order-1234","key_generated":false,`+
				`"approval":{"seq":12,"expires_at":1764478800000,"state":"pending"},"receipt":{"seq":12,"hash":"`+apHash+`"}}`)},
		{desc: "OK reserve 201 consuming an approval", wantOp: "POST /v1/ns/{ns}/effects/reserve", x: openapicheck.JSONExchange("POST", "/v1/ns/payments/effects/reserve", apReserve, 201,
			`{"status":"reserved","idempotency_key":"k-order-1234","key_generated":false,"reservation":"`+apToken+`",`+
				`"attempt":1,"lease_expires_at":1764475230000,"takeover":false,"retry":false,`+
				`"approval":{"seq":13,"ask_seq":12},"receipt":{"seq":14,"hash":"`+apHash+`"}}`)},
		{desc: "OK reserve key_required", x: openapicheck.JSONExchange("POST", "/v1/effects/reserve", apReserve, 400, apError("key_required", "{}"))},
		{desc: "OK reserve effect_class_mismatch", x: openapicheck.JSONExchange("POST", "/v1/effects/reserve", apReserve, 422, apError("effect_class_mismatch", "{}"))},
		{desc: "OK reserve denied_by_policy", x: openapicheck.JSONExchange("POST", "/v1/effects/reserve", apReserve, 403,
			apError("denied_by_policy", `{"rule":1,"tool":"shell.rm*","receipt":{"seq":3,"hash":"`+apHash+`"}}`))},
		{desc: "OK reserve forbidden", x: openapicheck.JSONExchange("POST", "/v1/effects/reserve", apReserve, 403, apError("forbidden", "{}"))},
		{desc: "OK reserve approval_rejected", x: openapicheck.JSONExchange("POST", "/v1/ns/payments/effects/reserve", apReserve, 409,
			apError("approval_rejected", `{"approval":{"seq":13,"ask_seq":12,"note":"no","actor":"token:alice"}}`))},
		{desc: "OK reserve unchanged_retry", x: openapicheck.JSONExchange("POST", "/v1/effects/reserve", apReserve, 409,
			apError("unchanged_retry", `{"failed":{"idempotency_key":"k1","seq":3,"error_code":"DECLINED","error_message":"no"}}`))},
		{desc: "OK policy get", wantOp: "GET /v1/namespaces/{ns}/policy", x: openapicheck.JSONExchange("GET", "/v1/namespaces/payments/policy", "", 200,
			`{"namespace":"payments","policy":`+apPolicy+`,"seq":3}`)},
		{desc: "OK policy get none", x: openapicheck.JSONExchange("GET", "/v1/namespaces/default/policy", "", 200, `{"namespace":"default","policy":{},"seq":0}`)},
		{desc: "OK policy put", wantOp: "PUT /v1/namespaces/{ns}/policy", x: openapicheck.JSONExchange("PUT", "/v1/namespaces/payments/policy", apPolicy, 200,
			`{"namespace":"payments","policy":`+apPolicy+`,"seq":5,"changed":true,"receipt":{"seq":5,"hash":"`+apHash+`"}}`)},
		{desc: "OK policy put unchanged", x: openapicheck.JSONExchange("PUT", "/v1/namespaces/payments/policy", `{}`, 200,
			`{"namespace":"payments","policy":{},"seq":5,"changed":false,"receipt":null}`)},
		{desc: "ErrPolicyUnknownMember", x: openapicheck.JSONExchange("PUT", "/v1/namespaces/payments/policy", `{"rules":[{"tool":"*","colour":"red"}]}`, 200,
			`{"namespace":"payments","policy":{},"seq":5,"changed":true,"receipt":null}`), wantErr: "forbids"},
		{desc: "OK approvals list", wantOp: "GET /v1/ns/{ns}/approvals", x: openapicheck.JSONExchange("GET", "/v1/ns/payments/approvals?state=pending&after=11&limit=2", "", 200,
			`{"approvals":[`+apAsk+`,`+apAnswered+`],"next_after":12}`)},
		{desc: "OK approvals list last page", wantOp: "GET /v1/approvals", x: openapicheck.JSONExchange("GET", "/v1/approvals", "", 200, `{"approvals":[],"next_after":null}`)},
		{desc: "ErrApprovalsState", x: openapicheck.JSONExchange("GET", "/v1/approvals?state=maybe", "", 200, `{"approvals":[],"next_after":null}`), wantErr: "forbids"},
		{desc: "OK approval with input", wantOp: "GET /v1/approvals/{seq}", x: openapicheck.JSONExchange("GET", "/v1/approvals/12", "", 200,
			strings.TrimSuffix(apAsk, "}")+`,"input":{"amount":1200},"input_verified":true}`)},
		{desc: "OK approval input deleted", x: openapicheck.JSONExchange("GET", "/v1/ns/payments/approvals/12", "", 200,
			strings.TrimSuffix(apAnswered, "}")+`,"input":null,"input_verified":false}`)},
		{desc: "OK approval unknown", x: openapicheck.JSONExchange("GET", "/v1/approvals/99", "", 404, apError("unknown_approval", "{}"))},
		{desc: "OK answer", wantOp: "POST /v1/ns/{ns}/approvals/{seq}", x: openapicheck.JSONExchange("POST", "/v1/ns/payments/approvals/12",
			`{"decision":"approve","note":"ok"}`, 201, apAnswered)},
		{desc: "OK answer again", x: openapicheck.JSONExchange("POST", "/v1/approvals/12", `{"decision":"approve"}`, 200, apAnswered)},
		{desc: "OK answer errors", x: openapicheck.JSONExchange("POST", "/v1/approvals/12", `{"decision":"reject"}`, 409, apError("already_answered", "{}"))},
		{desc: "OK answer expired", x: openapicheck.JSONExchange("POST", "/v1/approvals/12", `{"decision":"reject"}`, 410, apError("approval_expired", "{}"))},
		{desc: "OK answer self", x: openapicheck.JSONExchange("POST", "/v1/approvals/12", `{"decision":"approve"}`, 403, apError("self_approval", "{}"))},
		{desc: "ErrAnswerDecision", x: openapicheck.JSONExchange("POST", "/v1/approvals/12", `{"decision":"maybe"}`, 201, apAnswered), wantErr: "forbids"},
		{desc: "OK policy receipt", x: openapicheck.JSONExchange("GET", "/v1/receipts/1", "", 200,
			`{"seq":1,"kind":"policy","idempotency_key":"","key_generated":false,"execution_id":"","attempt":0,"tool":"",`+
				`"effect":"","idempotent":false,"input_hash":"","outcome":"","external_ref":"","result":`+apPolicy+`,`+
				`"error_code":"","error_message":"","retryable":false,"lease_expires_at":0,"ref_seq":0,"actor":"ops",`+
				`"note":"","recorded_at":1764475200000,"prev_hash":"`+apHash+`","hash":"`+apHash+`"}`)},
		{desc: "OK key awaiting approval", x: openapicheck.JSONExchange("GET", "/v1/effects/k-order-1234", "", 200,
			`{"idempotency_key":"k-order-1234","state":"awaiting_approval","tool":"payments.charge","effect":"external",`+
				`"idempotent":false,"input_hash":"sha256:ab","receipts":[{"seq":12,"kind":"ask","idempotency_key":"k-order-1234",`+
				`"key_generated":false,"execution_id":"exec-1","attempt":1,"tool":"payments.charge","effect":"external",`+
				`"idempotent":false,"input_hash":"sha256:ab","outcome":"","external_ref":"","result":{"input_hash":"sha256:ab","summary":""},`+
				`"error_code":"","error_message":"","retryable":false,"lease_expires_at":1764478800000,"ref_seq":0,"actor":"token:agent",`+
				`"note":"","recorded_at":1764475200000,"prev_hash":"`+apHash+`","hash":"`+apHash+`"}]}`)},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			op, err := doc.Check(context.Background(), tc.x)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			if tc.wantOp != "" {
				assert.Equal(t, tc.wantOp, op)
			}
		})
	}
}
