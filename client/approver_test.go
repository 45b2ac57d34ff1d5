package client_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
)

// route is one scripted answer of approverLedger.
type route struct {
	status int
	body   string
}

// approverLedger answers "METHOD PATH?QUERY" from routes and returns the
// last request body sent to each; anything else is a 404 not_found.
func approverLedger(t *testing.T, routes map[string]route) (*httptest.Server, func(string) string) {
	t.Helper()
	var mu sync.Mutex
	bodies := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		name := r.Method + " " + r.URL.RequestURI()
		mu.Lock()
		bodies[name] = string(data)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		rt, ok := routes[name]
		if !ok {
			rt = route{404, `{"error":{"code":"not_found","message":"` + name + `"}}`}
		}
		w.WriteHeader(rt.status)
		_, _ = io.WriteString(w, rt.body)
	}))
	t.Cleanup(srv.Close)
	return srv, func(name string) string {
		mu.Lock()
		defer mu.Unlock()
		return bodies[name]
	}
}

// pendingAsk is an Approval object of the documented shape.
const pendingAsk = `{"seq":12,"idempotency_key":"k-order-1234","execution_id":"exec-1","attempt":1,` +
	`"tool":"payments.charge","effect":"external","idempotent":false,"input_hash":"sha256:ab","summary":"charge 12 EUR",` +
	`"actor":"token:agent","asked_at":1764475200000,"expires_at":1764478800000,"state":"pending",` +
	`"answer":null,"consumed_by":null}`

const answeredAsk = `{"seq":12,"idempotency_key":"k-order-1234","execution_id":"exec-1","attempt":1,` +
	`"tool":"payments.charge","effect":"external","idempotent":false,"input_hash":"sha256:ab","summary":"",` +
	`"actor":"token:agent","asked_at":1764475200000,"expires_at":1764478800000,"state":"consumed",` +
	`"answer":{"seq":13,"decision":"approve","actor":"token:alice","role":"approver","note":"ok","recorded_at":1764475260000},` +
	`"consumed_by":{"seq":14,"execution_id":"exec-1","attempt":2}}`

func TestClient_Policy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	policy := `{"rules":[{"tool":"payments.*","approval":"required","approvers":["role:approver"],"expires_in_ms":3600000},` +
		`{"tool":"shell.rm*","deny":true}],"self_approval":"deny"}`
	srv, bodies := approverLedger(t, map[string]route{
		"GET /v1/namespaces/payments/policy": {200, `{"namespace":"payments","policy":` + policy + `,"seq":3}`},
		"PUT /v1/namespaces/payments/policy": {200, `{"namespace":"payments","policy":` + policy + `,"seq":5,"changed":true,"receipt":{"seq":5,"hash":"ee"}}`},
		"GET /v1/namespaces/default/policy":  {200, `{"namespace":"default","policy":{},"seq":0}`},
	})

	t.Run("OK the namespace's route is /v1/namespaces/{ns}", func(t *testing.T) {
		c, err := client.New(srv.URL, client.WithNamespace("payments"))
		require.NoError(t, err)
		got, err := c.Policy(ctx)
		require.NoError(t, err)
		assert.Equal(t, "payments", got.Namespace)
		assert.Equal(t, uint64(3), got.Seq)
		var p client.Policy
		require.NoError(t, json.Unmarshal(got.Policy, &p))
		require.Len(t, p.Rules, 2)
		assert.Equal(t, []string{"role:approver"}, p.Rules[0].Approvers)
		assert.Equal(t, int64(3600000), p.Rules[0].ExpiresInMS)
		require.NotNil(t, p.Rules[1].Deny)
		assert.True(t, *p.Rules[1].Deny)
		assert.Equal(t, "deny", p.SelfApproval)
	})

	t.Run("OK default", func(t *testing.T) {
		c, err := client.New(srv.URL)
		require.NoError(t, err)
		got, err := c.Policy(ctx)
		require.NoError(t, err)
		assert.Equal(t, uint64(0), got.Seq)
		assert.JSONEq(t, `{}`, string(got.Policy))
	})

	t.Run("OK set", func(t *testing.T) {
		c, err := client.New(srv.URL, client.WithNamespace("payments"))
		require.NoError(t, err)
		deny := false
		p := client.Policy{Rules: []client.PolicyRule{
			{Tool: "shell.rm-safe", Deny: &deny},
			{Tool: "payments.*", Approval: "required"},
			{Tool: "*", RepeatFailure: "refuse", RepeatWindowMS: 86400000},
		}}
		got, err := c.SetPolicy(ctx, p)
		require.NoError(t, err)
		assert.True(t, got.Changed)
		assert.Equal(t, &client.ReceiptRef{Seq: 5, Hash: "ee"}, got.Receipt)
		assert.JSONEq(t, `{"rules":[{"tool":"shell.rm-safe","deny":false},{"tool":"payments.*","approval":"required"},`+
			`{"tool":"*","repeat_failure":"refuse","repeat_window_ms":86400000}]}`, bodies("PUT /v1/namespaces/payments/policy"))

		_, err = c.SetPolicy(ctx, json.RawMessage(policy))
		require.NoError(t, err)
		assert.JSONEq(t, policy, bodies("PUT /v1/namespaces/payments/policy"), "raw JSON is sent as it is")
	})
}

