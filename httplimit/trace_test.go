package httplimit_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/internal/decisiontrace"
	"github.com/floodgate/floodgate/internal/downstore"
)

const (
	traceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentID    = "00f067aa0ba902b7"
	traceparent = "00-" + traceID + "-" + parentID + "-01"
	secretKey   = "key-of-alice-7f3a"
)

func spanRecorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, sr
}

// attrs returns a span's attributes as Emit writes them, and all the span
// says as text.
func attrs(s sdktrace.ReadOnlySpan) (map[string]string, string) {
	m := map[string]string{}
	all := s.Name() + " " + s.Status().Description
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.Emit()
		all += " " + string(kv.Key) + "=" + kv.Value.Emit()
	}
	for _, e := range s.Events() {
		all += " " + e.Name
	}
	return m, all
}

func softLimit(t *testing.T) []gate.Limit {
	p := mustPolicy(t, "soft", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Hour, Mode: floodgate.Soft, SoftPercent: 50})
	return []gate.Limit{{Name: "api", Policy: p, Key: []gate.Part{gate.Header("X-API-Key")}}}
}

// Each request a limit applies to is one span, in the trace of its
// traceparent header, naming the limit and the key's hash (never the
// key), with the outcome: allowed, warned past the soft line (as
// Floodgate-Warning says), refused past the ceiling.
func TestMiddlewareTrace(t *testing.T) {
	tp, sr := spanRecorder(t)
	srv, _ := serve(t, httplimit.Options{Config: gate.Config{Limits: softLimit(t), TracerProvider: tp}})
	var got []string
	for range 4 {
		resp := get(t, srv.URL, "X-API-Key", secretKey, "Traceparent", traceparent)
		resp.Body.Close()
	}
	spans := sr.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans for 4 requests", len(spans))
	}
	for _, s := range spans {
		a, all := attrs(s)
		if strings.Contains(all, secretKey) {
			t.Fatalf("a span holds the key: %s", all)
		}
		if s.Name() != "floodgate.gate" || s.SpanContext().TraceID().String() != traceID || s.Parent().SpanID().String() != parentID {
			t.Fatalf("span %q in trace %s under %s", s.Name(), s.SpanContext().TraceID(), s.Parent().SpanID())
		}
		if a["floodgate.rules"] != `["api"]` || a["floodgate.key_hashes"] != `["`+decisiontrace.KeyHash(secretKey)+`"]` || a["floodgate.store.latency_us"] == "" {
			t.Fatalf("attributes %v", a)
		}
		got = append(got, a["floodgate.outcome"])
	}
	if s := strings.Join(got, " "); s != "allowed allowed warned refused" {
		t.Fatalf("outcomes %s", s)
	}
}

// A span already in the request's context (another middleware's, say)
// is the parent, whatever traceparent says; a request no limit applies
// to makes no span; a store that is down: degraded.
func TestMiddlewareTraceParentAndDegraded(t *testing.T) {
	tp, sr := spanRecorder(t)
	p := mustPolicy(t, "p", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Hour})
	mw, err := httplimit.New(httplimit.Options{Config: gate.Config{TracerProvider: tp, Store: downstore.Store{},
		Limits: []gate.Limit{{Name: "only-get", Policy: p, Match: gate.Match{Methods: []string{"GET"}}, Key: []gate.Part{gate.Header("X-API-Key")}}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mw.Close)
	var parent trace.SpanContext
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tp.Tracer("outer").Start(r.Context(), "outer")
		parent = span.SpanContext()
		h.ServeHTTP(w, r.WithContext(ctx))
		span.End()
	}))
	t.Cleanup(srv.Close)
	resp := get(t, srv.URL, "X-API-Key", secretKey, "Traceparent", traceparent)
	resp.Body.Close()
	var ours sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == "floodgate.gate" {
			ours = s
		}
	}
	if ours == nil || ours.Parent().SpanID() != parent.SpanID() || ours.SpanContext().TraceID() != parent.TraceID() {
		t.Fatalf("the gate's span is not the outer span's child")
	}
	if a, _ := attrs(ours); a["floodgate.outcome"] != "degraded" || a["floodgate.allowed"] != "true" {
		t.Fatalf("store down: %v", a)
	}
	sr.Reset()
	req, _ := http.NewRequest("POST", srv.URL, nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := len(sr.Ended()); n != 1 { // the outer span alone
		t.Fatalf("%d spans for a request no limit applies to", n)
	}
}

// Without a TracerProvider the middleware makes no span, even with a
// global provider set and a traceparent sent.
func TestMiddlewareNoTracerNoSpan(t *testing.T) {
	tp, sr := spanRecorder(t)
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	srv, served := serve(t, httplimit.Options{Config: gate.Config{Limits: softLimit(t)}})
	for range 4 {
		resp := get(t, srv.URL, "X-API-Key", secretKey, "Traceparent", traceparent)
		resp.Body.Close()
	}
	if served.Load() != 3 || len(sr.Started()) != 0 {
		t.Fatalf("served %d, %d spans started", served.Load(), len(sr.Started()))
	}
}
