package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/redistest"
)

// TestProxyDeferForwarded: a deferred request reaches the upstream with
// the forwarding headers a forwarded one gets: X-Forwarded-For the
// client's address (its own X-Forwarded-For, Forwarded and X-Real-IP, as
// an untrusted client's, dropped), X-Forwarded-Host and -Proto.
func TestProxyDeferForwarded(t *testing.T) {
	srv := redistest.Standalone(t)
	var mu sync.Mutex
	got := map[string]http.Header{} // "direct" and "deferred"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := "direct"
		if r.Header.Get("Idempotency-Key") != "" {
			kind = "deferred"
		}
		mu.Lock()
		got[kind] = r.Header.Clone()
		mu.Unlock()
	}))
	defer up.Close()
	dir := t.TempDir()
	writeRules(t, dir, "edge.yaml", deferRules)
	// a patient timeout: with the 50 ms default a starved host's slow call
	// is decided by the failure mode (open: forwarded, not deferred)
	p := startProxy(t, up.URL, dir, "--store", "redis://"+srv.Addr, "--store-timeout", "10s")
	for i, want := range []int{200, 202} {
		req, _ := http.NewRequest("POST", "http://"+p.addrs["proxy"]+"/orders/x", strings.NewReader("b"))
		req.Host = "shop.example"
		req.Header.Set("X-Forwarded-For", "6.6.6.6")
		req.Header.Set("Forwarded", "for=6.6.6.6")
		req.Header.Set("X-Real-IP", "6.6.6.6")
		req.Header.Set("X-Forwarded-Host", "evil.example")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	redistest.WaitFor(t, 20*time.Second, "the deferred request delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got["deferred"] != nil
	})
	mu.Lock()
	defer mu.Unlock()
	for _, kind := range []string{"direct", "deferred"} {
		h := got[kind]
		if h.Get("X-Forwarded-For") != "127.0.0.1" || len(h.Values("X-Forwarded-For")) != 1 || h.Get("Forwarded") != "" ||
			h.Get("X-Real-IP") != "" || h.Get("X-Forwarded-Host") != "shop.example" || h.Get("X-Forwarded-Proto") != "http" {
			t.Errorf("%s request's forwarding headers: X-Forwarded-For %q, Forwarded %q, X-Real-IP %q, X-Forwarded-Host %q, X-Forwarded-Proto %q; want 127.0.0.1, none, none, shop.example, http",
				kind, h.Values("X-Forwarded-For"), h.Get("Forwarded"), h.Get("X-Real-IP"), h.Get("X-Forwarded-Host"), h.Get("X-Forwarded-Proto"))
		}
	}
}
