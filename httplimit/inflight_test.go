package httplimit_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/inflight"
)

func newCap(t *testing.T, o httplimit.InFlightOptions) *httplimit.InFlight {
	t.Helper()
	f, err := httplimit.NewInFlight(o)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Requests from one address past its cap are refused with 429 and
// Retry-After while the first ones are served; none of them reaches the
// handler; the slots come back when the handler returns.
func TestInFlightCapsPerAddress(t *testing.T) {
	const limit = 3
	mem, _ := inflight.NewMemory(inflight.MemoryOptions{Limit: limit})
	hold := make(chan struct{})
	var in, served atomic.Int64
	f := newCap(t, httplimit.InFlightOptions{Limiter: mem, RetryAfter: 1500 * time.Millisecond})
	srv := httptest.NewServer(f.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in.Add(1)
		<-hold
		served.Add(1)
	})))
	defer srv.Close()

	var wg sync.WaitGroup
	for range limit {
		wg.Go(func() { getIF(t, srv.URL, "", nil) })
	}
	for in.Load() < limit {
		time.Sleep(time.Millisecond)
	}
	for _, accept := range []string{"application/json", ""} {
		code, hdr, body := getIF(t, srv.URL, accept, nil)
		if code != http.StatusTooManyRequests || hdr.Get("Retry-After") != "2" {
			t.Fatalf("past the cap: %d Retry-After %q; want 429, 2", code, hdr.Get("Retry-After"))
		}
		if accept != "" && !strings.Contains(body, `"error":"too_many_in_flight"`) || accept == "" && !strings.Contains(body, "too many requests in flight") {
			t.Fatalf("body %q", body)
		}
	}
	if in.Load() != limit {
		t.Fatalf("%d requests reached the handler; want %d", in.Load(), limit)
	}
	close(hold)
	wg.Wait()
	if code, _, _ := getIF(t, srv.URL, "", nil); code != http.StatusOK {
		t.Fatalf("after the holders finished: %d", code)
	}
	if mem.Keys() != 0 {
		t.Fatalf("%d keys still hold slots", mem.Keys())
	}
}

// Many concurrent requests over a custom key: the handler's own count of
// requests in flight per key never passes the cap; a request without a
// key is not capped.
func TestInFlightNeverOverCap(t *testing.T) {
	const limit = 2
	mem, _ := inflight.NewMemory(inflight.MemoryOptions{Limit: limit})
	var in [2]atomic.Int64
	var peak, over atomic.Int64
	f := newCap(t, httplimit.InFlightOptions{Limiter: mem, Key: func(r *http.Request) (string, bool) {
		k := r.Header.Get("X-Tenant")
		return k, k != ""
	}})
	srv := httptest.NewServer(f.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Tenant") == "" {
			return
		}
		c := &in[r.Header.Get("X-Tenant")[0]-'a']
		n := c.Add(1)
		if n > limit {
			over.Add(1)
		}
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(2 * time.Millisecond)
		c.Add(-1)
	})))
	defer srv.Close()
	var wg sync.WaitGroup
	var refused atomic.Int64
	for i := range 16 {
		wg.Go(func() {
			for range 20 {
				code, _, _ := getIF(t, srv.URL, "", http.Header{"X-Tenant": {string(rune('a' + i%2))}})
				if code == http.StatusTooManyRequests {
					refused.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if over.Load() != 0 || peak.Load() != limit || refused.Load() == 0 {
		t.Fatalf("over the cap %d times, peak %d, refused %d; want 0, %d, some", over.Load(), peak.Load(), refused.Load(), limit)
	}
	for range 10 { // no key: never capped
		if code, _, _ := getIF(t, srv.URL, "", nil); code != http.StatusOK {
			t.Fatalf("a keyless request got %d", code)
		}
	}
}

// brokenLimiter cannot reach its store.
type brokenLimiter struct{}

func (brokenLimiter) Acquire(context.Context, string) (*inflight.Token, bool, error) {
	return nil, false, errors.New("store down")
}
func (brokenLimiter) Limit() int { return 1 }

func TestInFlightStoreDown(t *testing.T) {
	for _, open := range []bool{false, true} {
		f := newCap(t, httplimit.InFlightOptions{Limiter: brokenLimiter{}, FailOpen: open})
		srv := httptest.NewServer(f.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
		code, hdr, _ := getIF(t, srv.URL, "", nil)
		srv.Close()
		want := http.StatusServiceUnavailable
		if open {
			want = http.StatusOK
		}
		if code != want || !open && hdr.Get("Retry-After") != "1" {
			t.Fatalf("FailOpen %v: %d Retry-After %q; want %d", open, code, hdr.Get("Retry-After"), want)
		}
	}
	if _, err := httplimit.NewInFlight(httplimit.InFlightOptions{}); err == nil {
		t.Fatal("NewInFlight without a Limiter accepted")
	}
	if _, err := httplimit.NewInFlight(httplimit.InFlightOptions{Limiter: brokenLimiter{}, RetryAfter: -time.Second}); err == nil {
		t.Fatal("a negative RetryAfter accepted")
	}
}

func getIF(t *testing.T, url, accept string, h http.Header) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for k, v := range h {
		req.Header[k] = v
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, nil, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// GateKey keys by the gate's parts: behind a trusted load balancer (the
// loopback peer here) gate.IP() is the client it names, not the balancer,
// so two clients behind it have a cap each, and a client sending no
// X-Tenant (MissingSkip) is not capped at all.
func TestInFlightGateKey(t *testing.T) {
	g, err := gate.New(gate.Config{ClientIP: gate.ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := httplimit.GateKey(g); err == nil {
		t.Fatal("GateKey with no parts accepted")
	}
	byIP, err := httplimit.GateKey(g, gate.IP())
	if err != nil {
		t.Fatal(err)
	}
	mem, _ := inflight.NewMemory(inflight.MemoryOptions{Limit: 1})
	f := newCap(t, httplimit.InFlightOptions{Limiter: mem, Key: byIP})
	hold := make(chan struct{})
	var in atomic.Int64
	srv := httptest.NewServer(f.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in.Add(1)
		<-hold
	})))
	defer srv.Close()
	var wg sync.WaitGroup
	for _, client := range []string{"203.0.113.1", "203.0.113.2"} {
		wg.Go(func() { getIF(t, srv.URL, "", http.Header{"X-Forwarded-For": {client}}) })
	}
	for in.Load() < 2 { // one each: two keys
		time.Sleep(time.Millisecond)
	}
	if code, _, _ := getIF(t, srv.URL, "", http.Header{"X-Forwarded-For": {"203.0.113.1"}}); code != http.StatusTooManyRequests {
		t.Fatalf("203.0.113.1's second request: %d, want 429", code)
	}
	if mem.InFlight("203.0.113.1") != 1 || mem.InFlight("127.0.0.1") != 0 {
		t.Fatalf("keys: 203.0.113.1 holds %d, the balancer %d", mem.InFlight("203.0.113.1"), mem.InFlight("127.0.0.1"))
	}
	close(hold)
	wg.Wait()

	byTenant, _ := httplimit.GateKey(g, gate.Header("X-Tenant").Or(gate.MissingSkip))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if _, ok := byTenant(r); ok {
		t.Fatal("a request without X-Tenant got a key; MissingSkip should leave it uncapped")
	}
	r.Header.Set("X-Tenant", "a|b")
	if k, ok := byTenant(r); !ok || k != "a%7Cb" {
		t.Fatalf("key %q, %v; want the gate's escaped value a%%7Cb", k, ok)
	}
}
