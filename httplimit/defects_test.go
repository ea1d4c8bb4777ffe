package httplimit_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/gate"
	"github.com/floodgate/floodgate/httplimit"
	"github.com/floodgate/floodgate/rules"
)

// rulesServer serves 200 behind a middleware holding the http routes of
// the rules file yaml, on a manual clock at t0.
func rulesServer(t *testing.T, t0 time.Time, yaml string) (*httptest.Server, *clock.Manual) {
	t.Helper()
	dom, err := rules.Parse("web.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(dom)
	if err != nil {
		t.Fatal(err)
	}
	limits, err := gate.FromRules(cfg)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(t0)
	mw, err := httplimit.New(httplimit.Options{Config: gate.Config{Rules: cfg, Limits: limits, Clock: clk, Logger: slog.New(slog.DiscardHandler)}, Legacy: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mw.Close)
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	t.Cleanup(srv.Close)
	return srv, clk
}

// A client the ban action refuses is told the ban's quota is spent (r=0,
// the ban's reset), and its refused requests spend nothing of the
// ordinary limit: after the ban, its remaining count is where the last
// admitted request left it.
func TestBanReportsBanAndChargesNothing(t *testing.T) {
	srv, clk := rulesServer(t, time.Unix(1_800_000_000, 0), `domain: web
http:
  - name: ban
    key: [remote_address]
    action: ban
    ban: {threshold: 5, interval: 60s, duration: 60s}
    rate_limit: {unit: hour, requests_per_unit: 1000}
`)
	for i := 1; i <= 8; i++ {
		r := fetch(t, srv.URL)
		if i <= 5 {
			want := fmt.Sprintf(`"web/ban";r=%d;t=3600`, 1000-i)
			if r.code != 200 || r.h.Get("Ratelimit") != want {
				t.Fatalf("request %d: %d %q, want 200 %q", i, r.code, r.h.Get("Ratelimit"), want)
			}
			continue
		}
		// Banned for the rest of the 60 s interval and 60 s after it.
		if r.code != 429 || r.h.Get("Ratelimit") != `"web/ban/ban";r=0;t=120` || r.h.Get("Retry-After") != "120" ||
			r.h.Get("X-Ratelimit-Limit") != "5" || r.h.Get("X-Ratelimit-Remaining") != "0" ||
			r.h.Get("Ratelimit-Policy") != `"web/ban/ban";q=5;w=60, "web/ban";q=1000;w=3600` {
			t.Fatalf("request %d: %d %v, want 429, the ban's policy and r=0", i, r.code, r.h)
		}
	}
	clk.Advance(121 * time.Second)
	r := fetch(t, srv.URL)
	if want := `"web/ban";r=994;t=3479`; r.code != 200 || r.h.Get("Ratelimit") != want {
		t.Fatalf("after the ban: %d %q, want 200 %q (the refused requests charged nothing)", r.code, r.h.Get("Ratelimit"), want)
	}
}

// A blocked limit (requests_per_unit: 0) states its window (w=3600 for an
// hour) and, as a fixed window, its end as the reset; a route's own
// rate_limit and a descriptor's alike (named as the service names it).
func TestBlockedStatesItsWindow(t *testing.T) {
	// 1_800_001_200 is 1_200 s into its hour.
	srv, _ := rulesServer(t, time.Unix(1_800_001_200, 0), `domain: web
descriptors:
  - key: path
    value: /d
    rate_limit: {unit: hour, requests_per_unit: 0}
http:
  - name: own
    match: {path: /own}
    key: [remote_address]
    rate_limit: {unit: hour, requests_per_unit: 0}
  - name: desc
    match: {path: /d}
    key: [path]
`)
	for _, c := range []struct{ path, name string }{{"/own", "web/own"}, {"/d", "web.path_/d"}} {
		r := fetch(t, srv.URL+c.path)
		if r.code != 429 || r.h.Get("Ratelimit-Policy") != `"`+c.name+`";q=0;w=3600` || r.h.Get("Retry-After") != "2400" ||
			r.h.Get("Ratelimit") != `"`+c.name+`";r=0;t=2400` {
			t.Errorf("%s: %d %v, want 429, w=3600 and the hour's end in 2400 s", c.path, r.code, r.h)
		}
	}
}

// RateLimit-Policy lists every rule of a descriptor's multi-rule policy,
// not only the deciding one.
func TestPolicyListsEveryRule(t *testing.T) {
	srv, _ := rulesServer(t, time.Unix(1_800_000_000, 0), `domain: web
descriptors:
  - key: remote_address
    rate_limits:
      - {name: per-minute, unit: minute, requests_per_unit: 10}
      - {name: per-hour, unit: hour, requests_per_unit: 100}
http:
  - name: per-ip
    key: [remote_address]
`)
	r := fetch(t, srv.URL)
	if want := `"per-minute";q=10;w=60, "per-hour";q=100;w=3600`; r.code != 200 || r.h.Get("Ratelimit-Policy") != want || r.h.Get("Ratelimit") != `"per-minute";r=9;t=60` {
		t.Fatalf("%d %v, want %q", r.code, r.h, want)
	}
}
