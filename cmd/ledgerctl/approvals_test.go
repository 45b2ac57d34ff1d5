package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The policy and approvals commands against a scripted server that answers
// the shapes of docs/design/approvals.md (the real ledgerd is tested with
// them in test/).

const pendingAsk = `{"seq":12,"idempotency_key":"k-order-1234","execution_id":"exec-1","attempt":1,` +
	`"tool":"payments.charge","effect":"external","idempotent":false,"input_hash":"sha256:ab","summary":"charge 12 EUR",` +
	`"actor":"token:agent","asked_at":1764475200000,"expires_at":1764478800000,"state":"pending",` +
	`"answer":null,"consumed_by":null}`

const approvedAsk = `{"seq":12,"idempotency_key":"k-order-1234","execution_id":"exec-1","attempt":1,` +
	`"tool":"payments.charge","effect":"external","idempotent":false,"input_hash":"sha256:ab","summary":"charge 12 EUR",` +
	`"actor":"token:agent","asked_at":1764475200000,"expires_at":1764478800000,"state":"approved",` +
	`"answer":{"seq":13,"decision":"approve","actor":"token:alice","role":"approver","note":"ok","recorded_at":1764475260000},` +
	`"consumed_by":null}`

type scriptedServer struct {
	mu       sync.Mutex
	requests []string // "METHOD URI BODY"
}

func (s *scriptedServer) last() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[len(s.requests)-1]
}

// serveApprovals starts a server with the routes of the tests.
func serveApprovals(t *testing.T) (*httptest.Server, *scriptedServer) {
	t.Helper()
	routes := map[string]struct {
		status int
		body   string
	}{
		"GET /v1/namespaces/payments/policy":          {200, `{"namespace":"payments","policy":{"rules":[{"tool":"payments.*","approval":"required"}]},"seq":3}`},
		"GET /v1/namespaces/default/policy":           {200, `{"namespace":"default","policy":{},"seq":0}`},
		"PUT /v1/namespaces/payments/policy":          {200, `{"namespace":"payments","policy":{"rules":[]},"seq":5,"changed":true,"receipt":{"seq":5,"hash":"ee"}}`},
		"PUT /v1/namespaces/default/policy":           {400, `{"error":{"code":"invalid_request","message":"bad glob","details":{"field":"rules[0].tool"}}}`},
		"GET /v1/ns/payments/approvals?state=pending": {200, `{"approvals":[` + pendingAsk + `],"next_after":12}`},
		"GET /v1/approvals":                           {200, `{"approvals":[],"next_after":null}`},
		"GET /v1/ns/payments/approvals/12":            {200, pendingAsk[:len(pendingAsk)-1] + `,"input":{"amount":1200},"input_verified":true}`},
		"GET /v1/ns/payments/approvals/14":            {200, pendingAsk[:len(pendingAsk)-1] + `,"input":null}`},
		"POST /v1/ns/payments/approvals/12":           {201, approvedAsk},
		"POST /v1/approvals/13":                       {409, `{"error":{"code":"already_answered","message":"rejected before"}}`},
	}
	s := &scriptedServer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		name := r.Method + " " + r.URL.RequestURI()
		s.mu.Lock()
		s.requests = append(s.requests, name+" "+string(body))
		s.mu.Unlock()
		rt, ok := routes[name]
		if !ok {
			rt.status, rt.body = 404, `{"error":{"code":"not_found","message":"no route"}}`
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rt.status)
		_, _ = io.WriteString(w, rt.body)
	}))
	t.Cleanup(srv.Close)
	return srv, s
}

// run runs ledgerctl with args and returns its exit code and outputs.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestPolicyCommand(t *testing.T) {
	t.Parallel()
	srv, s := serveApprovals(t)

	t.Run("OK show", func(t *testing.T) {
		code, out, errOut := run(t, "policy", "show", "--server", srv.URL, "payments")
		require.Equal(t, ExitOK, code, errOut)
		assert.Equal(t, "namespace payments: policy of receipt 3\n{\n  \"rules\": [\n    {\n      \"tool\": \"payments.*\",\n"+
			"      \"approval\": \"required\"\n    }\n  ]\n}\n", out)

		code, out, _ = run(t, "policy", "show", "--server", srv.URL, "default")
		require.Equal(t, ExitOK, code)
		assert.Equal(t, "namespace default: no policy (the gate lets every call through)\n{}\n", out)
	})

	t.Run("OK show json", func(t *testing.T) {
		code, out, _ := run(t, "policy", "show", "--server", srv.URL, "payments", "--json")
		require.Equal(t, ExitOK, code)
		assert.JSONEq(t, `{"namespace":"payments","policy":{"rules":[{"tool":"payments.*","approval":"required"}]},"seq":3}`, out)
	})

	t.Run("OK set", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "policy.json")
		require.NoError(t, os.WriteFile(file, []byte("{\"rules\": []}\n"), 0o600))
		code, out, errOut := run(t, "policy", "set", "--server", srv.URL, "--token", "elt_x", "payments", file)
		require.Equal(t, ExitOK, code, errOut)
		assert.Equal(t, "policy of payments set (receipt 5:ee)\n", out)
		assert.Equal(t, `PUT /v1/namespaces/payments/policy {"rules":[]}`, s.last())
	})

	t.Run("ErrInvalidRequest names the member", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "policy.json")
		require.NoError(t, os.WriteFile(file, []byte(`{"rules":[{"tool":"["}]}`), 0o600))
		code, _, errOut := run(t, "policy", "set", "--server", srv.URL, "default", file)
		assert.Equal(t, ExitUsage, code)
		assert.Contains(t, errOut, "rules[0].tool: ")
	})

	t.Run("ErrNotAnObject", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "policy.json")
		require.NoError(t, os.WriteFile(file, []byte(`[1]`), 0o600))
		code, _, errOut := run(t, "policy", "set", "--server", srv.URL, "payments", file)
		assert.Equal(t, ExitUsage, code)
		assert.Contains(t, errOut, "not a JSON object")
	})

	t.Run("ErrUsage", func(t *testing.T) {
		code, _, errOut := run(t, "policy", "set", "--server", srv.URL, "payments")
		assert.Equal(t, ExitUsage, code)
		assert.Contains(t, errOut, "want NS and FILE")
		code, _, _ = run(t, "policy", "show", "payments")
		assert.Equal(t, ExitUsage, code, "--server is required")
	})
}

