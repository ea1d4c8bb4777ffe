package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/metadata"

	"github.com/floodgate/floodgate/internal/spanjson"
)

const (
	traceTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	traceParent  = "00f067aa0ba902b7"
	traceSecret  = "alice-secret-7f3a"
)

// readSpans reads a --trace-file.
func readSpans(t *testing.T, path string) ([]spanjson.Span, string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spans []spanjson.Span
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		var s spanjson.Span
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("a line of --trace-file: %v: %s", err, sc.Text())
		}
		spans = append(spans, s)
	}
	return spans, string(b)
}

// floodgate serve --trace-file: a span per ShouldRateLimit, as JSON
// lines, flushed when it stops; a sampled traceparent is followed (the
// default --trace-sample is 1%), an unsampled one is not. The soft
// limit's warning reaches the gRPC client (as Envoy would get it) on the
// same calls the spans say "warned". No line holds the key.
func TestServeTraceFile(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "t.yaml", `domain: t
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2, mode: soft, soft_percent: 50}
`)
	file := filepath.Join(t.TempDir(), "spans.jsonl")
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--trace-file", file)
	ask := func(flags string) *rlsv3.RateLimitResponse {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+traceTraceID+"-"+traceParent+"-"+flags)
		resp, err := s.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "t", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", traceSecret)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	var warned []string
	for range 4 {
		resp := ask("01")
		w := "-"
		for _, h := range resp.ResponseHeadersToAdd {
			if h.Key == "Floodgate-Warning" {
				w = h.Value
			}
		}
		warned = append(warned, resp.OverallCode.String()+"/"+w)
	}
	if got, want := strings.Join(warned, " "), "OK/- OK/- OK/soft limit exceeded OVER_LIMIT/-"; got != want {
		t.Fatalf("responses %s, want %s", got, want)
	}
	ask("00") // not sampled by the caller: no span
	s.stop(t)
	spans, text := readSpans(t, file)
	if strings.Contains(text, traceSecret) {
		t.Fatalf("--trace-file holds the key:\n%s", text)
	}
	var outcomes []string
	for _, sp := range spans {
		if sp.Name != "floodgate.ShouldRateLimit" || sp.TraceID != traceTraceID || sp.ParentSpanID != traceParent || sp.Kind != "server" {
			t.Fatalf("span %+v", sp)
		}
		if sp.Attributes["floodgate.domain"] != "t" || len(sp.Attributes["floodgate.key_hashes"].([]any)) != 1 {
			t.Fatalf("attributes %v", sp.Attributes)
		}
		outcomes = append(outcomes, sp.Attributes["floodgate.outcome"].(string))
	}
	if got := strings.Join(outcomes, " "); got != "allowed allowed warned refused" {
		t.Fatalf("%d spans, outcomes %s\n%s", len(spans), got, text)
	}
}

// floodgate proxy --trace-file --trace-sample 1: a span per request a
// route applies to, in the trace of its traceparent header; the API key
// is in no line; a bad --trace-sample is refused.
func TestProxyTraceFile(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", proxyRules)
	file := filepath.Join(t.TempDir(), "spans.jsonl")
	p := startProxy(t, up.URL, dir, "--trace-file", file, "--trace-sample", "1")
	for range 4 {
		proxyGet(t, "http://"+p.addrs["proxy"]+"/keyed/x", "X-API-Key", traceSecret, "Traceparent", "00-"+traceTraceID+"-"+traceParent+"-00")
	}
	p.stop(t)
	spans, text := readSpans(t, file)
	if strings.Contains(text, traceSecret) {
		t.Fatalf("--trace-file holds the key:\n%s", text)
	}
	// the caller's traceparent (read from fasthttp's headers) said "not
	// sampled": followed, no span, where --trace-sample 1 would trace a
	// request without one
	if len(spans) != 0 {
		t.Fatalf("%d spans of unsampled requests", len(spans))
	}
	p = startProxy(t, up.URL, dir, "--trace-file", file, "--trace-sample", "1")
	for range 4 {
		proxyGet(t, "http://"+p.addrs["proxy"]+"/keyed/x", "X-API-Key", traceSecret+"2")
	}
	p.stop(t)
	spans, text = readSpans(t, file)
	var outcomes []string
	for _, sp := range spans {
		if sp.Name != "floodgate.gate" || sp.ParentSpanID != "" {
			t.Fatalf("span %+v", sp)
		}
		outcomes = append(outcomes, sp.Attributes["floodgate.outcome"].(string))
	}
	if got := strings.Join(outcomes, " "); got != "allowed allowed allowed refused" || strings.Contains(text, traceSecret) {
		t.Fatalf("outcomes %s\n%s", got, text)
	}
	out, err := exec.Command(binary, "proxy", "--upstream", up.URL, "--trace-file", file, "--trace-sample", "2").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--trace-sample 2: want 0 to 1") {
		t.Fatalf("--trace-sample 2: %v\n%s", err, out)
	}
}
