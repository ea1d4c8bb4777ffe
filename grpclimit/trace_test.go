package grpclimit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/grpclimit"
	"github.com/floodgate/floodgate/internal/decisiontrace"
)

// A call a limit applies to is one span, in the trace of the call's
// traceparent metadata, with the key's hash and never the key; the
// outcomes follow the limit (allowed, then refused).
func TestInterceptorTrace(t *testing.T) {
	const traceID, parentID, secret = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "user-alice-7f3a"
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	p, _ := floodgate.NewPolicy("per-user", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1, Period: time.Hour})
	client := serveOpts(t, grpclimit.Options{Config: gate.Config{TracerProvider: tp,
		Limits: []gate.Limit{{Name: "per-user", Policy: p, Key: []gate.Part{gate.Header("x-user")}}}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-user", secret, "traceparent", "00-"+traceID+"-"+parentID+"-01")
	client.Check(ctx, &healthpb.HealthCheckRequest{}) //nolint:errcheck // the spans say
	client.Check(ctx, &healthpb.HealthCheckRequest{}) //nolint:errcheck
	spans := sr.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans for 2 calls", len(spans))
	}
	var outcomes []string
	for _, s := range spans {
		if s.SpanContext().TraceID().String() != traceID || s.Parent().SpanID().String() != parentID {
			t.Fatalf("span not in the caller's trace: %s under %s", s.SpanContext().TraceID(), s.Parent().SpanID())
		}
		var all string
		m := map[string]string{}
		for _, kv := range s.Attributes() {
			m[string(kv.Key)] = kv.Value.Emit()
			all += kv.Value.Emit() + " "
		}
		if strings.Contains(all, secret) || m["floodgate.key_hashes"] != `["`+decisiontrace.KeyHash(secret)+`"]` {
			t.Fatalf("attributes: %v", m)
		}
		outcomes = append(outcomes, m["floodgate.outcome"])
	}
	if got := strings.Join(outcomes, " "); got != "allowed refused" {
		t.Fatalf("outcomes %s", got)
	}
}
