package daemon

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/effect-ledger/effect-ledger/internal/version"
)

// tracingWanted reports whether traces are to be exported: --otlp-endpoint
// or one of the standard OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variables is
// set, and OTEL_SDK_DISABLED is not true.
func (m *Main) tracingWanted() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	return m.OTLPEndpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" ||
		os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// openTracing returns a tracer provider exporting over OTLP/HTTP to
// --otlp-endpoint (a URL such as http://collector:4318/v1/traces) or to
// where the OTEL_EXPORTER_OTLP_* variables say, or nil when tracing is
// off. Its Shutdown flushes the spans not yet exported.
func (m *Main) openTracing(ctx context.Context) (*sdktrace.TracerProvider, error) {
	if !m.tracingWanted() {
		return nil, nil
	}
	var opts []otlptracehttp.Option
	if m.OTLPEndpoint != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(m.OTLPEndpoint))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	v := version.Read("ledgerd")
	res := resource.NewSchemaless(
		attribute.String("service.name", "ledgerd"),
		attribute.String("service.version", v.Short()),
	)
	if env, err := resource.New(ctx, resource.WithFromEnv()); err == nil {
		// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win.
		if merged, err := resource.Merge(res, env); err == nil {
			res = merged
		}
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