func TestApprovalsCommand(t *testing.T) {
	t.Parallel()
	srv, s := serveApprovals(t)

	t.Run("OK list", func(t *testing.T) {
		code, out, errOut := run(t, "approvals", "list", "--server", srv.URL, "-n", "payments", "--state", "pending")
		require.Equal(t, ExitOK, code, errOut)
		assert.Contains(t, out, "SEQ  STATE    TOOL             KEY           ACTOR        ASKED")
		assert.Contains(t, out, "12   pending  payments.charge  k-order-1234  token:agent  2025-11-30T04:00:00Z  2025-11-30T05:00:00Z  -       charge 12 EUR")
		assert.Contains(t, out, "(more: --after 12)")
	})

	t.Run("OK list json", func(t *testing.T) {
		code, out, _ := run(t, "approvals", "list", "--server", srv.URL, "--json")
		require.Equal(t, ExitOK, code)
		assert.JSONEq(t, `{"approvals":[],"next_after":null}`, out)
	})

	t.Run("OK show", func(t *testing.T) {
		code, out, errOut := run(t, "approvals", "show", "--server", srv.URL, "--namespace", "payments", "12")
		require.Equal(t, ExitOK, code, errOut)
		assert.Contains(t, out, "ask         12 (pending)\n")
		assert.Contains(t, out, "tool        payments.charge (external, not idempotent)\n")
		assert.Contains(t, out, "summary     charge 12 EUR\n")
		assert.Contains(t, out, "input (verified against the input hash):\n{\n  \"amount\": 1200\n}\n")

		code, out, _ = run(t, "approvals", "show", "--server", srv.URL, "-n", "payments", "14")
		require.Equal(t, ExitOK, code)
		assert.Contains(t, out, "input: not shown")
	})

	t.Run("OK show json", func(t *testing.T) {
		code, out, _ := run(t, "approvals", "show", "--server", srv.URL, "-n", "payments", "12", "--json")
		require.Equal(t, ExitOK, code)
		var got map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &got))
		assert.Equal(t, map[string]any{"amount": float64(1200)}, got["input"])
		assert.Equal(t, true, got["input_verified"])
	})

	t.Run("OK approve", func(t *testing.T) {
		code, out, errOut := run(t, "approvals", "approve", "--server", srv.URL, "-n", "payments", "12", "--note", "ok")
		require.Equal(t, ExitOK, code, errOut)
		assert.Equal(t, "ask 12 approved by token:alice (approval receipt 13; now approved)\n", out)
		assert.Equal(t, `POST /v1/ns/payments/approvals/12 {"decision":"approve","note":"ok"}`, s.last())
	})

	t.Run("ErrAlreadyAnswered", func(t *testing.T) {
		code, _, errOut := run(t, "approvals", "reject", "--server", srv.URL, "13")
		assert.Equal(t, ExitUsage, code)
		assert.Contains(t, errOut, "already_answered")
		assert.Equal(t, `POST /v1/approvals/13 {"decision":"reject"}`, s.last())
	})

	t.Run("ErrNotFound hints at an older server", func(t *testing.T) {
		code, _, errOut := run(t, "approvals", "show", "--server", srv.URL, "99")
		assert.Equal(t, ExitUsage, code)
		assert.Contains(t, errOut, "before v1.3")
	})

	t.Run("ErrUsage", func(t *testing.T) {
		for _, args := range [][]string{
			{"approvals", "show", "--server", srv.URL, "x"},
			{"approvals", "approve", "--server", srv.URL},
			{"approvals", "list", "--server", srv.URL, "--state", "maybe"},
			{"approvals", "frobnicate"},
		} {
			code, _, _ := run(t, args...)
			assert.Equal(t, ExitUsage, code, args)
		}
	})
}
