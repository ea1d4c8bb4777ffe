package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/floodgate/floodgate/internal/redistest"
)

// Rules whose limits fail closed, open and local while Redis is away.
const storeFailRules = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 4, algorithm: token_bucket, failure_mode: closed}
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 4, algorithm: token_bucket}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 4, algorithm: token_bucket, failure_mode: local, local_percent: 50}
http:
  - name: closed
    match: {path_prefix: /closed/}
    key: [remote_address]
  - name: busy
    match: {path_prefix: /busy/}
    key: [remote_address]
    action: redirect
    redirect: /slow-down
  - name: open
    match: {path_prefix: /open/}
    key:
      - {header: X-API-Key, entry: api_key, missing: shared}
  - name: local
    match: {path_prefix: /local/}
    key:
      - {header: X-Tenant, entry: tenant, missing: shared}
`

// With Redis paused under the proxy, its answers are httplimit's: a
// limit failing closed refuses with 503 "rate limiter unavailable",
// Retry-After: 1 and no RateLimit or RateLimit-Policy (before: 429 "rate
// limit exceeded" with r=0), and so does a redirect route's (before: its
// redirect); one failing open forwards with its policy and no RateLimit
// of its own or the upstream's (before: r=4, a full quota never
// counted); one failing local refuses past its share with 429 and its
// wait, still without a RateLimit.
func TestProxyRedisPausedResponses(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("RateLimit", `"upstream";r=99;t=1`)
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", storeFailRules)
	// The timeout is not the subject (paused, Redis times every call
	// out): generous, or a starved host times calls out with Redis up too.
	p := startProxy(t, up.URL, dir, "--store", "redis://"+srv.Addr, "--store-timeout", "2s", "--x-ratelimit-headers")
	base := "http://" + p.addrs["proxy"]
	for _, l := range []string{"closed", "busy", "open", "local"} {
		if code, h, _ := proxyGet(t, base+"/"+l+"/"); code != 200 || h.Get("RateLimit") == `"upstream";r=99;t=1` || h.Get("RateLimit") == "" {
			t.Fatalf("%s, Redis up: %d %v", l, code, h)
		}
	}
	srv.Pause()
	t.Cleanup(srv.Resume)

	code, h, body := proxyGet(t, base+"/closed/")
	if code != 503 || body != "rate limiter unavailable (edge/closed); retry in 1 s\n" || h.Get("Retry-After") != "1" ||
		h.Get("Cache-Control") != "no-store" || h.Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Errorf("closed: %d %q %v", code, body, h)
	}
	for _, k := range []string{"Ratelimit", "Ratelimit-Policy", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"} {
		if h[k] != nil {
			t.Errorf("closed: %s: %q on a refusal for the store", k, h[k])
		}
	}
	code, h, body = proxyGet(t, base+"/closed/", "Accept", "application/json")
	if code != 503 || body != `{"error":"rate_limiter_unavailable","limit":"edge/closed","retry_after":1}`+"\n" {
		t.Errorf("closed (JSON): %d %q %v", code, body, h)
	}

	// A redirect route's refusal for the store is the same 503: a
	// redirect to its "slow down" page would claim the limit reached.
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Get(base + "/busy/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || string(b) != "rate limiter unavailable (edge/busy); retry in 1 s\n" || resp.Header.Get("Location") != "" || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("busy: %d %q %v", resp.StatusCode, b, resp.Header)
	}

	for range 3 {
		code, h, body = proxyGet(t, base+"/open/")
		if code != 200 || body != "ok" || h.Get("RateLimit-Policy") != `"edge.api_key";q=4;w=3600` ||
			h["Ratelimit"] != nil || h["X-Ratelimit-Remaining"] != nil || h["Retry-After"] != nil {
			t.Fatalf("open: %d %q %v", code, body, h)
		}
	}

	// local at 50% of 4, starting from what Redis counted (the request
	// above takes its share, ceil(1 × 2/4) = 1): one admitted, then 429
	for i := range 2 {
		code, h, body = proxyGet(t, base+"/local/")
		if h["Ratelimit"] != nil || h.Get("RateLimit-Policy") != `"edge.tenant";q=4;w=3600` {
			t.Fatalf("local %d: %v", i, h)
		}
		if i < 1 && (code != 200 || body != "ok") || i == 1 && (code != 429 || h.Get("Retry-After") == "" || body == "") {
			t.Fatalf("local %d: %d %q %v", i, code, body, h)
		}
	}

	// Redis back: the one request local admitted is charged to it (seen
	// in /metrics), so the next request, decided by Redis, is the third
	// it counts of the tenant's 4: r=1.
	srv.Resume()
	admin := p.addrs["admin"]
	waitFor(t, "the local admission charged back to Redis", func() bool {
		proxyGet(t, base+"/open/") // any answered call flushes what is owed
		return metricValue(t, admin, "floodgate_store_local_charged_total") == 1
	})
	if n := metricValue(t, admin, "floodgate_store_local_untracked_total"); n != 0 {
		t.Errorf("floodgate_store_local_untracked_total = %v, want 0", n)
	}
	code, h, _ = proxyGet(t, base+"/local/")
	if code != 200 || !strings.HasPrefix(h.Get("RateLimit"), `"edge.tenant";r=1;`) {
		t.Errorf("local after Redis returned: %d %q, want 200 with r=1 (two counted before it)", code, h.Get("RateLimit"))
	}
}
