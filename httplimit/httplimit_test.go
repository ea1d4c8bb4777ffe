package httplimit_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
)

func mustPolicy(t testing.TB, name string, r floodgate.Rule) *floodgate.Policy {
	t.Helper()
	p, err := floodgate.NewPolicy(name, r)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func serve(t *testing.T, opts httplimit.Options) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	mw, err := httplimit.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mw.Close)
	var served atomic.Int64
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		io.WriteString(w, "ok")
	})))
	t.Cleanup(srv.Close)
	return srv, &served
}

func get(t *testing.T, url string, hdr ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// Concurrent clients over real HTTP: exactly the limit passes per key.
func TestExactCountsPerKey(t *testing.T) {
	p := mustPolicy(t, "per-key", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 25, Period: time.Hour})
	srv, served := serve(t, httplimit.Options{Config: gate.Config{Limits: []gate.Limit{{Name: "per-key", Policy: p, Key: []gate.Part{gate.Header("X-API-Key")}}}}})
	var ok, refused [3]atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 12; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				k := (w + i) % 3
				resp := get(t, srv.URL, "X-API-Key", "key-"+strconv.Itoa(k))
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					ok[k].Add(1)
				case 429:
					refused[k].Add(1)
				default:
					t.Errorf("status %d", resp.StatusCode)
				}
			}
		}()
	}
	wg.Wait()
	for k := range ok {
		if ok[k].Load() != 25 || refused[k].Load() != 55 {
			t.Errorf("key %d: %d passed, %d refused; want 25 and 55", k, ok[k].Load(), refused[k].Load())
		}
	}
	if served.Load() != 75 {
		t.Errorf("handler served %d, want 75", served.Load())
	}
}

// draft-ietf-httpapi-ratelimit-headers-11 items: a quoted name and
// integer parameters.
var (
	policyRE = regexp.MustCompile(`^"([^"\\]*)";q=(\d+);w=(\d+)$`)
	limitRE  = regexp.MustCompile(`^"([^"\\]*)";r=(\d+);t=(\d+)$`)
)

func TestHeadersParseAndCountDown(t *testing.T) {
	p := mustPolicy(t, "api", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 5, Period: time.Minute})
	srv, _ := serve(t, httplimit.Options{Legacy: true, Config: gate.Config{Limits: []gate.Limit{{Name: "api", Policy: p, Key: []gate.Part{gate.IP()}}}}})
	for i := 0; i < 7; i++ {
		resp := get(t, srv.URL)
		resp.Body.Close()
		pm := policyRE.FindStringSubmatch(resp.Header.Get("RateLimit-Policy"))
		lm := limitRE.FindStringSubmatch(resp.Header.Get("RateLimit"))
		if pm == nil || lm == nil {
			t.Fatalf("request %d: RateLimit-Policy %q RateLimit %q do not parse", i, resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit"))
		}
		if pm[1] != "api" || pm[2] != "5" || pm[3] != "60" || lm[1] != "api" {
			t.Fatalf("request %d: policy %v limit %v", i, pm, lm)
		}
		r, _ := strconv.Atoi(lm[2])
		secs, _ := strconv.Atoi(lm[3])
		if i < 5 {
			if resp.StatusCode != 200 || r != 4-i {
				t.Fatalf("request %d: status %d remaining %d, want 200 and %d", i, resp.StatusCode, r, 4-i)
			}
			if secs < 1 || secs > 60 {
				t.Fatalf("request %d: t=%d", i, secs)
			}
			continue
		}
		ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		if resp.StatusCode != 429 || r != 0 || ra < 1 || ra > 12 || secs != ra {
			t.Fatalf("request %d: status %d r=%d t=%d Retry-After %q", i, resp.StatusCode, r, secs, resp.Header.Get("Retry-After"))
		}
		if resp.Header.Get("X-RateLimit-Limit") != "5" || resp.Header.Get("X-RateLimit-Remaining") != "0" {
			t.Fatalf("legacy headers %v", resp.Header)
		}
	}
}

