package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/effect-ledger/effect-ledger/ledger"
)

// Span attributes of a request about an effect.
const (
	AttrNamespace  = attribute.Key("ledger.namespace")
	AttrKey        = attribute.Key("ledger.key")
	AttrDecision   = attribute.Key("ledger.decision") // reserved, replayed, in_progress, committed, …
	AttrReceiptSeq = attribute.Key("ledger.receipt.seq")
	AttrBatchSize  = attribute.Key("ledger.batch.size")
)

// maxTraced bounds how much of an answer (and of a reserve's request) a
// span reads its attributes from; a reserve answer is at most a 64 KiB
// result plus its fields.
const maxTraced = 80 << 10

// tracedRoutes are the routes whose answers name a key, a decision and a
// receipt.
var tracedRoutes = map[string]bool{
	"/v1/effects/reserve":         true,
	"/v1/effects/{key}/commit":    true,
	"/v1/effects/{key}/resolve":   true,
	"/v1/effects/{key}/reconcile": true,
}

// requestSpan is the server span of one request, and what it reads its
// attributes from.
type requestSpan struct {
	http.ResponseWriter
	span   trace.Span
	route  string
	vars   map[string]string
	answer bytes.Buffer // the first maxTraced bytes of an effect route's answer
	req    bytes.Buffer // the first maxTraced bytes of a reserve's request
	keep   bool
}

// startSpan starts r's server span, continuing the caller's traceparent,
// and returns the writer and request the handler should use.
func (s *Server) startSpan(w http.ResponseWriter, r *http.Request, route string, vars map[string]string) (*requestSpan, http.ResponseWriter, *http.Request) {
	ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := s.tracer.Start(ctx, r.Method+" "+route, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			attribute.String("http.request.method", methodLabel(r.Method)),
			attribute.String("http.route", route),
		))
	rs := &requestSpan{ResponseWriter: w, span: span, route: canonicalRoute(route), vars: vars}
	rs.keep = tracedRoutes[rs.route]
	if rs.route == "/v1/effects/reserve" && r.Body != nil {
		r.Body = teeBody{Reader: io.TeeReader(r.Body, &limitedBuffer{b: &rs.req}), Closer: r.Body}
	}
	tracer := s.tracer
	ctx = ledger.NewContextWithBatchObserver(ctx, func(ctx context.Context, b ledger.BatchInfo) {
		_, bs := tracer.Start(ctx, "ledger.batch", trace.WithTimestamp(b.Start), trace.WithAttributes(
			AttrNamespace.String(b.Namespace), AttrBatchSize.Int(b.Size)))
		if b.Err != nil {
			bs.SetStatus(codes.Error, "write batch failed")
		}
		bs.End(trace.WithTimestamp(b.End))
	})
	return rs, rs, r.WithContext(ctx)
}

func (rs *requestSpan) Write(p []byte) (int, error) {
	if rs.keep {
		_, _ = (&limitedBuffer{b: &rs.answer}).Write(p)
	}
	return rs.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (rs *requestSpan) Unwrap() http.ResponseWriter { return rs.ResponseWriter }

// traceID is the span's trace id, for the request's log line.
func (rs *requestSpan) traceID() string { return rs.span.SpanContext().TraceID().String() }

// end records the answer on the span and ends it.
func (rs *requestSpan) end(status int) {
	rs.span.SetAttributes(attribute.Int("http.response.status_code", status))
	if ns, ok := rs.vars["ns"]; ok {
		rs.span.SetAttributes(AttrNamespace.String(unescape(ns)))
	} else if rs.route != "unmatched" {
		rs.span.SetAttributes(AttrNamespace.String(ledger.DefaultNamespace))
	}
	if rs.keep {
		rs.effectAttributes()
	}
	if status >= 500 {
		rs.span.SetStatus(codes.Error, http.StatusText(status))
	}
	rs.span.End()
}

// effectAttributes reads the key, the decision and the receipt from an
// effect route's answer (the contract's shapes, SPEC §4).
func (rs *requestSpan) effectAttributes() {
	var a struct {
		Status         string `json:"status"`
		IdempotencyKey string `json:"idempotency_key"`
		Receipt        struct {
			Seq uint64 `json:"seq"`
		} `json:"receipt"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(rs.answer.Bytes(), &a) // a cut-off answer leaves fields empty
	key := a.IdempotencyKey
	if key == "" {
		key = unescape(rs.vars["key"])
	}
	if key == "" && rs.req.Len() > 0 {
		var req struct {
			IdempotencyKey string `json:"idempotency_key"`
		}
		_ = json.Unmarshal(rs.req.Bytes(), &req)
		key = req.IdempotencyKey
	}
	if key != "" {
		rs.span.SetAttributes(AttrKey.String(key))
	}
	decision := a.Status
	if a.Error.Code != "" {
		decision = a.Error.Code
	}
	if decision != "" {
		rs.span.SetAttributes(AttrDecision.String(decision))
	}
	if a.Receipt.Seq > 0 && a.Receipt.Seq <= 1<<63-1 {
		rs.span.SetAttributes(AttrReceiptSeq.Int64(int64(a.Receipt.Seq)))
	}
}

func unescape(s string) string {
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}

// limitedBuffer keeps the first maxTraced bytes written to it.
type limitedBuffer struct{ b *bytes.Buffer }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := maxTraced - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// teeBody is a request body that copies what the handler reads.
type teeBody struct {
	io.Reader
	io.Closer
}

// traceAttr is the log attribute naming the request's trace, empty
// without tracing.
func traceAttr(rs *requestSpan) []any {
	if rs == nil {
		return nil
	}
	return []any{"trace_id", rs.traceID()}
}
