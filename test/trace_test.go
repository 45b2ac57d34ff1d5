package test

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/effect-ledger/effect-ledger/client"
)

// otlpReceiver is an OTLP/HTTP trace receiver: it decodes each export
// request (protobuf; an ExportTraceServiceRequest has the wire form of
// TracesData) and keeps its spans.
type otlpReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	rc := &otlpReceiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var td tracepb.TracesData
		if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &td) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		for _, rs := range td.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				rc.spans = append(rc.spans, ss.Spans...)
			}
		}
		rc.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK) // an empty ExportTraceServiceResponse
	}))
	t.Cleanup(rc.Close)
	return rc
}

// Spans returns the spans received so far.
func (rc *otlpReceiver) Spans() []*tracepb.Span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]*tracepb.Span(nil), rc.spans...)
}

// attrs returns a span's attributes as strings.
func attrs(s *tracepb.Span) map[string]string {
	out := map[string]string{}
	for _, kv := range s.Attributes {
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			out[kv.Key] = strconv.FormatInt(v.IntValue, 10)
		}
	}
	return out
}

// TestTracing: with --otlp-endpoint, every request is a server span that
// continues the caller's traceparent (sent by the Go client's
// propagator), carries the namespace, key, decision and receipt seq, and
// has a child span for the writer batch; spans are flushed on shutdown
// and the request's log line names the trace.
func TestTracing(t *testing.T) {
	t.Parallel()
	rc := startOTLPReceiver(t)
	l := StartLedgerd(t, filepath.Join(t.TempDir(), "ledger.db"),
		"--otlp-endpoint", rc.URL+"/v1/traces", "--log-level", "debug")

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	const parentID = "00f067aa0ba902b7"
	c, err := client.New(l.URL, client.WithPropagator(func(ctx context.Context, h http.Header) {
		h.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	}))
	require.NoError(t, err)
	ctx := context.Background()
	effect := client.Effect{Tool: "payments.refund", Class: client.ClassWrite, Input: map[string]any{"order": 1}}
	res, err := c.Do(ctx, effect, func(ctx context.Context, key string) (client.Outcome, error) {
		return client.Outcome{ExternalRef: "re_1"}, nil
	})
	require.NoError(t, err)
	again, err := c.Do(ctx, effect, func(ctx context.Context, key string) (client.Outcome, error) {
		t.Error("a replay runs nothing")
		return client.Outcome{}, nil
	})
	require.NoError(t, err)
	require.True(t, again.Replayed)
	untraced := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"busy-key-1","execution_id":"e1","tool":"t","effect":"write"}`)
	require.Equal(t, 201, untraced.Status)
	busy := l.Do("POST", "/v1/effects/reserve", `{"idempotency_key":"busy-key-1","execution_id":"e2","tool":"t","effect":"write"}`)
	require.Equal(t, 409, busy.Status)

	require.NoError(t, l.Stop(), "SIGTERM: flush the spans and exit 0")

	spans := rc.Spans()
	byID := map[string]*tracepb.Span{}
	for _, s := range spans {
		byID[hex.EncodeToString(s.SpanId)] = s
	}
	var reserves, commits []*tracepb.Span
	for _, s := range spans {
		switch s.Name {
		case "POST /v1/effects/reserve":
			reserves = append(reserves, s)
		case "POST /v1/effects/{key}/commit":
			commits = append(commits, s)
		}
	}
	require.Len(t, reserves, 4, "two reserves of the client, two without traceparent")
	require.Len(t, commits, 1)

	first, commit, replay := attrs(reserves[0]), attrs(commits[0]), attrs(reserves[1])
	for _, s := range []*tracepb.Span{reserves[0], commits[0], reserves[1]} {
		assert.Equal(t, traceID, hex.EncodeToString(s.TraceId), "%s continues the client's trace", s.Name)
		assert.Equal(t, parentID, hex.EncodeToString(s.ParentSpanId), "%s is a child of the client's span", s.Name)
		assert.Equal(t, tracepb.Span_SPAN_KIND_SERVER, s.Kind)
	}
	assert.Equal(t, map[string]string{"ledger.namespace": "default", "ledger.key": res.Key, "ledger.decision": "reserved",
		"ledger.receipt.seq": "1", "http.request.method": "POST", "http.route": "/v1/effects/reserve",
		"http.response.status_code": "201"}, first)
	assert.Equal(t, "committed", commit["ledger.decision"])
	assert.Equal(t, "2", commit["ledger.receipt.seq"])
	assert.Equal(t, res.Key, commit["ledger.key"])
	assert.Equal(t, "replayed", replay["ledger.decision"])
	assert.Equal(t, "3", replay["ledger.receipt.seq"])

	inProgress := attrs(reserves[3])
	assert.Equal(t, "in_progress", inProgress["ledger.decision"])
	assert.Equal(t, "busy-key-1", inProgress["ledger.key"], "the key of a refused reserve comes from its request")
	assert.NotEqual(t, traceID, hex.EncodeToString(reserves[3].TraceId), "no traceparent: a trace of its own")
	assert.Empty(t, reserves[3].ParentSpanId)

	// Each write's batch is a child span of its request.
	var batches int
	for _, s := range spans {
		if s.Name != "ledger.batch" {
			continue
		}
		batches++
		parent := byID[hex.EncodeToString(s.ParentSpanId)]
		require.NotNil(t, parent, "a batch span's parent is a request span")
		assert.True(t, strings.HasPrefix(parent.Name, "POST /v1/effects/"), parent.Name)
		assert.Equal(t, parent.TraceId, s.TraceId)
		assert.Equal(t, "default", attrs(s)["ledger.namespace"])
		assert.GreaterOrEqual(t, s.StartTimeUnixNano, parent.StartTimeUnixNano)
		assert.LessOrEqual(t, s.EndTimeUnixNano, parent.EndTimeUnixNano)
	}
	assert.Equal(t, 5, batches, "reserve, commit, replay, reserve, refused reserve: one write each")

	assert.Contains(t, l.Logs(), `"trace_id":"`+traceID+`"`, "the request's log line names the trace")
}