func TestRefusalBodies(t *testing.T) {
	p := mustPolicy(t, "x", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1, Period: time.Hour})
	srv, _ := serve(t, httplimit.Options{Config: gate.Config{Limits: []gate.Limit{{Name: "x", Policy: p, Status: 503}}}})
	get(t, srv.URL).Body.Close()
	resp := get(t, srv.URL, "Accept", "application/json")
	var body struct {
		Error      string `json:"error"`
		Limit      string `json:"limit"`
		RetryAfter int    `json:"retry_after"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 503 || body.Limit != "x" || body.RetryAfter < 1 {
		t.Fatalf("JSON refusal: %d %+v %v", resp.StatusCode, body, err)
	}
	resp.Body.Close()
	resp = get(t, srv.URL, "Accept", "text/html, application/json")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" || !regexp.MustCompile(`^rate limit exceeded \(x\); retry in \d+ s\n$`).Match(b) {
		t.Fatalf("text refusal: %q %q", resp.Header.Get("Content-Type"), b)
	}

	// A custom renderer.
	srv2, _ := serve(t, httplimit.Options{
		Config: gate.Config{Limits: []gate.Limit{{Name: "x", Policy: p}}},
		Render: func(w http.ResponseWriter, r *http.Request, v *gate.Verdict) {
			w.WriteHeader(418)
			io.WriteString(w, "slow down, "+v.Deciding.Limit.Name)
		},
	})
	get(t, srv2.URL).Body.Close()
	resp = get(t, srv2.URL)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 418 || string(b) != "slow down, x" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("custom refusal: %d %q %v", resp.StatusCode, b, resp.Header)
	}
}

func TestRedirectAndSoft(t *testing.T) {
	p := mustPolicy(t, "r", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1, Period: time.Hour})
	srv, _ := serve(t, httplimit.Options{Config: gate.Config{Limits: []gate.Limit{{Name: "r", Policy: p, Action: gate.Redirect, Redirect: "https://example.com/busy", RedirectStatus: 307}}}})
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for i := 0; i < 2; i++ {
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if i == 1 && (resp.StatusCode != 307 || resp.Header.Get("Location") != "https://example.com/busy") {
			t.Fatalf("redirect: %d %q", resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	soft := mustPolicy(t, "s", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 10, Period: time.Hour, Mode: floodgate.Soft, SoftPercent: 20})
	srv2, served := serve(t, httplimit.Options{Config: gate.Config{Limits: []gate.Limit{{Name: "s", Policy: soft}}}})
	warned := 0
	for i := 0; i < 13; i++ {
		resp := get(t, srv2.URL)
		resp.Body.Close()
		if resp.Header.Get("Floodgate-Warning") != "" {
			warned++
		}
	}
	if served.Load() != 12 || warned != 2 {
		t.Fatalf("soft limit: served %d, warned %d; want 12 and 2", served.Load(), warned)
	}
}

// A spoofed X-Forwarded-For from an untrusted peer is ignored; from a
// trusted proxy it is used.
func TestForwardedFor(t *testing.T) {
	p := mustPolicy(t, "ip", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1, Period: time.Hour})
	limits := []gate.Limit{{Name: "ip", Policy: p, Key: []gate.Part{gate.IP()}}}
	untrusted, _ := serve(t, httplimit.Options{Config: gate.Config{Limits: limits}})
	if r := get(t, untrusted.URL, "X-Forwarded-For", "203.0.113.1"); r.StatusCode != 200 {
		t.Fatal("first request refused")
	}
	if r := get(t, untrusted.URL, "X-Forwarded-For", "203.0.113.2"); r.StatusCode != 429 {
		t.Fatal("a spoofed X-Forwarded-For from an untrusted peer bought a new key")
	}
	trusted, _ := serve(t, httplimit.Options{Config: gate.Config{Limits: limits, ClientIP: gate.ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}}}})
	for _, ip := range []string{"203.0.113.1", "203.0.113.2"} {
		if r := get(t, trusted.URL, "X-Forwarded-For", ip); r.StatusCode != 200 {
			t.Fatalf("%s via a trusted proxy: %d", ip, r.StatusCode)
		}
	}
	if r := get(t, trusted.URL, "X-Forwarded-For", "198.51.100.7, 203.0.113.1"); r.StatusCode != 429 {
		t.Fatal("the client's own entry, left of the proxy's, was believed")
	}
}

// A client that goes away while its request is delayed is not served.
func TestDelayedClientLeaves(t *testing.T) {
	p := mustPolicy(t, "d", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 1, Period: 10 * time.Second, Burst: 1})
	mw, err := httplimit.New(httplimit.Options{Config: gate.Config{Limits: []gate.Limit{{Name: "d", Policy: p, Action: gate.Delay, MaxDelay: time.Minute}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	var served atomic.Int64
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) }))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	if served.Load() != 1 || time.Since(start) > 5*time.Second {
		t.Fatalf("served %d after %v", served.Load(), time.Since(start))
	}
}

// Observe sees every verdict, passed and refused.
func TestObserve(t *testing.T) {
	p := mustPolicy(t, "o", floodgate.Rule{Algorithm: floodgate.TokenBucket, Limit: 2, Period: time.Hour})
	var passed, refused atomic.Int64
	srv, _ := serve(t, httplimit.Options{
		Config: gate.Config{Limits: []gate.Limit{{Name: "o", Policy: p}}},
		Observe: func(r *http.Request, v *gate.Verdict) {
			if len(v.Outcomes) != 1 || v.Outcomes[0].Limit.Name != "o" {
				t.Errorf("outcomes %+v", v.Outcomes)
			}
			if v.Allowed {
				passed.Add(1)
			} else {
				refused.Add(1)
			}
		},
	})
	for i := 0; i < 5; i++ {
		get(t, srv.URL).Body.Close()
	}
	if passed.Load() != 2 || refused.Load() != 3 {
		t.Fatalf("observed %d passed, %d refused; want 2 and 3", passed.Load(), refused.Load())
	}
}
