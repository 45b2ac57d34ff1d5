package ledgerport

import (
	"context"
	"net/http"
	"regexp"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MCP carries W3C trace context in a request's _meta ("traceparent",
// "tracestate"), the way HTTP carries it in headers. The gateway passes
// a call's trace context on to the ledger, so that a ledgerd exporting
// traces (--otlp-endpoint) joins the agent's trace; the upstream gets it
// with the rest of the call's _meta.

// Keys of _meta that carry the W3C trace context.
const (
	MetaTraceparent = "traceparent"
	MetaTracestate  = "tracestate"
)

// traceparentForm is a version 00 traceparent: version-traceid-spanid-flags.
var traceparentForm = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

type traceKey struct{}

type traceContext struct{ parent, state string }

// WithTraceContext returns ctx carrying the trace context of a call's
// _meta, if it has a well-formed traceparent (anything else is dropped,
// not passed on).
func WithTraceContext(ctx context.Context, meta mcp.Meta) context.Context {
	parent, _ := meta[MetaTraceparent].(string)
	if !traceparentForm.MatchString(parent) {
		return ctx
	}
	state, _ := meta[MetaTracestate].(string)
	if len(state) > 512 {
		state = ""
	}
	return context.WithValue(ctx, traceKey{}, traceContext{parent: parent, state: state})
}

// InjectTraceContext sets the traceparent (and tracestate) headers of a
// request to the ledger from the trace context of the call that ctx
// belongs to; it is the remote ledger client's propagator
// (client.WithPropagator).
func InjectTraceContext(ctx context.Context, h http.Header) {
	tc, ok := ctx.Value(traceKey{}).(traceContext)
	if !ok {
		return
	}
	h.Set("traceparent", tc.parent)
	if tc.state != "" {
		h.Set("tracestate", tc.state)
	}
}