func TestClient_Approvals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, bodies := approverLedger(t, map[string]route{
		"GET /v1/ns/payments/approvals?after=11&limit=2&state=pending": {200, `{"approvals":[` + pendingAsk + `],"next_after":12}`},
		"GET /v1/ns/payments/approvals":                                {200, `{"approvals":[` + answeredAsk + `],"next_after":null}`},
		"GET /v1/ns/payments/approvals/12": {200, pendingAsk[:len(pendingAsk)-1] +
			`,"input":{"amount":1200},"input_verified":true}`},
		"GET /v1/ns/payments/approvals/13":  {404, `{"error":{"code":"unknown_approval","message":"no ask at seq 13"}}`},
		"POST /v1/ns/payments/approvals/12": {201, answeredAsk},
		"POST /v1/ns/payments/approvals/14": {409, `{"error":{"code":"already_answered","message":"rejected before"}}`},
	})
	c, err := client.New(srv.URL, client.WithNamespace("payments"))
	require.NoError(t, err)

	t.Run("OK list", func(t *testing.T) {
		list, next, err := c.Approvals(ctx, client.ApprovalPending, 11, 2)
		require.NoError(t, err)
		assert.Equal(t, uint64(12), next)
		require.Len(t, list, 1)
		a := list[0]
		assert.Equal(t, uint64(12), a.Seq)
		assert.Equal(t, "k-order-1234", a.IdempotencyKey)
		assert.Equal(t, client.ClassExternal, a.Class)
		assert.Equal(t, "charge 12 EUR", a.Summary)
		assert.Equal(t, time.UnixMilli(1764475200000), a.AskedAt)
		assert.Equal(t, time.UnixMilli(1764478800000), a.ExpiresAt)
		assert.Equal(t, "pending", a.State)
		assert.Nil(t, a.Answer)
		assert.Nil(t, a.ConsumedBy)

		list, next, err = c.Approvals(ctx, "", 0, 0)
		require.NoError(t, err)
		assert.Zero(t, next)
		require.Len(t, list, 1)
		assert.Equal(t, &client.Answer{Seq: 13, Decision: client.Approve, Actor: "token:alice", Role: "approver",
			Note: "ok", RecordedAt: time.UnixMilli(1764475260000)}, list[0].Answer)
		assert.Equal(t, &client.Consumption{Seq: 14, ExecutionID: "exec-1", Attempt: 2}, list[0].ConsumedBy)
		assert.False(t, list[0].InputShown, "a list shows no input")
	})

	t.Run("OK show with the input", func(t *testing.T) {
		a, err := c.Approval(ctx, 12)
		require.NoError(t, err)
		assert.JSONEq(t, `{"amount":1200}`, string(a.Input))
		assert.True(t, a.InputVerified)
		assert.True(t, a.InputShown)
	})

	t.Run("ErrUnknownApproval", func(t *testing.T) {
		_, err := c.Approval(ctx, 13)
		assert.ErrorIs(t, err, client.ErrUnknownApproval)
	})

	t.Run("OK answer", func(t *testing.T) {
		a, err := c.Answer(ctx, 12, client.Approve, "ok")
		require.NoError(t, err)
		assert.False(t, a.Repeat)
		assert.Equal(t, client.Approve, a.Answer.Decision)
		assert.JSONEq(t, `{"decision":"approve","note":"ok"}`, bodies("POST /v1/ns/payments/approvals/12"))
	})

	t.Run("ErrAlreadyAnswered", func(t *testing.T) {
		_, err := c.Answer(ctx, 14, client.Reject, "")
		assert.ErrorIs(t, err, client.ErrAlreadyAnswered)
		assert.JSONEq(t, `{"decision":"reject"}`, bodies("POST /v1/ns/payments/approvals/14"))
	})

	t.Run("ErrDecision", func(t *testing.T) {
		_, err := c.Answer(ctx, 12, "maybe", "")
		assert.ErrorContains(t, err, "maybe")
	})
}

func TestClient_Answer_repeat(t *testing.T) {
	t.Parallel()
	srv, _ := approverLedger(t, map[string]route{"POST /v1/approvals/12": {200, answeredAsk}})
	c, err := client.New(srv.URL)
	require.NoError(t, err)
	a, err := c.Answer(context.Background(), 12, client.Approve, "")
	require.NoError(t, err)
	assert.True(t, a.Repeat, "the same decision again: 200 and the original")
}
