package service_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/floodgate/floodgate/internal/decisiontrace"
	"github.com/floodgate/floodgate/internal/downstore"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/service"
)

// A caller's trace: traceparent of trace traceID, parent span parentID,
// sampled.
const (
	traceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentID    = "00f067aa0ba902b7"
	traceparent = "00-" + traceID + "-" + parentID + "-01"
	// a key no span may hold
	secretKey = "alice-secret-7f3a"
)

func spanRecorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, sr
}

// spanAttrs returns a span's attributes, each as Emit writes it, and
// everything the span holds as text (name, attributes, events, status).
func spanAttrs(s sdktrace.ReadOnlySpan) (map[string]string, string) {
	m := map[string]string{}
	var all strings.Builder
	all.WriteString(s.Name() + " " + s.Status().Description)
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.Emit()
		all.WriteString(" " + string(kv.Key) + "=" + kv.Value.Emit())
	}
	for _, e := range s.Events() {
		all.WriteString(" " + e.Name)
		for _, kv := range e.Attributes {
			all.WriteString(" " + kv.Value.Emit())
		}
	}
	for _, kv := range s.Resource().Attributes() {
		all.WriteString(" " + kv.Value.Emit())
	}
	return m, all.String()
}

// Each ShouldRateLimit over real gRPC is one span of kind server, in the
// caller's trace (traceparent in the call's metadata), saying the domain,
// the deciding rule, the key's hash, the outcome (allowed, then warned
// past the soft line, then refused past the ceiling) and the store's
// latency; no span holds the key.
func TestTraceShouldRateLimit(t *testing.T) {
	tp, sr := spanRecorder(t)
	e := newEnv(t, service.Options{TracerProvider: tp}, softRules)
	client := rlsv3.NewRateLimitServiceClient(dialGRPC(t, e.serveGRPC(t)))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", traceparent)
	var outcomes []string
	for range 13 {
		if _, err := client.ShouldRateLimit(ctx, softReq("user", secretKey)); err != nil {
			t.Fatal(err)
		}
	}
	spans := sr.Ended()
	if len(spans) != 13 {
		t.Fatalf("%d spans for 13 calls", len(spans))
	}
	for _, s := range spans {
		attrs, all := spanAttrs(s)
		if strings.Contains(all, secretKey) {
			t.Fatalf("a span holds the key: %s", all)
		}
		if s.Name() != "floodgate.ShouldRateLimit" || s.SpanKind() != trace.SpanKindServer {
			t.Fatalf("span %q of kind %v", s.Name(), s.SpanKind())
		}
		if s.SpanContext().TraceID().String() != traceID || s.Parent().SpanID().String() != parentID || !s.Parent().IsRemote() {
			t.Fatalf("span in trace %s under %s: not the caller's", s.SpanContext().TraceID(), s.Parent().SpanID())
		}
		if attrs["floodgate.domain"] != "soft" || attrs["floodgate.rules"] != `["soft.user"]` || attrs["floodgate.store.latency_us"] == "" {
			t.Fatalf("attributes: %v", attrs)
		}
		outcomes = append(outcomes, attrs["floodgate.outcome"]+"/"+attrs["floodgate.allowed"])
	}
	want := strings.Repeat("allowed/true ", 10) + "warned/true warned/true refused/false"
	if got := strings.Join(outcomes, " "); got != want {
		t.Fatalf("outcomes:\n%s\nwant\n%s", got, want)
	}
	// one key, one hash; another key, another
	h0, _ := spanAttrs(spans[0])
	h1, _ := spanAttrs(spans[12])
	if h0["floodgate.key_hashes"] != h1["floodgate.key_hashes"] || len(h0["floodgate.key_hashes"]) != len(`[""]`)+16 {
		t.Fatalf("the same key hashed %s and %s", h0["floodgate.key_hashes"], h1["floodgate.key_hashes"])
	}
	sr.Reset()
	if _, err := client.ShouldRateLimit(ctx, softReq("user", secretKey+"x")); err != nil {
		t.Fatal(err)
	}
	if h2, _ := spanAttrs(sr.Ended()[0]); h2["floodgate.key_hashes"] == h0["floodgate.key_hashes"] {
		t.Fatal("two keys hashed alike")
	}
}

// A key's hash is no hash a guesser can compute: not the key's SHA-256,
// FNV or siphash under a zero key, and not the same for two keys.
func TestKeyHashIsKeyed(t *testing.T) {
	h := decisiontrace.KeyHash(secretKey)
	if len(h) != 16 || h == decisiontrace.KeyHash(secretKey+"x") || h != decisiontrace.KeyHash(secretKey) {
		t.Fatalf("KeyHash: %q", h)
	}
}

