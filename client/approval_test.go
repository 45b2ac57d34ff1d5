package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effect-ledger/effect-ledger/client"
)

// fakeLedger answers reserves from a script of answers, one per reserve,
// and commits with 201; it records every request.
type fakeLedger struct {
	mu       sync.Mutex
	reserves []string // the scripted answers: "STATUS BODY"
	requests []recorded
}

type recorded struct {
	Method, Path, Query string
	Body                map[string]any
}

func (f *fakeLedger) serve(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		rec := recorded{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery}
		if len(data) > 0 {
			require.NoError(t, json.Unmarshal(data, &rec.Body))
		}
		f.mu.Lock()
		f.requests = append(f.requests, rec)
		var status int
		var body string
		switch {
		case r.URL.Path == "/v1/effects/reserve" && len(f.reserves) > 0:
			status, body = 0, f.reserves[0]
			f.reserves = f.reserves[1:]
		case r.URL.Path == "/v1/effects/reserve":
			status, body = 500, `{"error":{"code":"internal","message":"script ran out"}}`
		default:
			status, body = 201, `{"status":"committed","idempotency_key":"order-1234","outcome":"succeeded","late":false,"receipt":{"seq":4,"hash":"cc"}}`
		}
		f.mu.Unlock()
		if status == 0 { // "STATUS BODY"
			code, err := strconv.Atoi(body[:3])
			require.NoError(t, err)
			status, body = code, body[4:]
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func (f *fakeLedger) reserveBodies() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []map[string]any
	for _, r := range f.requests {
		if r.Path == "/v1/effects/reserve" {
			out = append(out, r.Body)
		}
	}
	return out
}

// Answers of the documented shapes (docs/design/approvals.md).
const (
	askPending = `202 {"status":"approval_required","idempotency_key":"order-1234","key_generated":false,` +
		`"approval":{"seq":7,"expires_at":4102444800000,"state":"pending"},"receipt":{"seq":7,"hash":"aa"}}`
	askAgain = `202 {"status":"approval_required","idempotency_key":"order-1234","key_generated":false,` +
		`"approval":{"seq":9,"expires_at":4102444800000,"state":"pending"},"receipt":{"seq":9,"hash":"bb"}}`
	askExpired = `202 {"status":"approval_required","idempotency_key":"order-1234","key_generated":false,` +
		`"approval":{"seq":7,"expires_at":1000,"state":"pending"},"receipt":{"seq":7,"hash":"aa"}}`
	approvedReserve = `201 {"status":"reserved","idempotency_key":"order-1234","key_generated":false,` +
		`"reservation":"rsv_` + "0000000000000000000000000000000000000000000000000000000000000001" + `","attempt":1,` +
		`"lease_expires_at":4102444800000,"approval":{"seq":8,"ask_seq":7},"receipt":{"seq":9,"hash":"dd"}}`
	rejected = `409 {"error":{"code":"approval_rejected","message":"rejected by token:alice","details":` +
		`{"approval":{"seq":8,"ask_seq":7,"note":"too large","actor":"token:alice"}}}}`
)

func charge() client.Effect {
	return client.Effect{Tool: "payments.charge", Class: client.ClassExternal, Key: "order-1234",
		ExecutionID: "exec-1", Input: map[string]any{"amount": 1200}, SendInput: true,
		ApprovalSummary: "charge 12 EUR", Changed: &client.Changed{Strategy: "smaller amount"}}
}

// noSleep records the waits instead of spending them.
func noSleep(waits *[]time.Duration) client.Option {
	var mu sync.Mutex
	return client.WithSleep(func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		*waits = append(*waits, d)
		mu.Unlock()
		return ctx.Err()
	})
}

func TestClient_Reserve_approvalRequired(t *testing.T) {
	t.Parallel()
	f := &fakeLedger{reserves: []string{askPending}}
	srv := f.serve(t).URL
	c, err := client.New(srv + "/")
	require.NoError(t, err)
	_, err = c.Reserve(context.Background(), client.ReserveRequest{Key: "order-1234", ExecutionID: "exec-1",
		Tool: "payments.charge", Class: client.ClassExternal, Input: json.RawMessage(`{"amount":1200}`),
		ApprovalSummary: "charge 12 EUR", Changed: &client.Changed{ContextHash: "sha256:ab"}})
	var are *client.ApprovalRequiredError
	require.ErrorAs(t, err, &are)
	assert.ErrorIs(t, err, client.ErrApprovalRequired)
	assert.Equal(t, "order-1234", are.IdempotencyKey)
	assert.Equal(t, uint64(7), are.Seq)
	assert.Equal(t, "pending", are.State)
	assert.Equal(t, time.UnixMilli(4102444800000), are.ExpiresAt)
	assert.Equal(t, client.ReceiptRef{Seq: 7, Hash: "aa"}, are.Receipt)
	assert.NoError(t, are.Err)
	assert.Equal(t, srv+"/ui/#approvals/7", are.URL, "the page where a person answers it, as ledger-mcp names it")
	for _, want := range []string{"ask 7", "expires 2100-01-01T00:00:00Z", srv + "/ui/#approvals/7", "ledgerctl approvals approve 7 --server " + srv + ")"} {
		assert.Contains(t, err.Error(), want)
	}

	body := f.reserveBodies()[0]
	assert.Equal(t, map[string]any{"amount": float64(1200)}, body["input"])
	assert.NotContains(t, body, "input_hash")
	assert.Equal(t, "charge 12 EUR", body["approval_summary"])
	assert.Equal(t, map[string]any{"context_hash": "sha256:ab"}, body["changed"])
}

