package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/effect-ledger/effect-ledger/client"
)

// Gateway serves POST /tools/{tool}: it runs the tool through the ledger
// client, so that a tool call repeated by the model, the runtime or
// another replica is answered from the ledger instead of running twice.
type Gateway struct {
	ledger *client.Client
	logger *slog.Logger
	psp    *fakePSP
	smtp   *fakeSMTP
	mux    *http.ServeMux
}

// NewGateway returns a gateway whose tools record their effects in the
// ledger behind lc.
func NewGateway(lc *client.Client, logger *slog.Logger) *Gateway {
	g := &Gateway{ledger: lc, logger: logger, psp: &fakePSP{refunds: map[string]string{}},
		smtp: &fakeSMTP{}, mux: http.NewServeMux()}
	g.mux.HandleFunc("POST /tools/payments.refund", g.handleRefund)
	g.mux.HandleFunc("POST /tools/email.send", g.handleEmail)
	g.mux.HandleFunc("GET /stats", g.handleStats)
	return g
}

func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.mux.ServeHTTP(w, r) }

// toolCall is the body of POST /tools/{tool}: what a model's tool call
// carries.
type toolCall struct {
	ExecutionID string          `json:"execution_id"` // the model's tool-call id
	Attempt     uint64          `json:"attempt"`      // the runtime's retry number
	Key         string          `json:"key"`          // optional; derived from the input otherwise
	Input       json.RawMessage `json:"input"`
}

// toolReply is the answer of a tool call.
type toolReply struct {
	Key         string          `json:"key"`
	Replayed    bool            `json:"replayed"`
	ExternalRef string          `json:"external_ref"`
	Result      json.RawMessage `json:"result"`
}

func (g *Gateway) handleRefund(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Order  int64 `json:"order"`
		Amount int64 `json:"amount"`
	}
	call, ok := g.decode(w, r, &in)
	if !ok {
		return
	}
	e := client.Effect{Tool: "payments.refund", Class: client.ClassWrite, Input: call.Input, Key: call.Key,
		ExecutionID: call.ExecutionID, Attempt: call.Attempt,
		Idempotent: true} // the PSP dedupes on the key it is given
	g.run(w, r, e, func(ctx context.Context, key string) (client.Outcome, error) {
		if in.Amount <= 0 || in.Amount > 100_000 {
			return client.Outcome{}, client.Permanent("AMOUNT_INVALID", fmt.Errorf("amount %d is not refundable", in.Amount))
		}
		id := g.psp.refund(key, in.Order, in.Amount)
		return client.Outcome{ExternalRef: id, Result: map[string]any{"refund_id": id, "order": in.Order, "amount": in.Amount}}, nil
	})
}

func (g *Gateway) handleEmail(w http.ResponseWriter, r *http.Request) {
	var in struct {
		To      string `json:"to"`
		Subject string `json:"subject"`
		DelayMS int    `json:"delay_ms"` // makes the send slow, to show concurrent calls waiting
	}
	call, ok := g.decode(w, r, &in)
	if !ok {
		return
	}
	e := client.Effect{Tool: "email.send", Class: client.ClassExternal, Input: call.Input, Key: call.Key,
		ExecutionID: call.ExecutionID, Attempt: call.Attempt,
		Idempotent: false, // SMTP has no dedupe: an interrupted send needs a person
		Lease:      time.Duration(in.DelayMS)*time.Millisecond + 30*time.Second}
	g.run(w, r, e, func(ctx context.Context, key string) (client.Outcome, error) {
		if !strings.Contains(in.To, "@") {
			return client.Outcome{}, client.Permanent("BAD_ADDRESS", fmt.Errorf("%q is not an address", in.To))
		}
		time.Sleep(time.Duration(in.DelayMS) * time.Millisecond)
		id := g.smtp.send(in.To, in.Subject)
		return client.Outcome{ExternalRef: id, Result: map[string]any{"message_id": id}}, nil
	})
}

// decode reads a tool call and its input into in.
func (g *Gateway) decode(w http.ResponseWriter, r *http.Request, in any) (*toolCall, bool) {
	var call toolCall
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&call); err != nil || len(call.Input) == 0 {
		writeError(w, http.StatusBadRequest, "bad_request", "body must be {execution_id, attempt, key, input}")
		return nil, false
	}
	if err := json.Unmarshal(call.Input, in); err != nil {
		writeError(w, http.StatusBadRequest, "bad_input", err.Error())
		return nil, false
	}
	return &call, true
}

// run calls the tool through the ledger and maps the outcome to HTTP.
func (g *Gateway) run(w http.ResponseWriter, r *http.Request, e client.Effect, fn client.Func) {
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second) // how long a caller waits for a busy key
	defer cancel()
	res, err := g.ledger.Do(ctx, e, fn)
	var effectErr *client.EffectError
	var commitErr *client.CommitError
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, toolReply{Key: res.Key, Replayed: res.Replayed, ExternalRef: res.ExternalRef, Result: res.Result})
	case errors.As(err, &effectErr):
		writeError(w, http.StatusBadGateway, effectErr.Failure.Code, effectErr.Failure.Message)
	case errors.As(err, &commitErr):
		// The effect happened; the ledger did not hear of it. Keep what
		// is needed to record it later (here: the log).
		g.logger.Error("effect ran but is not recorded", "key", commitErr.Key,
			"reservation", commitErr.Reservation, "outcome", commitErr.Commit.Outcome, "err", commitErr.Err)
		writeError(w, http.StatusInternalServerError, "not_recorded", "the effect ran but the ledger could not record it")
	case errors.Is(err, client.ErrInProgress):
		writeError(w, http.StatusConflict, "in_progress", "another call of this tool with this input is still running")
	case errors.Is(err, client.ErrUnsafeResume):
		writeError(w, http.StatusConflict, "unsafe_resume", "an earlier call was interrupted and may have happened; an operator must resolve it")
	case errors.Is(err, client.ErrRetryNotAllowed):
		writeError(w, http.StatusConflict, "retry_not_allowed", "this call already failed and may not be retried")
	case errors.Is(err, client.ErrFingerprintMismatch):
		writeError(w, http.StatusUnprocessableEntity, "key_reused", "this key was used for another call")
	default:
		g.logger.Error("tool call failed", "tool", e.Tool, "err", err)
		writeError(w, http.StatusServiceUnavailable, "ledger_unavailable", "the ledger cannot be reached")
	}
}

func (g *Gateway) handleStats(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]int{"payments.refund": g.psp.runs(), "email.send": g.smtp.runs()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// fakePSP is a payment provider that dedupes refunds on the idempotency
// key it is given, as real ones do.
type fakePSP struct {
	mu      sync.Mutex
	refunds map[string]string // key → refund id
	n       int               // refund calls received
}

func (p *fakePSP) refund(key string, order, amount int64) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++ // every call counts: the gateway's job is to make this 1 per key
	if id, ok := p.refunds[key]; ok {
		return id
	}
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d/%d", key, order, amount))
	id := "re_" + hex.EncodeToString(sum[:6])
	p.refunds[key] = id
	return id
}

func (p *fakePSP) runs() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// fakeSMTP sends every message it is given: it cannot dedupe.
type fakeSMTP struct {
	mu sync.Mutex
	n  int
}

func (s *fakeSMTP) send(to, subject string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return fmt.Sprintf("msg_%04d", s.n)
}

func (s *fakeSMTP) runs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}