// The outcomes a span says: shadow (a shadow limit would refuse), and an
// error status for a request the service cannot decide (a bad request, a
// store that fails). (Degraded, a Redis failure mode's decision:
// TestTraceDegradedOnRedis.)
func TestTraceOutcomes(t *testing.T) {
	tp, sr := spanRecorder(t)
	e := newEnv(t, service.Options{TracerProvider: tp}, softRules)
	for range 13 {
		e.ask(t, softReq("shadowsoft", secretKey))
	}
	if a, _ := spanAttrs(sr.Ended()[12]); a["floodgate.outcome"] != "shadow" || a["floodgate.allowed"] != "true" {
		t.Fatalf("shadow: %v", a)
	}
	if _, err := e.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "soft"}); err == nil {
		t.Fatal("a request of no descriptors was decided")
	}
	last := sr.Ended()[len(sr.Ended())-1]
	if a, _ := spanAttrs(last); last.Status().Code.String() != "Error" || a["floodgate.outcome"] != "" {
		t.Fatalf("bad request: status %v, attributes %v", last.Status(), a)
	}
	// a store that fails outright (no failure mode of Redis's decides):
	// UNAVAILABLE, and the span says the error
	down := newEnv(t, service.Options{TracerProvider: tp, Store: downstore.Store{}}, softRules)
	sr.Reset()
	if _, err := down.svc.ShouldRateLimit(context.Background(), softReq("user", secretKey)); err == nil {
		t.Fatal("decided without a store")
	}
	if s := sr.Ended()[0]; s.Status().Code.String() != "Error" || !strings.Contains(s.Status().Description, "store down") {
		t.Fatalf("store down: status %v", s.Status())
	}
}

// POST /json is traced too, continuing the trace of its traceparent
// header.
func TestTraceJSON(t *testing.T) {
	tp, sr := spanRecorder(t)
	e := newEnv(t, service.Options{TracerProvider: tp}, softRules)
	srv := httptest.NewServer(e.svc.HTTPHandler(nil, nil))
	t.Cleanup(srv.Close)
	req, _ := http.NewRequest("POST", srv.URL+"/json", strings.NewReader(`{"domain":"soft","descriptors":[{"entries":[{"key":"user","value":"`+secretKey+`"}]}]}`))
	req.Header.Set("Traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	spans := sr.Ended()
	if len(spans) != 1 || spans[0].SpanContext().TraceID().String() != traceID || spans[0].Parent().SpanID().String() != parentID {
		t.Fatalf("%d spans, not in the caller's trace", len(spans))
	}
	if a, all := spanAttrs(spans[0]); a["floodgate.outcome"] != "allowed" || strings.Contains(all, secretKey) {
		t.Fatalf("span: %s", all)
	}
}

// With no TracerProvider the service makes no span: not with the global
// provider (otel.SetTracerProvider is the application's, not an opt-in),
// not under a caller's recording span.
func TestNoTracerNoSpan(t *testing.T) {
	tp, sr := spanRecorder(t)
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	e := newEnv(t, service.Options{}, softRules)
	ctx, parent := tp.Tracer("test").Start(context.Background(), "caller")
	client := rlsv3.NewRateLimitServiceClient(dialGRPC(t, e.serveGRPC(t)))
	for range 3 {
		if _, err := client.ShouldRateLimit(metadata.AppendToOutgoingContext(ctx, "traceparent", traceparent), softReq("user", secretKey)); err != nil {
			t.Fatal(err)
		}
		e.ask(t, softReq("user", secretKey))
		if _, err := e.svc.ShouldRateLimit(ctx, softReq("user", secretKey)); err != nil {
			t.Fatal(err)
		}
	}
	parent.End()
	if n := len(sr.Started()); n != 1 {
		t.Fatalf("%d spans started; want the caller's alone", n)
	}
}

// While Redis does not answer, a failure mode decides: the span says
// degraded, whether it admits (open) or refuses (closed: allowed false).
func TestTraceDegradedOnRedis(t *testing.T) {
	rs := redistest.Standalone(t)
	st, err := redisstore.New("redis://"+rs.Addr, redisstore.Options{ClientTime: true, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tp, sr := spanRecorder(t)
	e := newEnv(t, service.Options{Store: st, TracerProvider: tp}, `domain: f
descriptors:
  - key: open
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 5, failure_mode: closed}
`)
	ask := func(key string) map[string]string {
		sr.Reset()
		e.ask(t, &rlsv3.RateLimitRequest{Domain: "f", Descriptors: []*rlcommon.RateLimitDescriptor{d(key, secretKey)}})
		a, _ := spanAttrs(sr.Ended()[0])
		return a
	}
	if a := ask("open"); a["floodgate.outcome"] != "allowed" {
		t.Fatalf("with Redis up: %v", a)
	}
	rs.Pause()
	defer rs.Resume()
	if a := ask("open"); a["floodgate.outcome"] != "degraded" || a["floodgate.allowed"] != "true" {
		t.Errorf("failing open: %v", a)
	}
	if a := ask("closed"); a["floodgate.outcome"] != "degraded" || a["floodgate.allowed"] != "false" {
		t.Errorf("failing closed: %v", a)
	}
}
