package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate/deferq"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/rules"
)

// TestProxyDeferNeedsRedis: a defer route on the memory store is refused
// at its line (its queue is a Redis Stream), not served as a 429.
func TestProxyDeferNeedsRedis(t *testing.T) {
	dom, err := rules.Parse("edge.yaml", []byte("domain: edge\nhttp:\n  - name: orders\n    key: [remote_address]\n    action: defer\n    rate_limit: {unit: second, requests_per_unit: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(dom)
	if err != nil {
		t.Fatal(err)
	}
	dw := newDeferWorkers(nil, "http://127.0.0.1:1", deferq.Options{}, nil)
	if _, err := dw.build(cfg, nil); err == nil || !strings.HasPrefix(err.Error(), "edge.yaml:3: http route orders: action defer needs --store redis") {
		t.Errorf("got %v", err)
	}
}

// deferRules: /orders/ over its limit is deferred. The hour rule makes
// every request after the first one over it; the first rule's rate (5/s)
// paces the deliveries.
const deferRules = `domain: edge
http:
  - name: orders
    match: {path_prefix: /orders/}
    key: [remote_address]
    action: defer
    rate_limits:
      - {unit: second, requests_per_unit: 5, algorithm: token_bucket}
      - {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
    defer: {max_queue: 100, result_ttl: 10m}
`

// TestProxyDeferSurvivesKill: floodgate proxy answers requests over a
// defer route 202 with a Location; its worker takes the first one to the
// upstream, which holds it unanswered, and the proxy is killed with
// SIGKILL. A new proxy process on the same Redis delivers every deferred
// request (the held one again, with the same Idempotency-Key, after
// --defer-claim-idle), and serves their responses at the Locations the
// dead one gave.
func TestProxyDeferSurvivesKill(t *testing.T) {
	srv := redistest.Standalone(t)
	var hold atomic.Bool
	hold.Store(true)
	held := make(chan string, 1)
	var mu sync.Mutex
	seen := map[string]int{} // deliveries by Idempotency-Key
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		if key != "" {
			mu.Lock()
			seen[key]++
			mu.Unlock()
			if hold.Load() {
				select {
				case held <- key:
				default:
				}
				<-r.Context().Done()
				return
			}
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done "+r.URL.Path+" "+string(b)) //nolint:errcheck
	}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", deferRules)
	// Redis's answers are not what this test is about: a store timeout
	// and a first connection's time that a starved host keeps (the
	// default 50 ms timeout fails a starved call open, admitting a
	// request over the limit; a slow dial fails the start)
	args := []string{"--store", "redis://" + srv.Addr + "?dial_timeout=5s", "--store-timeout", "10s",
		"--defer-claim-idle", "1s", "--defer-poll-rate", "1000"} // polled every 20 ms
	a := startProxy(t, up.URL, dir, args...)
	base := "http://" + a.addrs["proxy"]
	post := func(path, body string) *http.Response {
		resp, err := http.Post(base+path, "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		return resp
	}
	if resp := post("/orders/first", "b0"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("first request: %d, want 201 from the upstream", resp.StatusCode)
	}
	var locs []string
	for i := 1; i <= 3; i++ {
		resp := post("/orders/x", fmt.Sprint("b", i))
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusAccepted || !strings.HasPrefix(loc, "/_floodgate/deferred/") {
			t.Fatalf("request %d over the limit: %d Location %q; want 202\n%s", i, resp.StatusCode, loc, a.logs())
		}
		locs = append(locs, loc)
	}
	if st, _, _ := proxyGet(t, base+locs[2]); st != http.StatusAccepted {
		t.Errorf("poll before delivery: %d, want 202", st)
	}
	var heldKey string
	select {
	case heldKey = <-held:
	case <-time.After(20 * time.Second):
		t.Fatalf("the proxy's worker delivered nothing\n%s", a.logs())
	}
	a.cmd.Process.Kill() //nolint:errcheck
	<-a.done
	hold.Store(false)

	b := startProxy(t, up.URL, dir, args...)
	bbase := "http://" + b.addrs["proxy"]
	redistest.WaitFor(t, 20*time.Second, "every deferred request delivered after the restart", func() bool {
		for _, l := range locs {
			if st, _, _ := proxyGet(t, bbase+l); st != http.StatusCreated {
				return false
			}
		}
		return true
	})
	for i, l := range locs {
		if st, _, body := proxyGet(t, bbase+l); body != fmt.Sprint("done /orders/x b", i+1) {
			t.Errorf("poll %d: %d %q", i+1, st, body)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 || seen[heldKey] < 2 {
		t.Errorf("deliveries by key %v; want the 3 requests, the held one (%s) at least twice", seen, heldKey)
	}
	b.stop(t)
}

// TestProxyDeferHostile: through the binary, a body over max_body is 413,
// a full queue 503 with Retry-After, malformed or foreign poll ids 404,
// and the proxy keeps serving.
func TestProxyDeferHostile(t *testing.T) {
	srv := redistest.Standalone(t)
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") != "" {
			select { // hold deliveries: the queue stays full
			case <-release:
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "ok") //nolint:errcheck
	}))
	defer up.Close()
	defer close(release)
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", strings.Replace(deferRules, "defer: {max_queue: 100, result_ttl: 10m}", "defer: {max_queue: 2, max_body: 1024}", 1))
	p := startProxy(t, up.URL, dir, "--store", "redis://"+srv.Addr)
	base := "http://" + p.addrs["proxy"]
	post := func(body string) *http.Response {
		resp, err := http.Post(base+"/orders/x", "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		return resp
	}
	post("first") // under the limit
	if resp := post(strings.Repeat("x", 200<<10)); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("200 KiB body over max_body 1024: %d, want 413", resp.StatusCode)
	}
	for i := range 2 {
		if resp := post("small"); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("deferred %d: %d, want 202", i, resp.StatusCode)
		}
	}
	if resp := post("small"); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("full queue: %d Retry-After %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	for _, path := range []string{"/_floodgate/deferred/", "/_floodgate/deferred/edge/orders/", "/_floodgate/deferred/edge/orders/1-1",
		"/_floodgate/deferred/edge/orders/1-1.000000000000000000000000", "/_floodgate/deferred/nope/1-1.000000000000000000000000",
		"/_floodgate/deferred/" + strings.Repeat("a/", 3000) + "x", "/_floodgate/deferred/edge/orders/%ff%00", "/_floodgate/deferred/../..", "/_floodgate/deferred/%2e%2e/%2e%2e/x"} {
		if st, _, _ := proxyGet(t, base+path); st != http.StatusNotFound {
			t.Errorf("poll %.60q: %d, want 404", path, st)
		}
	}
	// polls past --defer-poll-rate (10 a second, 20 at once) are 429
	codes := map[int]int{}
	for range 40 {
		st, h, _ := proxyGet(t, base+"/_floodgate/deferred/edge/orders/1-1.000000000000000000000000")
		codes[st]++
		if st == http.StatusTooManyRequests && h.Get("Retry-After") != "1" {
			t.Errorf("a poll over the rate: Retry-After %q", h.Get("Retry-After"))
		}
	}
	if codes[http.StatusTooManyRequests] < 10 || codes[http.StatusNotFound]+codes[http.StatusTooManyRequests] != 40 {
		t.Errorf("40 polls at once: %v; want at least 10 × 429, the rest 404", codes)
	}
	if st, _, _ := proxyGet(t, base+"/healthz-not-limited"); st != http.StatusOK {
		t.Errorf("the proxy stopped serving: %d", st)
	}
}
