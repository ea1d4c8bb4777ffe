package remote_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/gate/remote"
)

// A gate asking floodgate serve: the service's span is the gate's span's
// child (traceparent in the call's metadata), and a soft limit's warning
// comes back among the service's headers, which the gate passes on.
func TestRemoteTraceAndSoftWarning(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	rc, err := remote.New(serveTraced(t, `domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1, mode: soft, soft_percent: 100}
`, tp), remote.Options{Domain: "web", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(gate.Config{Remote: rc, TracerProvider: tp, Limits: []gate.Limit{{Name: "users", Key: []gate.Part{gate.Header("X-User").As("user")}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var warnings []string
	for range 3 {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-User", "alice")
		var v gate.Verdict
		g.Check(&gate.Request{HTTP: r, Peer: "192.0.2.1:1"}, &v)
		w := "-"
		gate.Headers(&v, false, func(k string, vals []string) {
			if k == "Floodgate-Warning" {
				w = vals[0]
			}
		})
		warnings = append(warnings, w)
	}
	if warnings[0] != "-" || warnings[1] != "soft limit exceeded" || warnings[2] != "-" {
		t.Fatalf("warnings %q", warnings)
	}
	spans := sr.Ended()
	if len(spans) != 6 {
		t.Fatalf("%d spans for 3 requests", len(spans))
	}
	var outcomes []string
	for i := 0; i < 6; i += 2 {
		svc, gt := spans[i], spans[i+1] // the service's ends first
		if svc.Name() != "floodgate.ShouldRateLimit" || gt.Name() != "floodgate.gate" ||
			svc.Parent().SpanID() != gt.SpanContext().SpanID() || svc.SpanContext().TraceID() != gt.SpanContext().TraceID() {
			t.Fatalf("spans %q (parent %s) and %q (%s): not parent and child", svc.Name(), svc.Parent().SpanID(), gt.Name(), gt.SpanContext().SpanID())
		}
		for _, kv := range gt.Attributes() {
			if kv.Key == "floodgate.outcome" {
				outcomes = append(outcomes, kv.Value.AsString())
			}
		}
	}
	if got := strings.Join(outcomes, " "); got != "allowed warned refused" {
		t.Fatalf("the gate's outcomes: %s", got)
	}
}