func TestClient_Do_approval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	run := func(t *testing.T, script []string, opts ...client.Option) (*client.Result, *fakeLedger, int, error) {
		f := &fakeLedger{reserves: script}
		c, err := client.New(f.serve(t).URL, opts...)
		require.NoError(t, err)
		runs := 0
		res, err := c.Do(ctx, charge(), func(context.Context, string) (client.Outcome, error) {
			runs++
			return client.Outcome{ExternalRef: "ch_1"}, nil
		})
		return res, f, runs, err
	}

	t.Run("OK without a wait the ask is the error and nothing runs", func(t *testing.T) {
		_, f, runs, err := run(t, []string{askPending})
		var are *client.ApprovalRequiredError
		require.ErrorAs(t, err, &are)
		assert.Equal(t, uint64(7), are.Seq)
		assert.Zero(t, runs)
		body := f.reserveBodies()[0]
		assert.Equal(t, `{"amount":1200}`, mustJSON(t, body["input"]), "the input is sent, not its fingerprint")
		assert.NotContains(t, body, "input_hash")
		assert.Equal(t, map[string]any{"strategy": "smaller amount"}, body["changed"])
	})

	t.Run("OK waiting: the approval is consumed and the function runs once", func(t *testing.T) {
		var waits []time.Duration
		res, f, runs, err := run(t, []string{askPending, askPending, approvedReserve},
			client.WithApprovalWait(time.Hour), client.WithWait(0), client.WithPollInterval(time.Second), noSleep(&waits))
		require.NoError(t, err)
		assert.Equal(t, 1, runs)
		assert.Equal(t, &client.ApprovalUse{Seq: 8, AskSeq: 7}, res.Approval)
		assert.Len(t, f.reserveBodies(), 3)
		assert.Equal(t, []time.Duration{time.Second, time.Second}, waits, "polled at the poll interval")
	})

	t.Run("OK waiting sends wait_ms", func(t *testing.T) {
		var waits []time.Duration
		_, f, _, err := run(t, []string{askPending, approvedReserve},
			client.WithApprovalWait(time.Hour), client.WithWait(30*time.Second), noSleep(&waits))
		require.NoError(t, err)
		for _, b := range f.reserveBodies() {
			assert.Equal(t, float64(30_000), b["wait_ms"])
		}
	})

	t.Run("ErrApprovalRejected", func(t *testing.T) {
		var waits []time.Duration
		_, _, runs, err := run(t, []string{askPending, rejected}, client.WithApprovalWait(time.Hour), noSleep(&waits))
		require.ErrorIs(t, err, client.ErrApprovalRejected)
		assert.Zero(t, runs)
		rej, ok := client.RejectionOf(err)
		require.True(t, ok)
		assert.Equal(t, &client.Rejection{Seq: 8, AskSeq: 7, Note: "too large", Actor: "token:alice"}, rej)
		_, ok = client.RejectionOf(errors.New("other"))
		assert.False(t, ok)
	})

	t.Run("ErrApprovalExpired the ask expired", func(t *testing.T) {
		_, f, runs, err := run(t, []string{askExpired}, client.WithApprovalWait(time.Hour))
		var are *client.ApprovalRequiredError
		require.ErrorAs(t, err, &are)
		assert.ErrorIs(t, err, client.ErrApprovalExpired)
		assert.Zero(t, runs)
		assert.Len(t, f.reserveBodies(), 1, "an expired ask is not asked again")
	})

	t.Run("ErrApprovalExpired the ledger asked again", func(t *testing.T) {
		var waits []time.Duration
		_, _, _, err := run(t, []string{askPending, askAgain}, client.WithApprovalWait(time.Hour), noSleep(&waits))
		var are *client.ApprovalRequiredError
		require.ErrorAs(t, err, &are)
		assert.ErrorIs(t, err, client.ErrApprovalExpired)
		assert.Equal(t, uint64(9), are.Seq, "the new ask")
	})

	t.Run("ErrContext the caller gave up", func(t *testing.T) {
		f := &fakeLedger{reserves: []string{askPending, askPending}}
		cctx, cancel := context.WithCancel(ctx)
		c, err := client.New(f.serve(t).URL, client.WithApprovalWait(time.Hour), client.WithWait(0),
			client.WithSleep(func(ctx context.Context, d time.Duration) error { cancel(); return ctx.Err() }))
		require.NoError(t, err)
		_, err = c.Do(cctx, charge(), func(context.Context, string) (client.Outcome, error) {
			t.Fatal("ran")
			return client.Outcome{}, nil
		})
		var are *client.ApprovalRequiredError
		require.ErrorAs(t, err, &are)
		assert.ErrorIs(t, err, context.Canceled)
	})

	t.Run("ErrSendInput with InputHash", func(t *testing.T) {
		c, err := client.New("127.0.0.1:1")
		require.NoError(t, err)
		e := charge()
		e.InputHash = "sha256:00"
		_, err = c.Do(ctx, e, func(context.Context, string) (client.Outcome, error) { return client.Outcome{}, nil })
		assert.ErrorContains(t, err, "SendInput")
	})
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestClient_WithApprovalWait(t *testing.T) {
	t.Parallel()
	_, err := client.New("x:1", client.WithApprovalWait(-time.Second))
	assert.ErrorContains(t, err, "approval wait")
}

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
